// Memory registration: the part of the transport interface for links that read and write user
// memory in place (LinkProperties::needsRegistration; an RDMA NIC must pin a range and get keys
// for it before it may touch it).
//
// A caller asks its transport for a registration of a range (Transport::registerMemory) and holds
// the returned Registration while the transport uses the range; dropping the last reference
// deregisters it, or returns it to the transport's RegistrationCache for reuse
// (registration_cache.hpp). remote() gives what a peer needs to write into or read from the
// range one-sidedly; it is plain data, sent through the link like any other bytes.
//
// Transports that need no registration hand out registrations with no keys, so code above the
// transport layer registers alike whatever the link.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.hpp"

namespace loom {

/// What a peer needs to address a registered range: plain data, 24 bytes on the wire.
struct RemoteMemory {
  uint64_t addr = 0;
  uint64_t bytes = 0;
  uint64_t key = 0;  ///< the transport's remote key (an rkey); 0 for transports without keys
};

/// A registered range, as the transport that registered it describes it.
struct RegisteredRange {
  uintptr_t begin = 0;
  size_t bytes = 0;
  uint64_t localKey = 0;   ///< what this rank's own work requests name it by (an lkey)
  uint64_t remoteKey = 0;  ///< what a peer's one-sided operations name it by (an rkey)
  void* handle = nullptr;  ///< the transport's own record (an ibv_mr)

  bool covers(const void* addr, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(addr);
    return a >= begin && n <= bytes && a - begin <= bytes - n;
  }
  /// The remote view of [addr, addr+n), which this range covers.
  RemoteMemory remote(const void* addr, size_t n) const {
    return RemoteMemory{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(addr)), static_cast<uint64_t>(n), remoteKey};
  }
};

/// A registration held by its user: the range stays registered at least as long as this lives.
using Registration = std::shared_ptr<const RegisteredRange>;

/// What a transport's registration cache did: how often a buffer found its registration made.
struct RegistrationStats {
  uint64_t hits = 0;
  uint64_t misses = 0;         ///< each one a registration made
  uint64_t evictions = 0;      ///< dropped to stay within the limits
  uint64_t invalidations = 0;  ///< dropped because their memory changed
  size_t entries = 0;          ///< registered now
  size_t bytes = 0;
};

/// Implemented by a transport that must register memory: what RegistrationCache calls.
class Registrar {
 public:
  virtual ~Registrar() = default;
  /// Registers [begin, begin + bytes) (whole pages) for reading and writing by this rank and by
  /// peers; fills `out`. Never throws: a failure (the locked-memory limit, a bad address) is the
  /// status. Called with the cache's lock held: must not call back into the cache.
  virtual Status registerRange(uintptr_t begin, size_t bytes, RegisteredRange* out) noexcept = 0;
  /// Undoes registerRange. The range's memory may already be unmapped.
  virtual void deregisterRange(const RegisteredRange& range) noexcept = 0;
};

/// The registration of a transport that needs none: the range itself, with no keys.
inline Registration keylessRegistration(const void* addr, size_t bytes) {
  auto r = std::make_shared<RegisteredRange>();
  r->begin = reinterpret_cast<uintptr_t>(addr);
  r->bytes = bytes;
  return r;
}

}  // namespace loom
