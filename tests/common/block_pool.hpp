// Device blocks kept for reuse between test cases instead of freed, the way PyTorch's caching
// allocator keeps them. cudaFree waits for the whole device: with several ranks in one process on
// one GPU, a rank that frees while a peer's stream is held by a collective waiting for this very
// rank never returns (NCCL has the same rule for several ranks per process). Reused blocks also
// keep their CUDA IPC handles, so the peers' mappings stay warm instead of reopened every case.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace loomtest {

class BlockPool {
 public:
  BlockPool(std::function<void*(size_t)> alloc, std::function<void(void*)> release)
      : alloc_(std::move(alloc)), release_(std::move(release)) {}
  ~BlockPool() {
    for (auto& [p, size] : sizes_) release_(p);
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  /// A block of at least `bytes`: the smallest kept one that fits, else a new one (sizes rounded up
  /// to a power of two, so that later cases find them).
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end()) {
      void* p = it->second;
      free_.erase(it);
      return p;
    }
    size_t size = 256;
    while (size < bytes) size *= 2;
    void* p = alloc_(size);
    if (p == nullptr) throw std::runtime_error("device allocation failed");
    sizes_.emplace(p, size);
    return p;
  }
  /// Keeps `p` (from take) for a later take.
  void give(void* p) {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) throw std::logic_error("BlockPool::give: not a block of this pool");
    free_.emplace(it->second, p);
  }

 private:
  std::function<void*(size_t)> alloc_;
  std::function<void(void*)> release_;
  std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size -> block
  std::map<void*, size_t> sizes_;      // every block -> its size
};

}  // namespace loomtest
