// Segment: one rank's shared-memory "inbox" for one communicator, a page-aligned part of its
// node's file (node_file.hpp, which makes, maps and names it). Every other rank of the node writes
// into its own ring there (one single-producer/single-consumer ring per local peer).
//
// Layout (page-aligned pieces): SegmentHeader | RingControl[slots] | ring data[slots] | direct
// area (the owner stages data there that every local rank loads in place: collectives/direct.cc).
// The header also carries what the ranks need besides the rings: the doorbell futex word the
// owner's progress thread sleeps on, a robust process-shared mutex the owner's progress thread
// holds for as long as it lives (a peer that finds it released or "owner died" knows the owner
// is gone, even across PID namespaces), and a cookie for the cross-memory-attach probe.
//
// Thread safety: the header and ring controls are atomics or written once before publication
// (the owner's bit in the node file's `joined` map).
// Ownership: a Segment is a view; the node file's mapping outlives it.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "bootstrap/auth.hpp"

namespace loom {
namespace shm {

constexpr uint64_t kSegmentMagic = 0x314d48534d4f4f4cULL;  // "LOOMSHM1"
constexpr uint32_t kSegmentVersion = 8;                    // 8: one file per node
constexpr int kMaxSlots = 4096;                            // local peers a segment has rings for
constexpr size_t kCacheLine = 64;
constexpr size_t kPageBytes = 4096;  ///< every piece of a node's file starts on a page

inline size_t roundUpToPage(size_t v) { return (v + kPageBytes - 1) / kPageBytes * kPageBytes; }

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
  /// The owner's communicator failed: 1 while the reason is written, 2 once `failure` holds it.
  /// Peers read it to explain what they see next (a vanished buffer, a dead process).
  std::atomic<uint32_t> failed;
  char failure[448];
  /// The owner's device buffers of the collective it is in, for CUDA IPC (cuda_ipc/device_record.hpp).
  alignas(kCacheLine) uint8_t deviceRecord[512];
};

/// A header bitmap by ring slot (linkedBy): set with release, read with acquire.
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

class Segment {
 public:
  Segment() = default;
  /// The segment at `base` of the node file `file` (named in messages), of the node's layout.
  Segment(void* base, std::string file, int slots, size_t ringBytes, size_t directBytes)
      : base_(base), file_(std::move(file)), slots_(slots), ringBytes_(ringBytes), directBytes_(directBytes) {}

  /// Bytes of a segment with `slots` rings of `ringBytes` each and a direct area.
  static size_t sizeFor(int slots, size_t ringBytes, size_t directBytes);
  /// Bytes of its header and ring controls, which its owner backs at set-up.
  static size_t controlBytes(int slots);

  /// Writes the header of a fresh (zeroed) segment: its owner's part of set-up, before it says
  /// in the node file that it joined.
  void initialise(int owner, const Nonce& commId);

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

  bool valid() const { return base_ != nullptr; }
  /// The node file's name.
  const std::string& name() const { return file_; }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  RingControl* ring(int slot) const;
  uint8_t* ringData(int slot) const;
  size_t ringBytes() const { return ringBytes_; }
  uint8_t* direct() const;
  size_t directBytes() const { return directBytes_; }

 private:
  void* base_ = nullptr;
  std::string file_;
  int slots_ = 0;
  size_t ringBytes_ = 0;
  size_t directBytes_ = 0;
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
