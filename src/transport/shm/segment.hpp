// Segment: one rank's shared-memory "inbox" for one communicator, a POSIX shared-memory object
// in /dev/shm whose name follows from the communicator and the rank (nameFor). The rank that owns
// it creates it and marks it ready; every other rank of its node attaches it once it is, writes
// into its own ring there (one single-producer/single-consumer ring per local peer) and sets its
// bit in the header's attach map. The owner unlinks it as soon as every local peer's bit is set,
// so nothing stays in /dev/shm after setup, whatever happens to the processes later (SIGKILL
// included). Nothing about a segment goes through the store: a node of L ranks makes L² attaches,
// which would otherwise be L² keys on one process.
//
// Layout (page-aligned pieces): SegmentHeader | RingControl[slots] | ring data[slots] | direct
// area (the owner stages data there that every local rank loads in place: collectives/direct.cc).
// The header also carries what the ranks need besides the rings: the doorbell futex word the
// owner's progress thread sleeps on, a robust process-shared mutex the owner's progress thread
// holds for as long as it lives (a peer that finds it released or "owner died" knows the owner
// is gone, even across PID namespaces), and a cookie for the cross-memory-attach probe.
//
// Thread safety: the header and ring controls are atomics or written once before publication.
// Ownership: a Segment owns its mapping (unmapped on destruction) and, until unlink(), its name.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "bootstrap/auth.hpp"

namespace loom {
namespace shm {

constexpr uint64_t kSegmentMagic = 0x314d48534d4f4f4cULL;  // "LOOMSHM1"
constexpr uint32_t kSegmentVersion = 7;                    // 7: the holder of the liveness mutex
constexpr int kMaxSlots = 4096;                            // local peers a segment has rings for
constexpr size_t kCacheLine = 64;

/// Control words of one ring; head and tail on their own cache lines.
struct RingControl {
  alignas(kCacheLine) std::atomic<uint64_t> head;       ///< bytes written so far (producer)
  alignas(kCacheLine) std::atomic<uint64_t> tail;       ///< bytes consumed so far (consumer)
  alignas(kCacheLine) std::atomic<uint32_t> wantSpace;  ///< the producer waits for room
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint64_t totalBytes;
  uint64_t ringBytes;
  uint64_t directBytes;  ///< size of the direct area
  uint32_t owner;        ///< rank
  int32_t pid;           ///< owner's pid, as the owner sees it
  uint8_t commId[16];
  uint64_t cookie;      ///< random; peers read it with process_vm_readv to test cross-memory attach
  uint64_t cookieAddr;  ///< the cookie's address in the owner's process, for that probe
  /// Set (release) once the header is written and `alive` held: a peer that finds the name before
  /// then waits.
  std::atomic<uint32_t> ready;
  /// Bit `slot` set by the peer writing into ring `slot` once it has attached the segment.
  alignas(kCacheLine) std::atomic<uint64_t> attached[kMaxSlots / 64];
  /// Links made on first use: bit `slot` set by the peer writing into ring `slot` once it linked to
  /// the owner (and backed that ring), then `linkRequests` bumped, so that the owner links back and
  /// reads what arrives there without a receive of its own posted first.
  alignas(kCacheLine) std::atomic<uint64_t> linkedBy[kMaxSlots / 64];
  std::atomic<uint32_t> linkRequests;
  alignas(kCacheLine) pthread_mutex_t alive;  ///< robust; held by the owner's progress thread
  /// The thread id (as the owner sees it) of that thread, set once it holds `alive`: another
  /// rank's probe may hold the mutex for a moment, which must not read as the owner alive.
  std::atomic<int32_t> aliveHolder;
  alignas(kCacheLine) std::atomic<uint32_t> doorbell;  ///< bumped by every writer; futex word
  std::atomic<uint32_t> sleepers;                      ///< owner threads asleep on the doorbell
  /// Owner threads inside an operation that poll the rings themselves: writers need not ring.
  /// Its own line: every writer reads it on every message.
  alignas(kCacheLine) std::atomic<uint32_t> attending;
  /// Owner threads asleep in a wait (not polling): only then does a plain message need the
  /// owner's progress thread at once.
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> closed;  ///< the owner left cleanly
  /// Direct-area synchronisation: the owner's step count (each step published with release),
  /// and the collective it is in (sequence number, bytes, type | op << 8), written before its
  /// first step of that collective, so that peers check they run the same one before reading:
  /// three sets: one per half of the area that small calls alternate between, one for large.
  alignas(kCacheLine) std::atomic<uint64_t> directStep;
  alignas(kCacheLine) std::atomic<uint64_t> directCall[9];
  /// The collective the owner is in, for its peers' mismatch check whatever the algorithm: a
  /// version (odd while being written), the sequence number and the signature (core/signature.hpp).
  alignas(kCacheLine) std::atomic<uint64_t> current[3];
  /// The owner's communicator failed: 1 while the reason is written, 2 once `failure` holds it.
  /// Peers read it to explain what they see next (a vanished buffer, a dead process).
  std::atomic<uint32_t> failed;
  char failure[448];
  /// The owner's device buffers of the collective it is in, for CUDA IPC (cuda_ipc/device_record.hpp).
  alignas(kCacheLine) uint8_t deviceRecord[512];
};

/// A header bitmap by ring slot (attached, linkedBy): set with release, read with acquire.
inline void setSlotBit(std::atomic<uint64_t>* map, int slot) {
  map[slot / 64].fetch_or(uint64_t{1} << (slot % 64), std::memory_order_release);
}
inline bool slotBit(const std::atomic<uint64_t>* map, int slot) {
  return (map[slot / 64].load(std::memory_order_acquire) >> (slot % 64) & 1) != 0;
}

/// Records `why` as the owner's failure, if none is recorded yet.
void recordFailure(SegmentHeader* seg, const std::string& why) noexcept;
/// The owner's recorded failure, or "".
std::string recordedFailure(const SegmentHeader* seg);

/// Hooks for tests that need a segment to go wrong (a name collision, a wrong version).
struct SegmentTestHooks {
  std::function<std::string(const std::string& name)> rename;  ///< replaces the chosen name
  std::function<void(SegmentHeader*)> afterCreate;             ///< may corrupt the header
};
SegmentTestHooks& segmentTestHooks();

class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;

  /// The name rank `rank` of communicator `commId` uses ("/loom-<id>-<rank>").
  static std::string nameFor(const Nonce& commId, int rank);
  /// Bytes of a segment with `slots` rings of `ringBytes` each and a direct area.
  static size_t sizeFor(int slots, size_t ringBytes, size_t directBytes);

  /// Creates, sizes (fallocate: a full /dev/shm fails here, not later with SIGBUS) and maps the
  /// segment, and initialises its header, not yet ready. Without `backRings` only the header and
  /// the ring controls are backed: each ring's writer backs it when it links (backRing), the owner
  /// its direct area as it comes to use it (backDirect). Throws Error(System)
  /// naming the segment: EEXIST (another job or a killed one left the same name), ENOSPC, EACCES.
  static Segment create(const std::string& name, int owner, int slots, size_t ringBytes, size_t directBytes,
                        const Nonce& commId, bool backRings = true);
  /// Lets peers attach the segment: its owner calls it once its progress thread holds `alive`,
  /// so that a peer's liveness probe never finds the mutex free before the owner took it.
  void markReady();
  /// Attaches `owner`'s segment `name` into *out once the owner has made it ready: false while it
  /// is not there or not ready yet (ask again). Throws Error naming the segment and the peer where
  /// it cannot be opened or mapped, or is not what `owner` of `commId` creates (magic, version,
  /// size, owner, communicator).
  static bool tryAttach(const std::string& name, int self, int owner, const Nonce& commId, Segment* out);

  /// Tells the owner that the peer writing into ring `slot` has attached this segment.
  void markAttached(int slot);
  /// Whether the peer writing into ring `slot` has attached this segment.
  bool attachedBy(int slot) const;

  /// Backs ring `slot`'s data with memory before its writer (rank `self`) first writes there, so
  /// that a full /dev/shm is an error now, naming the segment, not a SIGBUS later. Throws
  /// Error(System) naming the owner.
  void backRing(int slot, int self) const;
  /// Backs bytes [from, to) of the direct area, before its owner first writes there. Throws
  /// Error(System) naming the segment.
  void backDirect(size_t from, size_t to) const;
  /// Whether the writer of ring `slot` linked to the owner on first use (requestLink).
  bool linkedBy(int slot) const { return slotBit(header()->linkedBy, slot); }
  /// The writer of ring `slot` linked to the owner on first use: marks it and wakes the owner's
  /// progress thread (even while a thread of the owner attends: only that thread links back).
  void requestLink(int slot) const;

  /// Removes the name from /dev/shm (the mapping stays). Idempotent; ENOENT is fine.
  void unlink() noexcept;

  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  size_t bytes() const { return bytes_; }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  RingControl* ring(int slot) const;
  uint8_t* ringData(int slot) const;
  size_t ringBytes() const { return static_cast<size_t>(header()->ringBytes); }
  uint8_t* direct() const;
  size_t directBytes() const { return static_cast<size_t>(header()->directBytes); }

 private:
  /// Throws Error(InvalidUsage) naming what is wrong with an attached segment's header.
  static void validate(const Segment& seg, int self, int owner, const Nonce& commId);

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owned_ = false;   // we created it and have not unlinked it yet
  bool shared_ = false;  // the mapping is this process's one for name_ (released through the registry)
};

// ---- Waking the owner's progress engine across processes. ----

/// Bumps `seg`'s doorbell and wakes its owner's sleeping progress thread, unless a thread of the
/// owner is attending (inside an operation, polling the rings itself: it will see the bytes
/// without a wake-up, and hands over to the progress thread when it leaves). A message that is
/// not `urgent` (an eager payload: its sender has finished with it) wakes the progress thread
/// only when an owner thread waits asleep; otherwise it waits in the ring for the owner's next
/// operation or wait, which costs nothing, where a wake-up costs a core for a moment. Urgent:
/// anything a peer waits on (an announcement to read, an answer, room in a full ring).
void ring(SegmentHeader* seg, bool urgent) noexcept;

/// What a peer's liveness mutex says.
enum class PeerState { Alive, Closed, Died };
/// Probes (never blocks) whether the segment's owner still runs.
PeerState probeOwner(SegmentHeader* seg) noexcept;

}  // namespace shm
}  // namespace loom
