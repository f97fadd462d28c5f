#include "transport/cuda_ipc/ipc_mem_cache.hpp"

#include <unistd.h>

#include <cstring>
#include <mutex>
#include <random>

namespace loom {
namespace cuda_ipc {
namespace {

// The mappings of the whole process, counted: two communicators that reach the same peer
// allocation share one mapping (a process may open a handle once), closed when neither uses it.
class Mappings {
 public:
  static Mappings& get() {
    static auto* m = new Mappings();  // process lifetime: communicators may close mappings at exit
    return *m;
  }
  void* acquire(device::DeviceRuntime& rt, const IpcMemCache::Key& key, const device::IpcHandle& h) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(key);
    if (it != open_.end() && it->second.rt == &rt) {
      ++it->second.refs;
      return it->second.base;
    }
    if (it != open_.end()) {  // another runtime (tests swap them): its mapping is not this one's
      it->second.rt->ipcClose(it->second.base);
      open_.erase(it);
    }
    void* base = rt.ipcOpen(h);
    open_.emplace(key, Mapping{base, &rt, 1});
    return base;
  }
  void release(const IpcMemCache::Key& key) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(key);
    if (it == open_.end() || --it->second.refs > 0) return;
    it->second.rt->ipcClose(it->second.base);
    open_.erase(it);
  }

 private:
  struct Mapping {
    void* base;
    device::DeviceRuntime* rt;
    int refs;
  };
  std::mutex mu_;
  std::map<IpcMemCache::Key, Mapping> open_;
};

}  // namespace

ProcessId thisProcess() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return ProcessId{nonce, static_cast<int64_t>(getpid())};
}

IpcMemCache::~IpcMemCache() { clear(); }

void IpcMemCache::clear() noexcept {
  for (auto& [key, e] : entries_) Mappings::get().release(key);
  entries_.clear();
  lru_.clear();
}

void* IpcMemCache::map(device::DeviceRuntime& rt, const ProcessId& owner, const device::IpcHandle& h) {
  Key key{owner, {}};
  std::memcpy(key.second.data(), h.bytes, device::IpcHandle::kBytes);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.rt == &rt) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second.base;
  }
  if (it != entries_.end()) {  // opened through another runtime (tests swap them): reopen
    Mappings::get().release(key);
    lru_.erase(it->second.lru);
    entries_.erase(it);
  }
  void* base = Mappings::get().acquire(rt, key, h);
  while (entries_.size() >= capacity_ && !lru_.empty()) {
    Mappings::get().release(lru_.back());
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  lru_.push_front(key);
  entries_.emplace(key, Entry{base, &rt, lru_.begin()});
  return base;
}

}  // namespace cuda_ipc
}  // namespace loom
