// LocalArena: memory every rank of a node can load from in place, a service a transport may offer
// (the shared-memory transport, and CUDA IPC, which carries its host bytes over shared memory:
// Transport::services) to the algorithms that read peers' data where it lies
// (collectives/direct.cc, the device IPC path). Neutral here, so that the algorithms depend on no
// transport's internals.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom {

/// Memory every rank of this node can load from in place (the shared-memory transport's direct
/// areas): one buffer per local rank, with that rank's step counter and the description of the
/// collective it is in (shm/node_file.hpp). For algorithms that read peers' data where it lies.
struct LocalArena {
  std::vector<int> ranks;  ///< the node's ranks, ascending
  int me = 0;              ///< this rank's index in `ranks`
  size_t bytes = 0;        ///< of each buffer
  std::vector<uint8_t*> buffers;
  std::vector<std::atomic<uint64_t>*> steps;
  std::vector<std::atomic<uint64_t>*> calls;    ///< 3 sets of 3 words each: sequence, bytes, signature
  std::vector<std::atomic<uint64_t>*> current;  ///< each rank's current call (publishCall / readCall)
  /// Each rank's record of the device buffers of its collective (comm/device_ipc.cc).
  std::vector<uint8_t*> deviceRecords;
  static constexpr size_t kDeviceRecordBytes = 512;
  /// One word the ranks of this arena that live in this process share, at one address. Each rank
  /// maps its peers' segments at addresses of its own, so ThreadSanitizer cannot relate one
  /// rank's step store to another's load of it; a read-modify-write here, in TSan builds only,
  /// shows it the order (collectives/arena_sync.cc).
  std::shared_ptr<std::atomic<uint64_t>> processClock;
  /// Backs this rank's own buffer up to `bytes` before it writes there (with links made on first
  /// use its pages are allocated as they come into use, not at init; null: backed at init).
  /// Throws Error(System) when /dev/shm is full. Use backOwn() below.
  std::function<void(size_t bytes)> backOwnTo;
  /// Why rank `index` can no longer take part ("" while it can): it closed its communicator, its
  /// communicator failed (with the reason it recorded), or its process is gone.
  std::function<std::string(int index)> gone;
};

/// Makes sure this rank's own buffer is backed up to `bytes` before it writes there.
inline void backOwn(const LocalArena& ar, size_t bytes) {
  if (ar.backOwnTo) ar.backOwnTo(bytes);
}

/// Publishes the collective a rank is in (sequence number, signature) in its `current` slot: a
/// version word, odd while the pair is being written, so that readers never see half of it.
inline void publishCall(std::atomic<uint64_t>* slot, uint64_t seq, uint64_t sig) {
  const uint64_t v = slot[0].load(std::memory_order_relaxed);
  slot[0].store(v + 1, std::memory_order_seq_cst);
  slot[1].store(seq, std::memory_order_seq_cst);
  slot[2].store(sig, std::memory_order_seq_cst);
  slot[0].store(v + 2, std::memory_order_seq_cst);
}

/// Reads a rank's current call; false while it is being written (try again later).
inline bool readCall(const std::atomic<uint64_t>* slot, uint64_t* seq, uint64_t* sig) {
  const uint64_t v = slot[0].load(std::memory_order_seq_cst);
  if (v == 0 || (v & 1) != 0) return false;
  *seq = slot[1].load(std::memory_order_seq_cst);
  *sig = slot[2].load(std::memory_order_seq_cst);
  return slot[0].load(std::memory_order_seq_cst) == v;
}

}  // namespace loom
