// RegistrationCache: keeps a transport's memory registrations for reuse, so that a training loop
// that sends the same buffers every step registers each once (registering pins pages and costs
// tens of microseconds or more; a cache hit costs a map look-up).
//
// - acquire() returns a registration covering the asked range: an existing one that covers it
//   (a hit), or a new one over whole pages (a miss). A new range that overlaps cached ones is
//   registered as their union, and those leave the cache, so cached ranges never overlap and a
//   look-up is one map search.
// - Registrations nobody holds stay registered, least recently used first out, within the limits
//   (LOOM_REG_CACHE_ENTRIES, LOOM_REG_CACHE_BYTES).
// - Freed and reused memory: before every look-up, the cache reads what the process's
//   MemoryMonitor noted (munmap, madvise, brk, ...) and drops every registration of a changed
//   range, so a range whose addresses now map other pages is registered anew. A registration held
//   while its memory is freed stays valid for its holder (freeing memory in use by a transfer is
//   the caller's error) and is deregistered when released. Without a monitor
//   (memory_monitor.hpp says when), nothing stays cached past its last holder.
//
// One class serves every transport that registers; each such transport owns one cache (the
// registrations belong to its protection domain), and all share the process's one monitor.
// Registrations may outlive the cache: the cache deregisters everything when destroyed, and a
// later release does nothing. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.hpp"
#include "transport/memory_monitor.hpp"
#include "transport/registration.hpp"

namespace loom {

class RegistrationCache {
 public:
  struct Limits {
    size_t maxEntries = 1024;  ///< registrations kept (held ones count, and are never evicted)
    size_t maxBytes = 0;       ///< bytes kept registered; 0: no bound of Loom's
    /// From LOOM_REG_CACHE_ENTRIES and LOOM_REG_CACHE_BYTES.
    static Limits fromEnv();
  };
  using Stats = RegistrationStats;

  /// `registrar` must outlive the cache. `monitor` null: keep nothing past its last holder.
  RegistrationCache(Registrar& registrar, Limits limits, MemoryMonitor* monitor);
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  /// A registration covering [addr, addr + bytes) (bytes 0 counts as 1). On failure returns null
  /// and sets *error (a null address: InvalidArgument; the registrar's own error otherwise).
  Registration acquire(const void* addr, size_t bytes, Status* error);
  Stats stats() const;
  /// Whether cached registrations outlive their holders (a monitor is watching).
  bool caching() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace loom
