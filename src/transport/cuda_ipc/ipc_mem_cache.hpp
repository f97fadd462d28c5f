// IpcMemCache: the peers' device allocations this rank has mapped through CUDA IPC, per
// communicator. Opening a handle (cudaIpcOpenMemHandle) costs far more than a collective on a
// small buffer, and training loops pass the same buffers again and again, so a mapping is kept
// after use, keyed by the exporting process and the handle's bytes (a handle names one
// allocation: CUDA gives a freed and reallocated buffer a new one, even at the same address). At
// most `capacity` mappings stay held: the least recently used is let go first, which is safe
// because a mapping is used only inside one collective, on the op queue, never across the
// cache's calls. All are let go when the communicator goes. Underneath, the process holds each
// allocation open once, counted over its communicators' caches (CUDA maps a handle once per
// process), and closes it when the last lets go.
//
// Threads: one cache is used by its communicator's op queue only (collectives run one at a
// time); the process-wide count is locked.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <utility>

#include "device/runtime.hpp"

namespace loom {
namespace cuda_ipc {

/// Who exported a handle: a random number drawn once per process, and its pid (a forked child
/// keeps the number but not the pid). Two ranks in one process use each other's pointers as they
/// are; CUDA cannot open a handle in the process that exported it.
struct ProcessId {
  uint64_t nonce = 0;
  int64_t pid = 0;
  bool operator==(const ProcessId& o) const { return nonce == o.nonce && pid == o.pid; }
  bool operator<(const ProcessId& o) const { return nonce != o.nonce ? nonce < o.nonce : pid < o.pid; }
};
/// This process's identity.
ProcessId thisProcess();

class IpcMemCache {
 public:
  explicit IpcMemCache(size_t capacity = 64) : capacity_(capacity) {}
  ~IpcMemCache();
  IpcMemCache(const IpcMemCache&) = delete;
  IpcMemCache& operator=(const IpcMemCache&) = delete;

  /// The start of the allocation `h` names, mapped into this process through `rt` (opened now,
  /// or earlier and kept). Throws Error(Cuda) when it cannot be opened.
  void* map(device::DeviceRuntime& rt, const ProcessId& owner, const device::IpcHandle& h);
  /// Mappings open now.
  size_t size() const { return entries_.size(); }
  /// Closes every mapping.
  void clear() noexcept;

 public:
  using Key = std::pair<ProcessId, std::array<uint8_t, device::IpcHandle::kBytes>>;

 private:
  struct Entry {
    void* base = nullptr;
    device::DeviceRuntime* rt = nullptr;
    std::list<Key>::iterator lru;
  };
  size_t capacity_;
  std::map<Key, Entry> entries_;
  std::list<Key> lru_;  // most recently used first
};

}  // namespace cuda_ipc
}  // namespace loom
