// Rendezvous: where a communicator's store is, who hosts it, and how ranks reach it.
//   - From a unique id: the process that made the id hosts the store; the id carries its address,
//     the job key and a random communicator id.
//   - From the environment (launcher_env.hpp): rank 0 hosts the store on MASTER_PORT; the job key
//     comes from LOOM_JOB_KEY or the job's identity; each communicator made from the environment in
//     a process gets its own namespace (the n-th one made by every rank shares the n-th namespace).
// A store made for a unique id stays up while a communicator of its process that joined with the
// id exists (or until exit, if no communicator of that process joins); a store hosted from the
// environment stays up until the process exits. Joining ends only once every rank is connected,
// so no rank still needs a store that goes away.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "bootstrap/auth.hpp"
#include "bootstrap/launcher_env.hpp"
#include "bootstrap/store.hpp"
#include "core/deadline.hpp"
#include "net/socket.hpp"

namespace loom {

class TcpStoreServer;

constexpr size_t kUniqueIdBytes = 128;

struct UniqueIdFields {
  SockAddr store;
  JobKey key{};
  Nonce commId{};
};

/// Writes the 128-byte id.
void encodeUniqueId(const UniqueIdFields& fields, uint8_t* out);
/// Reads an id; false (with *why) when the bytes are not a valid id of this Loom version.
bool decodeUniqueId(const uint8_t* in, size_t len, UniqueIdFields* out, std::string* why);
/// Makes a new id and starts the store it names in this process.
UniqueIdFields createUniqueId();

/// What a communicator needs from rendezvous.
struct StoreAccess {
  std::shared_ptr<Store> store;  ///< this communicator's namespace
  std::string endpoint;          ///< "host:port" of the store, for messages
  JobKey key{};
  Nonce commId{};
  std::shared_ptr<TcpStoreServer> keepAlive;  ///< a store server this communicator keeps running, if any
};

StoreAccess connectWithUniqueId(const UniqueIdFields& id, int rank, const Deadline& deadline,
                                std::chrono::milliseconds opTimeout);
StoreAccess connectFromLaunch(const LaunchInfo& launch, const Deadline& deadline, std::chrono::milliseconds opTimeout);

}  // namespace loom
