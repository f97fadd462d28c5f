// The monitored barrier (Communicator::monitoredBarrier, Gloo's monitored_barrier): a barrier that
// names the ranks that do not arrive. Every other rank reports to rank 0 and waits for its release;
// rank 0 waits for each report until the deadline (for every missing rank with `waitAll`, else up to
// the first), then releases them all, or fails naming the missing ranks and, from the hang report,
// where each of them is. It is a collective (numbered like the others), so the hang report and
// mismatch checks see it.
#include <string>
#include <vector>

#include "comm/comm_impl.hpp"
#include "core/format.hpp"
#include "core/signature.hpp"

namespace loom {
namespace detail {
namespace {

// "1", "1, 3", "1-3, 5": the ranks, in Gloo's words where they are one.
std::string rankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

void CommImpl::monitoredBarrierBody(int64_t seq, std::chrono::milliseconds timeout, bool waitAll) {
  const uint32_t tag = collectiveTag(seq);
  const uint64_t sig = makeSignature(SigKind::Barrier, DataType::Uint8, ReduceOp::Sum, 1, 0);
  diag_.enterCall(seq, sig, "monitored");
  const Clock::time_point deadline = Clock::now() + timeout;
  uint8_t token = 0;
  Label in, out;
  in.coll = out.coll = "monitored_barrier";
  in.algo = out.algo = "to rank 0 and back";
  in.seq = out.seq = seq;
  out.send = true;
  if (rank_ != 0) {
    postSend(0, &token, 0, tag, out, sig)->wait();
    auto release = postRecv(0, nullptr, 0, tag, in, sig);
    // Longer than rank 0 waits: where it finds ranks missing, its reason comes with its leaving.
    if (!release->waitUntil(deadline + std::chrono::seconds(10))) {
      LOOM_THROW_PEER(ErrorCode::Timeout, rank_, 0,
                      strFormat("monitored_barrier #%lld: rank 0 did not release this rank within %.1f s (rank 0 "
                                "waits for every rank, and names those that did not arrive)",
                                static_cast<long long>(seq), static_cast<double>(timeout.count()) / 1000.0 + 10.0));
    }
    release->wait();
    return;
  }
  std::vector<RequestPtr> arrivals(static_cast<size_t>(size_));
  for (int r = 1; r < size_; ++r) arrivals[static_cast<size_t>(r)] = postRecv(r, nullptr, 0, tag, in, sig);
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    RequestPtr& a = arrivals[static_cast<size_t>(r)];
    if (a->waitUntil(deadline)) {
      a->wait();  // throws if it failed (the rank left)
      continue;
    }
    missing.push_back(r);
    if (!waitAll) break;
  }
  if (!missing.empty()) {
    // Gloo's words first (scripts may look for them), then where each missing rank is.
    std::string why =
        strFormat("%s %s failed to pass monitoredBarrier in %lld ms", missing.size() == 1 ? "Rank" : "Ranks",
                  rankList(missing).c_str(), static_cast<long long>(timeout.count()));
    const std::string report = diag_.hangReport(seq, std::chrono::milliseconds(2000));
    if (!report.empty()) why += "\n" + report;
    // As every timeout does, it ends the communicator: the ranks that came hear why as it leaves.
    const Status s = Status::error(ErrorCode::Timeout, why, missing.front(), seq);
    failure_->fail(s);
    throw s.toError(rank_);
  }
  std::vector<RequestPtr> releases;
  for (int r = 1; r < size_; ++r) releases.push_back(postSend(r, &token, 0, tag, out, sig));
  for (auto& r : releases) r->wait();
}

}  // namespace detail
}  // namespace loom
