// Proved sockets between the ranks of a job: the job-key handshake that every TCP link's sockets
// and every ib link's side channel run, for all peers at once at init (Handshakes, here) or for one
// peer on first use (on_demand_links.hpp). The lower rank of a pair connects, socket k from this
// rank's interface k mod (its count) to the peer's interface k mod (the peer's count); the higher
// rank accepts on its listeners. Each socket proves the job key and names its communicator:
//
//   acceptor  -> connector: "LOOMPEA1" nonceA[16]
//   connector -> acceptor : "LOOMPEC1" nonceC[16] commId[16] from to index count (u32 each)
//                           HMAC(K, "peer-client" nonceA nonceC ids)[32]
//   acceptor  -> connector: HMAC(K, "peer-server" nonceC nonceA ids)[32]
//
// On first use either rank of a pair may dial; the acceptor of a dial that crosses its own answers
// with HMAC(K, "peer-yield" ...) instead of its proof when it is the lower rank (its own dial is
// kept). Strangers on the listeners (other jobs, other communicators, port scanners) are turned
// away and counted while setup goes on; afterwards a listener turns every newcomer away
// (StrayRejector) or, on first use, keeps accepting.
//
// Handshakes is one thread's: the transport's connect() runs it to completion, polling every
// socket at once.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/auth.hpp"
#include "core/progress_engine.hpp"
#include "net/interfaces.hpp"
#include "net/socket.hpp"
#include "transport/transport.hpp"

namespace loom {
namespace sockets {

/// A peer's published endpoints: per interface, its listening address and the interface's name.
using Endpoints = std::vector<std::pair<SockAddr, std::string>>;

// The handshake's messages (above), for Handshakes and for links made on first use
// (on_demand_links.hpp). The acceptor may answer a connector's hello with a yield instead of its
// proof: both ranks of a pair dialled at once, and the lower rank's dial is the one kept.
namespace wire {

constexpr size_t kAcceptorHello = 24;
constexpr size_t kIdsBytes = 32;
constexpr size_t kConnectorHello = 8 + 16 + kIdsBytes + 32;
constexpr size_t kProof = 32;

/// Who a socket links: this communicator, from the connector to the acceptor, stream index of count.
struct Ids {
  Nonce commId;
  uint32_t from, to, index, count;
};

/// The acceptor's first message: magic and its nonce.
void acceptorHello(const Nonce& mine, uint8_t out[kAcceptorHello]);
/// Whether the first min(n, 8) bytes are the acceptor's (connector's) magic.
bool acceptorMagic(const uint8_t* msg, size_t n);
bool connectorMagic(const uint8_t* msg, size_t n);
/// The connector's answer to the acceptor's hello `hello`: its nonce (*mine, made here), the ids
/// and the proof of the key; *theirs is the acceptor's nonce.
void connectorHello(const JobKey& key, const uint8_t* hello, const Ids& ids, Nonce* mine, Nonce* theirs,
                    uint8_t out[kConnectorHello]);
/// The acceptor checks a connector's hello against its nonce `mine`: false if it does not prove the
/// key; else its ids and nonce.
bool checkConnectorHello(const JobKey& key, const Nonce& mine, const uint8_t* msg, Ids* ids, Nonce* theirs);
/// The acceptor's answer to a proved connector: its proof, or its yield.
void acceptorAnswer(const JobKey& key, const Nonce& mine, const Nonce& theirs, const Ids& ids, bool yield,
                    uint8_t out[kProof]);
enum class Answer { Proof, Yield, Wrong };
/// What the acceptor answered the connector (whose nonce is `mine`).
Answer checkAcceptorAnswer(const JobKey& key, const Nonce& mine, const Nonce& theirs, const Ids& ids,
                           const uint8_t* msg);

}  // namespace wire

/// One socket in its handshake, either direction (Handshakes' and OnDemandLinks' records).
struct HandshakeSocket {
  Socket sock;
  int peer = -1;
  int index = 0;  // stream index of the link
  Nonce mine{};
  Nonce theirs{};
  std::vector<uint8_t> buf;  // what the current step has read
  Clock::time_point since;
  std::string remote;  // the other end, for logs
  /// Reads toward `need` bytes of the current step without blocking: 1 when buf holds them, 0
  /// when more must come, -1 when the socket closed or failed (errno set; 0 for a close).
  int readStep(size_t need);
};

/// Starts a non-blocking connect to `target` from `from`'s address (so that each socket keeps to
/// its rail); an invalid socket and *error on a failure that a retry may mend or not (errno kept).
Socket dialFrom(const Interface& from, const SockAddr& target, std::string* error);

class Handshakes {
 public:
  /// `ifaces` and `listeners` are this rank's (one listener per interface, TcpTransport's); they
  /// outlive this object.
  Handshakes(const TransportContext& ctx, const std::vector<Interface>& ifaces, const std::vector<Socket>& listeners);
  ~Handshakes();
  Handshakes(const Handshakes&) = delete;
  Handshakes& operator=(const Handshakes&) = delete;

  /// Forms ctx.socketsPerPeer sockets with each of `peers` (whose endpoints are given) and
  /// returns them by peer, index = stream, each tuned for data. Throws, naming the peers, when
  /// the deadline passes first; throws when a peer's address is not a Loom peer or proves another
  /// job key; rethrows the communicator's failure if it fails meanwhile.
  std::map<int, std::vector<Socket>> run(const std::map<int, Endpoints>& peers);
  /// Connections turned away during run().
  int rejected() const { return rejected_; }

 private:
  struct Pending;

  void startConnects(const std::map<int, Endpoints>& peers);
  void connectDue();
  void acceptNewcomers(size_t listener);
  /// Moves socket `p` one step through its handshake on `revents`.
  void advance(Pending& p, short revents);
  void onAcceptorHello(Pending& p);
  void onAcceptorProof(Pending& p);
  void onConnectorHello(Pending& p);
  /// The ids of an outbound socket.
  wire::Ids idsOf(const Pending& p) const;
  /// Gives up socket `p`: a stranger is turned away; an outbound attempt is retried.
  void drop(Pending& p, const std::string& why, bool stray);
  /// The socket is proved: it joins the peer's link.
  void finish(Pending& p, int peer, size_t index);
  void forgetStale();
  size_t missing() const;
  [[noreturn]] void throwTimeout() const;

  const TransportContext& ctx_;
  const std::vector<Interface>& ifaces_;
  const std::vector<Socket>& listeners_;
  const int sockets_;
  std::map<int, std::vector<Socket>> done_;  // peer -> sockets by index
  std::set<int> inbound_;                    // the peers that connect to this rank
  std::vector<std::unique_ptr<Pending>> pending_;
  std::string lastError_;
  int rejected_ = 0;
};

/// A listener's watch once its links are formed: whoever connects then is a stranger (another
/// job, a port scanner) and is closed at once, with a warning naming the listener (`what`: "peer
/// port"). Engine thread.
class StrayRejector : public PollHandler {
 public:
  StrayRejector(int fd, int rank, const char* what) : fd_(fd), rank_(rank), what_(what) {}
  void onPollEvents(uint32_t events) noexcept override;

 private:
  int fd_;
  int rank_;
  const char* what_;
};

/// Socket options of a data socket: no Nagle, LOOM_SOCKET_BUFFER, and the keepalive heartbeat
/// (LOOM_TCP_KEEPALIVE_S).
void tuneDataSocket(int fd);

}  // namespace sockets
}  // namespace loom
