// NodeFile: the one POSIX shared-memory object a communicator's ranks on one node share, in
// /dev/shm under a name that follows from the communicator and the node's lowest rank (its
// leader, who creates it). It holds a node header and, one after another, every local rank's
// segment (segment.hpp) of one size. Each rank opens and maps it once (threads of one process map
// it once between them): a node of L ranks makes L mappings, not the L² of a segment file per rank.
// Layout (page-aligned pieces): NodeHeader | ArenaWords[L] | segment of local rank 0 | ... | L - 1.
//
// Set-up: the leader creates the file at its full size (a hole), backs and writes the node header
// with the layout every rank then uses (its own LOOM_SHM_* settings), and marks it ready; each
// rank opens it once ready, backs its own segment's header and ring controls (fallocate: a full
// /dev/shm fails here, naming the rank, not later with SIGBUS), writes its header and sets its
// bit in the node header's `joined` map. Once every bit is set the leader unlinks the name, so
// nothing stays in /dev/shm after set-up, whatever happens to the processes later (SIGKILL
// included). A rank waits on the node header alone (the last rank to join wakes the others through
// a count there): it touches a peer's segment only once it links to that peer (or an arena
// collective reads it).
//
// Thread safety: the node header is written once before `ready` (release); `joined` and
// `joinedCount` are atomic.
// Ownership: a NodeFile holds its mapping (released on destruction, once no rank of this process
// holds it), its descriptor until closeDescriptor(), and, for the leader until unlink(), the name.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "bootstrap/auth.hpp"
#include "transport/shm/segment.hpp"

namespace loom {
namespace shm {

constexpr uint64_t kNodeMagic = 0x31444f4e4d4f4f4cULL;  // "LOOMNOD1"

/// The sizes of a node's segments (the leader's settings, which every local rank adopts).
struct NodeLayout {
  int ranks = 0;  ///< local ranks, each with a segment of slots = ranks - 1 rings
  size_t ringBytes = 0;
  size_t directBytes = 0;
};

struct NodeHeader {
  uint64_t magic;
  uint32_t version;  ///< kSegmentVersion: the node header's and the segments' layout
  uint32_t ranks;
  uint32_t leader;  ///< rank
  uint32_t pad;
  uint64_t segmentBytes;  ///< of each rank's segment
  uint64_t ringBytes;
  uint64_t directBytes;
  uint64_t totalBytes;  ///< of the file
  uint8_t commId[16];
  /// Set (release) once the header is written: a rank that finds the name before then waits.
  std::atomic<uint32_t> ready;
  /// Bit i set by local rank i once its segment is written and its owner's progress thread holds
  /// the segment's liveness mutex: peers may then read it.
  alignas(kCacheLine) std::atomic<uint64_t> joined[(kMaxSlots + 1 + 63) / 64];
  /// Ranks joined so far: a futex word the last one wakes the waiting others on.
  alignas(kCacheLine) std::atomic<uint32_t> joinedCount;
};

/// Hooks for tests that need set-up to go wrong (a name collision, a wrong version, a late rank).
struct SegmentTestHooks {
  std::function<std::string(const std::string& name)> rename;  ///< replaces the node file's name
  std::function<void(NodeHeader*)> afterNodeCreate;            ///< may corrupt the node header
  std::function<void(SegmentHeader*)> afterCreate;             ///< runs on each rank's own segment
};
SegmentTestHooks& segmentTestHooks();

/// What a rank's arena collectives publish to the rest of its node (collectives/direct.cc,
/// arena_sync.hpp, the mismatch check), kept side by side for all local ranks after the node
/// header: a rank that reads every peer's words touches a few pages, not one per peer.
struct ArenaWords {
  /// The rank's step count (each step published with release), and the collective it is in
  /// (sequence number, bytes, type | op << 8), written before its first step of that collective,
  /// so that peers check they run the same one before reading: three sets: one per half of the
  /// area that small calls alternate between, one for large.
  alignas(kCacheLine) std::atomic<uint64_t> step;
  alignas(kCacheLine) std::atomic<uint64_t> call[9];
  /// The collective the rank is in, for its peers' mismatch check whatever the algorithm: a
  /// version (odd while being written), the sequence number and the signature (core/signature.hpp).
  alignas(kCacheLine) std::atomic<uint64_t> current[3];
};

class NodeFile {
 public:
  NodeFile() = default;
  ~NodeFile();
  NodeFile(const NodeFile&) = delete;
  NodeFile& operator=(const NodeFile&) = delete;
  NodeFile(NodeFile&& o) noexcept { *this = std::move(o); }
  NodeFile& operator=(NodeFile&& o) noexcept;

  /// The name of the file of the node whose lowest rank is `leader` ("/loom-<id>-<leader>").
  static std::string nameFor(const Nonce& commId, int leader);
  /// Bytes of the file for `layout`.
  static size_t sizeFor(const NodeLayout& layout);

  /// The leader's part: creates the file at its full size, backs and writes its header and marks
  /// it ready; no segment is backed yet. Throws Error(System) naming the file: EEXIST (another
  /// job, or a killed one, left the same name), ENOSPC, EACCES.
  static NodeFile create(const std::string& name, int leader, const NodeLayout& layout, const Nonce& commId);
  /// Opens the file `leader` creates once it is ready, into *out: false while it is absent or not
  /// ready yet (ask again). Throws Error naming the file and the leader where it cannot be opened
  /// or mapped, or is not what `leader` of `commId` makes for `ranks` local ranks (magic, layout
  /// version, size, leader, communicator).
  static bool tryOpen(const std::string& name, int self, int leader, int ranks, const Nonce& commId, NodeFile* out);

  /// The layout the leader chose.
  NodeLayout layout() const;
  /// Backs the segment of local rank `index` (rank `owner`): its header and ring controls, or all
  /// of it (`whole`: links made at init). Throws Error(System) naming the rank and the file when
  /// /dev/shm has no room for it.
  void back(int index, int owner, bool whole) const;
  /// Local rank `index`'s segment, a view into this mapping.
  Segment segment(int index) const;
  /// Local rank `index`'s arena words.
  ArenaWords* arenaWords(int index) const;
  /// Local rank `index`'s segment is written and its owner alive: peers may read it. The last
  /// rank to join wakes the others.
  void markJoined(int index);
  bool joined(int index) const;
  bool allJoined() const;
  /// Sleeps until every rank joined or `until` (a spurious return is allowed).
  void waitForJoins(std::chrono::steady_clock::time_point until) const;

  /// Removes the name from /dev/shm (the mapping stays): the leader, once every rank joined.
  /// Idempotent; ENOENT is fine.
  void unlink() noexcept;
  /// Set-up is over (segments are backed through the mapping from now on).
  void closeDescriptor() noexcept;

  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  NodeHeader* header() const { return static_cast<NodeHeader*>(base_); }

 private:
  /// Throws Error(InvalidUsage) naming what is wrong with an opened file's header.
  static void validate(const NodeFile& f, int self, int leader, int ranks, const Nonce& commId);

  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
  std::string name_;
  bool owned_ = false;   // we created it and have not unlinked it yet
  bool shared_ = false;  // the mapping is this process's one for name_ (released through the registry)
};

}  // namespace shm
}  // namespace loom
