// CommImpl, joining and leaving: every rank announces itself, publishes its transports' endpoints
// and waits for the others; the node map; the links, each by the first transport that reaches
// the peer; the survivors' rendezvous that Communicator::shrink starts from.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <string_view>
#include <thread>

#include "bootstrap/auth.hpp"
#include "collectives/plan.hpp"
#include "comm/comm_impl.hpp"
#include "comm/dump_signal.hpp"
#include "comm/store_keys.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"
#include "core/progress_policy.hpp"
#include "core/signature.hpp"
#include "core/topology.hpp"
#include "transport/registry.hpp"

namespace loom {
namespace detail {

void CommImpl::join(const Options& options, int sockets, const Deadline& deadline, const std::string& origin,
                    Meeting& meeting) {
  const int rank = rank_, size = size_;
  Store& store = *joinStore_;
  TransportContext ctx;
  ctx.rank = rank;
  ctx.size = size;
  ctx.store = &store;
  ctx.key = access_.key;
  ctx.commId = access_.commId;
  ctx.failure = failure_;
  ctx.deadline = deadline;
  ctx.socketsPerPeer = sockets;
  ctx.lastWordOf = [store = access_.store](int peer, std::chrono::milliseconds wait) {
    auto v = store->getBounded(lastWordKey(peer), Deadline(wait), kStoreNoteLimit);
    return v ? std::string(v->begin(), v->end()) : std::string();
  };
  // Every rank goes through the meeting's two steps whatever fails on the way (a meeting over a
  // parent communicator's links must see every rank's part), and then throws.
  std::exception_ptr failed;
  std::string why;
  bool linksAtInit = true;
  try {
    links_.publish(ctx, selectTransports(options.transports));
    linksAtInit = !links_.linksAllOnFirstUse();
  } catch (const std::exception& e) {
    failed = std::current_exception();
    why = e.what();
  }
  joinStore_->record(false);
  std::vector<Bytes> records = meeting.swap(joinStore_->takeRecord(), why, deadline, linksAtInit);
  try {
    if (failed) std::rethrow_exception(failed);
    learnRecords(*joinStore_, std::move(records), rank);

    // Which ranks share a node: equal host identities, numbered in order of their lowest rank.
    mapNodes(*joinStore_);
    progress::noteRanksOnThisMachine(ranksOnThisMachine_);

    // Link every peer with the first transport that reaches it (shared memory within a node, then
    // the network; over TCP on first use). Every rank runs the transports in the same order, and
    // each one's setup waits only on the peers it connects, so no two ranks wait crosswise.
    ctx.nodeOf = nodes_.nodeOf;
    links_.connect(ctx);
    diag_.setArena(links_.arena());
  } catch (const std::exception& e) {
    meeting.done(e.what(), deadline);
    throw;
  }
  // Every rank linked, so that nobody leaves while another still needs the store.
  meeting.done("", deadline);

  queue_ = std::make_unique<OpQueue>(rank);
  failure_->setHook([this](const Status& s) {
    diag_.leaveWord(s);
    failEverything(s);
  });
  progress_ = std::make_shared<ProgressHook>(this);
  if (logLevel() >= LogLevel::Info) {
    LOOM_INFO("communicator \"%s\": rank %d of %d ready (%s; store %s; timeout %.0f s)", name_.c_str(), rank, size,
              origin.c_str(), access_.endpoint.c_str(), static_cast<double>(timeout_.count()) / 1000.0);
    LOOM_INFO("node %d of %d, local rank %d of %d", nodeOf(rank), nodeCount(), localRank(), localSize());
    for (int r = 0; r < size; ++r)
      if (r != rank) LOOM_INFO("%s", links_.to(r).describe().c_str());
  }
  if (logLevel() >= LogLevel::Info) {
    std::map<std::string, std::vector<int>> byTransport;
    for (int r = 0; r < size; ++r)
      if (r != rank) byTransport[links_.transportOf(r)].push_back(r);
    std::string summary;
    for (const auto& [t, ranks] : byTransport)
      summary += strFormat("%s%s to rank(s) %s", summary.empty() ? "" : "; ", t.c_str(), rankList(ranks).c_str());
    LOOM_INFO("transports: %s", summary.empty() ? "none (one rank)" : summary.c_str());
  }
}

void CommImpl::mapNodes(const JoinStore& store) {
  // In the records swapped, read in place: no store request, no copy.
  const auto n = static_cast<size_t>(size_);
  std::vector<std::string_view> keys(n), machines(n);
  std::string name;
  for (size_t r = 0; r < n; ++r) {
    for (const char* kind : {"host/", "machine/"}) {
      name.assign(kind).append(std::to_string(r));
      if (!store.findLearned(name, kind[0] == 'h' ? &keys[r] : &machines[r]))
        LOOM_THROW_PEER(ErrorCode::Remote, rank_, static_cast<int>(r),
                        strFormat("rank %zu's record has no %s key (mixed Loom versions?)", r, name.c_str()));
    }
  }
  // Ranks that share this machine's CPUs (same boot id), whatever node they count as: they decide
  // whether waiters may spin or must yield their core (request.hpp).
  const std::string myMachine = localHostIdentity().bootId;
  ranksOnThisMachine_ = 0;
  for (size_t r = 0; r < n; ++r)
    if (machines[r] == myMachine) ++ranksOnThisMachine_;
  nodes_.nodeOf.assign(static_cast<size_t>(size_), -1);
  nodes_.ranks.clear();
  for (int r = 0; r < size_; ++r) {
    if (nodes_.nodeOf[static_cast<size_t>(r)] >= 0) continue;
    const int node = nodes_.count();
    nodes_.ranks.emplace_back();
    for (int q = r; q < size_; ++q)
      if (keys[static_cast<size_t>(q)] == keys[static_cast<size_t>(r)]) {
        nodes_.nodeOf[static_cast<size_t>(q)] = node;
        nodes_.ranks.back().push_back(q);
      }
  }
}

StoreAccess CommImpl::shrinkAccess(std::chrono::milliseconds wait, int* newRank, int* newSize) {
  Store& store = *access_.store;
  const std::string gen = "shrink-" + std::to_string(shrinks_++);
  const Deadline joinBy(std::chrono::milliseconds(wait) + std::chrono::milliseconds(30000));
  try {
    store.setString(gen + "/alive/" + std::to_string(rank_), "1");
    if (rank_ == 0) {
      // Rank 0 hosts the store: it decides who is in, after `wait` or once everyone is there.
      std::vector<std::string> keys;
      for (int r = 0; r < size_; ++r) keys.push_back(gen + "/alive/" + std::to_string(r));
      std::vector<std::string> missing;
      store.waitAll(keys, Deadline(wait), &missing);
      std::string members;
      for (int r = 0; r < size_; ++r)
        if (store.tryGet(gen + "/alive/" + std::to_string(r))) members += std::to_string(r) + ",";
      Nonce id = randomNonce();
      store.set(gen + "/commid", Bytes(id.begin(), id.end()));
      store.setString(gen + "/members", members);
    }
    auto v = store.get(gen + "/members", joinBy);
    auto idBytes = store.get(gen + "/commid", joinBy);
    if (!v || !idBytes || idBytes->size() != Nonce().size()) {
      LOOM_THROW(ErrorCode::Timeout, rank_,
                 "shrink: rank 0 did not publish the survivors: it may be gone too (it hosts the rendezvous store); "
                 "restart the job");
    }
    std::vector<int> members;
    std::string text(v->begin(), v->end());
    for (size_t at = 0; at < text.size();) {
      size_t comma = text.find(',', at);
      members.push_back(std::stoi(text.substr(at, comma - at)));
      at = comma + 1;
    }
    auto me = std::find(members.begin(), members.end(), rank_);
    if (me == members.end()) {
      LOOM_THROW(ErrorCode::Timeout, rank_,
                 strFormat("shrink: this rank came after the survivors had been counted (%s); it is left out",
                           rankList(members).c_str()));
    }
    *newRank = static_cast<int>(me - members.begin());
    *newSize = static_cast<int>(members.size());
    LOOM_INFO("shrink: rank %d of %d goes on as rank %d of %d (survivors: %s)", rank_, size_, *newRank, *newSize,
              rankList(members).c_str());
    StoreAccess a;
    a.store = std::make_shared<PrefixStore>(gen, access_.store);
    a.endpoint = access_.endpoint;
    a.key = access_.key;
    std::memcpy(a.commId.data(), idBytes->data(), a.commId.size());
    a.keepAlive = access_.keepAlive;
    return a;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    LOOM_THROW(ErrorCode::Remote, rank_,
               strFormat("shrink: the rendezvous store at %s is unreachable (%s): rank 0 is gone; restart the job",
                         access_.endpoint.c_str(), e.what()));
  }
}

namespace {
// A sub-communicator's access: the namespace `space` in `parent`'s store, and an id derived from
// the parent's and `what` (the same on every member, and different for every sub-communicator).
StoreAccess subAccess(const StoreAccess& parent, const std::string& space, const std::string& what) {
  const Mac id = computeMac(parent.key, "loom sub-communicator", parent.commId, Nonce{}, what.data(), what.size());
  StoreAccess a;
  a.store = std::make_shared<PrefixStore>(space, parent.store);
  a.endpoint = parent.endpoint;
  a.key = parent.key;
  std::memcpy(a.commId.data(), id.data(), a.commId.size());
  a.keepAlive = parent.keepAlive;
  return a;
}
}  // namespace

StoreAccess CommImpl::splitAccess(int color) {
  const std::string space = strFormat("split-%d-%d", splits_++, color);
  return subAccess(access_, space, space);
}

StoreAccess CommImpl::groupAccess(const std::vector<int>& ranks, const std::string& name) {
  // Members that disagree on the ranks meet in different namespaces, and their joins time out
  // naming the ranks that did not come.
  std::string what = "group " + name + ":";
  for (int r : ranks) what += " " + std::to_string(r);
  const Mac digest = computeMac(access_.key, "loom group", Nonce{}, Nonce{}, what.data(), what.size());
  std::string space = "group-";
  for (size_t i = 0; i < 8; ++i) space += strFormat("%02x", digest[i]);
  return subAccess(access_, space, what);
}

}  // namespace detail
}  // namespace loom
