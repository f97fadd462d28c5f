// LinkTable: one rank's links to every rank of a communicator, the transports that made them, and
// what drives them: every progress engine of the communicator (core/progress_engine.hpp: a thread
// that reads sockets, one that finishes writes, and one per wake word a transport asks for) and the
// polls of its waiting threads. Nothing else in the communicator touches a Connection or a
// Transport, and no transport starts a thread of its own.
//
// Set-up, in join order: publish() makes the allowed transports and writes their endpoints into
// the store; once every rank has joined and the node map is known, connect() gives each peer the
// first transport that reaches it and links it (every rank runs the transports in one order, and
// each one waits only on the peers it links, so no two ranks wait on each other crosswise), and
// this rank to itself by a SelfConnection. With LOOM_CONNECT=lazy (the default above 8 ranks), a
// transport that can link one peer when either side first needs it (Transport::linksOnDemand:
// TCP, ib, shared memory) links nothing at init: each of its peers gets a stand-in
// (on_demand_connection.hpp) that asks for the link on the first send or receive, so that a rank
// holds the links its operations use and no more.
//
// Tear-down: close(bye) stops the engines, fails every pending
// request with `bye` (peers still linked hear it) and destroys the links; destroying a table that
// was not closed (a join that failed) does the same without a word to the peers.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/progress_engine.hpp"
#include "transport/any_source.hpp"
#include "transport/arena.hpp"
#include "transport/cuda_ipc/ipc_mem_cache.hpp"
#include "transport/registry.hpp"
#include "transport/transport.hpp"

namespace loom {

class LinkTable : private LinkSink {
 public:
  /// Starts the progress engines; their log lines show `rank`.
  LinkTable(int rank, int size);
  ~LinkTable();
  LinkTable(const LinkTable&) = delete;
  LinkTable& operator=(const LinkTable&) = delete;

  /// Makes each transport of `entries` (in preference order) and publishes its endpoint; fills in
  /// ctx's engines (and engineFor, which makes more for this table). Throws what a transport throws.
  void publish(TransportContext& ctx, const std::vector<TransportEntry>& entries);
  /// Links every peer (ctx.nodeOf set) within ctx.deadline; throws Error naming a peer that no
  /// allowed transport reaches, or whatever a transport's connect throws.
  void connect(TransportContext& ctx);
  /// Whether connect() leaves every link to be made on first use (every transport published
  /// links on demand, and LOOM_CONNECT says so for this world size): it then asks nothing of the
  /// peers. After publish; throws on a bad LOOM_CONNECT.
  bool linksAllOnFirstUse() const;

  Connection& to(int peer) { return *conns_[static_cast<size_t>(peer)]; }
  /// The transport's name linking to `peer` ("self" for this rank), for logs.
  const std::string& transportOf(int peer) const { return names_[static_cast<size_t>(peer)]; }
  const LinkProperties& properties(int peer) const { return props_[static_cast<size_t>(peer)]; }
  /// Whether the link to `peer` is up (made at init, or on first use since); false for this rank.
  bool linked(int peer) const;
  /// The peers this rank holds a link to now.
  int linkCount() const;
  /// The link two ranks of one node get, decided alike on every rank (a rank alone on its node
  /// included): the first transport that reaches a peer when every rank shares this node.
  const LinkProperties& nodeLink() const { return nodeLink_; }
  /// The node's shared arena (a transport's Services), or nullptr.
  const LocalArena* arena() const { return arena_; }
  /// Where peers' device memory is mapped (a transport's Services), or nullptr.
  cuda_ipc::IpcMemCache* ipcCache() const { return ipcCache_; }
  /// Registers [addr, addr + bytes) with the transport linking to `peer` (for this rank itself:
  /// the range without keys); null and *error on failure.
  /// Registers [addr, addr + bytes) for the link to `peer` (Transport::registerMemory); throws.
  Registration registerMemory(int peer, const void* addr, size_t bytes) const;
  /// The registration statistics of the transport linking to `peer` (zeros for this rank).
  RegistrationStats registrationStats(int peer) const;

  // ---- Progress by waiting threads: the connections' progress() and the engines' waiter
  // protocol (core/progress_engine.hpp). ----
  bool poll(int peer) noexcept { return conns_[static_cast<size_t>(peer)]->progress(); }
  /// Polls one link other than `peer`'s and this rank's, taking them in turn.
  bool pollAnother(int peer) noexcept;
  /// A thread polls `peer`'s link until pollEnd; `alsoAttend` when it attends no operation.
  void pollBegin(int peer, bool alsoAttend) noexcept;
  void pollEnd(int peer, bool alsoAttend) noexcept;
  /// ProgressEngine::attend and waiting, on every engine.
  void attend(bool on) noexcept;
  void waiting(bool on) noexcept;

  /// Posts a receive from any peer (this rank included): any_source.hpp.
  void irecvAny(const RequestPtr& req, const RecvSpec& spec);

  /// Fails every pending request with `status` and closes every link. Any thread.
  void failAll(const Status& status) noexcept;
  /// Stops the threads, fails what is pending with `bye`, and destroys the links. Idempotent.
  void close(const Status& bye) noexcept;

 private:
  // connect()'s steps: the first transport that reaches each peer (throws where none does); the
  // descriptors the links made now need, made room for (the count promised, released once they
  // are open; throws where the limit cannot be raised); the links (or their stand-ins).
  std::vector<std::vector<int>> peersByTransport(const TransportContext& ctx) const;
  size_t reserveDescriptors(TransportContext& ctx, const std::vector<std::vector<int>>& peersOf, bool lazy);
  void makeLinks(TransportContext& ctx, const std::vector<std::vector<int>>& peersOf, bool lazy);
  void stopThreads() noexcept;
  // LinkSink: links made on first use.
  void adopt(int peer, Connection& conn) override;
  void linked(int peer, std::unique_ptr<Connection> conn) noexcept override;
  void linkFailed(int peer, const Status& why) noexcept override;

  const int rank_;
  const int size_;
  ProgressEngine engine_;                                     // reads (and accepts)
  ProgressEngine sendEngine_;                                 // finishes writes
  std::vector<std::unique_ptr<ProgressEngine>> wordEngines_;  // made by transports through ctx.engineFor
  std::vector<ProgressEngine*> engines_;                      // all of the above
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::string> allowed_;                // the transports' names, for errors
  std::vector<std::unique_ptr<Connection>> conns_;  // by rank
  std::vector<std::string> names_;                  // by rank
  std::vector<Transport*> transportTo_;             // by rank; null for this rank
  std::vector<LinkProperties> props_;               // by rank
  LinkProperties nodeLink_;
  const LocalArena* arena_ = nullptr;
  cuda_ipc::IpcMemCache* ipcCache_ = nullptr;
  std::atomic<unsigned> nextPolled_{0};  // pollAnother's turn
  AnySource anySource_;                  // before conns_ is cleared, every link has left it
};

}  // namespace loom
