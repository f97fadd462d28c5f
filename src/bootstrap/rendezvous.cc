#include "bootstrap/rendezvous.hpp"

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "bootstrap/tcp_store.hpp"
#include "bootstrap/tcp_store_server.hpp"
#include "core/descriptors.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/status.hpp"
#include "net/interfaces.hpp"

namespace loom {
namespace {

LOOM_PARAM_INT(storePortParam, "LOOM_STORE_PORT", 0, "port of the store loomGetUniqueId starts (0: a free one)");

constexpr char kIdMagic[4] = {'L', 'M', 'I', 'D'};
constexpr uint8_t kIdVersion = 1;

// Stores hosted by this process, by port (see the header).
struct Hosted {
  std::mutex mu;
  // From the environment: hosted by rank 0 for the process's lifetime (every communicator made
  // from the environment shares it).
  std::map<int, std::shared_ptr<TcpStoreServer>> servers;
  // From unique ids: held here until a communicator of this process joins with the id; from then
  // on the communicators that joined with it own it, and it stops with the last of them.
  std::map<int, std::shared_ptr<TcpStoreServer>> unclaimed;
  std::map<int, std::weak_ptr<TcpStoreServer>> claimed;
};
Hosted& hosted() {
  static Hosted* h = new Hosted();  // never destroyed: ranks may still be talking to it at exit
  return *h;
}

}  // namespace

void encodeUniqueId(const UniqueIdFields& f, uint8_t* out) {
  std::memset(out, 0, kUniqueIdBytes);
  std::memcpy(out, kIdMagic, 4);
  out[4] = kIdVersion;
  f.store.toWire(out + 8);
  std::memcpy(out + 28, f.key.data(), 32);
  std::memcpy(out + 60, f.commId.data(), 16);
}

bool decodeUniqueId(const uint8_t* in, size_t len, UniqueIdFields* out, std::string* why) {
  if (len != kUniqueIdBytes) {
    *why = strFormat("a unique id has %zu bytes, not %zu", kUniqueIdBytes, len);
    return false;
  }
  if (std::memcmp(in, kIdMagic, 4) != 0) {
    *why = "not a Loom unique id (made by loomGetUniqueId?)";
    return false;
  }
  if (in[4] != kIdVersion) {
    *why = strFormat("unique id of format %u; this Loom reads format %u (mixed Loom versions?)", in[4], kIdVersion);
    return false;
  }
  if (!SockAddr::fromWire(in + 8, &out->store)) {
    *why = "unique id holds no valid store address";
    return false;
  }
  std::memcpy(out->key.data(), in + 28, 32);
  std::memcpy(out->commId.data(), in + 60, 16);
  return true;
}

UniqueIdFields createUniqueId() {
  UniqueIdFields f;
  randomBytes(f.key.data(), f.key.size());
  f.commId = randomNonce();
  SockAddr bindAddr = selectedInterfaces().front().addr;
  bindAddr.setPort(static_cast<int>(storePortParam()));
  auto server = std::make_shared<TcpStoreServer>(bindAddr, f.key);
  f.store = bindAddr;
  f.store.setPort(server->port());
  std::lock_guard<std::mutex> lock(hosted().mu);
  hosted().unclaimed[server->port()] = server;
  return f;
}

StoreAccess connectWithUniqueId(const UniqueIdFields& id, int rank, const Deadline& deadline,
                                std::chrono::milliseconds opTimeout) {
  StoreAccess a;
  {
    // If this process hosts the id's store, the communicators joining with it keep it running.
    std::lock_guard<std::mutex> lock(hosted().mu);
    auto& h = hosted();
    if (auto it = h.unclaimed.find(id.store.port()); it != h.unclaimed.end()) {
      a.keepAlive = it->second;
      h.claimed[id.store.port()] = it->second;
      h.unclaimed.erase(it);
    } else if (auto c = h.claimed.find(id.store.port()); c != h.claimed.end()) {
      a.keepAlive = c->second.lock();
      if (!a.keepAlive) h.claimed.erase(c);
    }
  }
  auto client = std::make_shared<TcpStoreClient>(id.store.host(), id.store.port(), id.key, rank, deadline, opTimeout);
  a.endpoint = client->endpoint();
  a.store = std::make_shared<PrefixStore>("id-" + hexOf(id.commId.data(), 8), client);
  a.key = id.key;
  a.commId = id.commId;
  return a;
}

StoreAccess connectFromLaunch(const LaunchInfo& launch, const Deadline& deadline, std::chrono::milliseconds opTimeout) {
  static std::atomic<int> envComms{0};
  const int n = envComms.fetch_add(1);
  StoreAccess a;
  a.key = deriveJobKey(launch.jobKeySeed);
  if (launch.jobKeyWeak) {
    LOOM_INFO(
        "job key derived from the job's identity; set LOOM_JOB_KEY to a random secret shared by the ranks for "
        "a stronger one");
  }
  if (launch.rank == 0) {
    std::lock_guard<std::mutex> lock(hosted().mu);
    auto& slot = hosted().servers[launch.masterPort];
    if (!slot) {
      // Listen on every interface: MASTER_ADDR may name this host by any of its addresses.
      std::shared_ptr<TcpStoreServer> server;
      try {
        server = std::make_shared<TcpStoreServer>(SockAddr::any(AF_INET6, launch.masterPort), a.key);
      } catch (const Error&) {
        server = std::make_shared<TcpStoreServer>(SockAddr::any(AF_INET, launch.masterPort), a.key);
      }
      slot = server;
      // The store holds a socket per rank for the job's life: room for them beside the links.
      if (launch.size > 0) {
        const std::string why = makeRoomForDescriptors(static_cast<size_t>(launch.size));
        if (why.empty()) {
          releaseDescriptors(static_cast<size_t>(launch.size));  // the raised limit stays; nothing to promise
        } else {
          LOOM_WARN("the rendezvous store may not serve all %d ranks: %s; raise the limit (ulimit -n)", launch.size,
                    why.c_str());
        }
      }
    }
    a.keepAlive = slot;
  }
  auto client =
      std::make_shared<TcpStoreClient>(launch.masterAddr, launch.masterPort, a.key, launch.rank, deadline, opTimeout);
  a.endpoint = client->endpoint();
  a.store = std::make_shared<PrefixStore>("env-" + std::to_string(n), client);
  if (launch.rank == 0) {
    a.commId = randomNonce();
    a.store->set("commid", Bytes(a.commId.begin(), a.commId.end()));
  } else {
    auto v = a.store->get("commid", deadline);
    if (!v || v->size() != a.commId.size()) {
      LOOM_THROW(ErrorCode::Timeout, launch.rank,
                 strFormat("rank 0 did not open communicator #%d at %s within %.0f s", n, a.endpoint.c_str(),
                           deadline.totalSeconds()));
    }
    std::memcpy(a.commId.data(), v->data(), a.commId.size());
  }
  return a;
}

}  // namespace loom
