#include "transport/registration_cache.hpp"

#include <unistd.h>

#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/param.hpp"

namespace loom {
namespace {

LOOM_PARAM_INT(regCacheEntries, "LOOM_REG_CACHE_ENTRIES", 1024,
               "memory registrations a transport keeps for reuse (held ones included)");
LOOM_PARAM_INT(regCacheBytes, "LOOM_REG_CACHE_BYTES", 0,
               "bytes of memory a transport keeps registered for reuse; 0: no bound of Loom's");

uintptr_t pageSize() {
  static const uintptr_t size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

RegistrationCache::Limits RegistrationCache::Limits::fromEnv() {
  Limits l;
  l.maxEntries = static_cast<size_t>(std::max<int64_t>(regCacheEntries(), 1));
  l.maxBytes = static_cast<size_t>(std::max<int64_t>(regCacheBytes(), 0));
  return l;
}

struct RegistrationCache::State {
  struct Entry {
    RegisteredRange range;
    int holders = 0;
    bool indexed = true;  // findable by look-ups; false once dropped while held
    std::list<Entry*>::iterator idle;
    uintptr_t end() const { return range.begin + range.bytes; }
  };

  std::mutex mu;
  Registrar* registrar = nullptr;  // null once the cache is destroyed
  Limits limits;
  MemoryMonitor* monitor = nullptr;
  uint64_t cursor = 0;
  std::map<uintptr_t, Entry*> index;  // by begin; indexed entries never overlap
  std::list<Entry*> idleList;         // unheld indexed entries, most recently used first
  std::unordered_map<Entry*, std::unique_ptr<Entry>> owned;
  Stats stats;

  void destroy(Entry* e) {
    if (registrar != nullptr) registrar->deregisterRange(e->range);
    stats.entries -= 1;
    stats.bytes -= e->range.bytes;
    owned.erase(e);
  }

  // Takes `e` out of the look-ups; deregisters it now, or when its last holder lets go.
  void drop(Entry* e) {
    index.erase(e->range.begin);
    e->indexed = false;
    if (e->holders == 0) {
      idleList.erase(e->idle);
      destroy(e);
    }
  }

  // The indexed entries overlapping [begin, end), in address order.
  std::vector<Entry*> overlapping(uintptr_t begin, uintptr_t end) {
    std::vector<Entry*> out;
    auto it = index.upper_bound(begin);
    if (it != index.begin() && std::prev(it)->second->end() > begin) --it;
    for (; it != index.end() && it->first < end; ++it) out.push_back(it->second);
    return out;
  }

  void invalidate(uintptr_t begin, uintptr_t end) {
    for (Entry* e : overlapping(begin, end)) {
      stats.invalidations += 1;
      drop(e);
    }
  }

  void readMonitor() {
    if (monitor == nullptr || monitor->published() == cursor) return;
    const bool complete = monitor->drain(&cursor, [this](uintptr_t b, uintptr_t e) { invalidate(b, e); });
    if (!complete) invalidate(0, UINTPTR_MAX);  // some changes were lost: trust nothing
  }

  void trim() {
    while (!idleList.empty() &&
           (stats.entries > limits.maxEntries || (limits.maxBytes != 0 && stats.bytes > limits.maxBytes))) {
      stats.evictions += 1;
      drop(idleList.back());
    }
  }

  void release(Entry* e) {
    std::lock_guard<std::mutex> lock(mu);
    if (owned.count(e) == 0) return;  // the cache was destroyed meanwhile
    if (--e->holders > 0) return;
    if (!e->indexed || monitor == nullptr) {
      if (e->indexed) index.erase(e->range.begin);
      destroy(e);
      return;
    }
    idleList.push_front(e);
    e->idle = idleList.begin();
    trim();
  }
};

RegistrationCache::RegistrationCache(Registrar& registrar, Limits limits, MemoryMonitor* monitor)
    : state_(std::make_shared<State>()) {
  state_->registrar = &registrar;
  state_->limits = limits;
  state_->monitor = monitor;
  // Changes before now concern no registration of this cache.
  if (monitor != nullptr) state_->cursor = monitor->published();
}

RegistrationCache::~RegistrationCache() {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& [e, owner] : state_->owned) state_->registrar->deregisterRange(e->range);
  state_->owned.clear();
  state_->index.clear();
  state_->idleList.clear();
  state_->registrar = nullptr;
}

Registration RegistrationCache::acquire(const void* addr, size_t bytes, Status* error) {
  if (addr == nullptr) {
    *error = Status::error(ErrorCode::InvalidArgument, "cannot register memory at a null address");
    return nullptr;
  }
  const uintptr_t page = pageSize();
  const auto a = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t begin = a & ~(page - 1);
  const uintptr_t end = (a + std::max<size_t>(bytes, 1) + page - 1) & ~(page - 1);

  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mu);
  s.readMonitor();
  State::Entry* e = nullptr;
  const std::vector<State::Entry*> near = s.overlapping(begin, end);
  if (near.size() == 1 && near[0]->range.begin <= begin && near[0]->end() >= end) {
    e = near[0];
    s.stats.hits += 1;
    if (e->holders == 0) s.idleList.erase(e->idle);
  } else {
    // Register the union with what it overlaps, which then leaves the cache.
    uintptr_t lo = begin;
    uintptr_t hi = end;
    for (State::Entry* n : near) {
      lo = std::min(lo, n->range.begin);
      hi = std::max(hi, n->end());
    }
    auto fresh = std::make_unique<State::Entry>();
    Status st = s.registrar->registerRange(lo, hi - lo, &fresh->range);
    if (!st.ok && (lo != begin || hi != end)) {
      // A cached neighbour may cover memory unmapped behind the monitor's back (an allocator
      // that makes the system call itself): register the range asked for alone; the
      // neighbours leave the cache all the same.
      st = s.registrar->registerRange(begin, end - begin, &fresh->range);
      lo = begin;
      hi = end;
    }
    if (!st.ok) {
      *error = st;
      return nullptr;
    }
    fresh->range.begin = lo;  // the index relies on it, whatever the registrar filled in
    fresh->range.bytes = hi - lo;
    for (State::Entry* n : near) s.drop(n);
    e = fresh.get();
    s.owned.emplace(e, std::move(fresh));
    s.index.emplace(e->range.begin, e);
    s.stats.misses += 1;
    s.stats.entries += 1;
    s.stats.bytes += e->range.bytes;
    s.trim();
  }
  e->holders += 1;
  std::shared_ptr<State> keep = state_;
  return Registration(&e->range, [keep, e](const RegisteredRange*) { keep->release(e); });
}

RegistrationCache::Stats RegistrationCache::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->stats;
}

bool RegistrationCache::caching() const { return state_->monitor != nullptr; }

}  // namespace loom
