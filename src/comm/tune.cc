#include "comm/tune.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "collectives/context.hpp"
#include "collectives/select.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace detail {

using coll::algoOverrideFromEnv;
using coll::allReduceRecursiveDoubling;
using coll::Args;
using coll::Context;
using coll::CostModel;
using coll::costModelFor;
using coll::directMinBytesFromEnv;
using coll::directSmallMaxBytes;
using coll::NodeShape;
using coll::ringChannelsSet;
using coll::Selector;
namespace {

LOOM_PARAM_INT(tuneParam, "LOOM_TUNE", -1,
               "1: measure link latency and bandwidth at init for the cost model (else LOOM_TCP_LATENCY_US/MBPS); "
               "0: never; -1 (default): when the communicator spans several nodes");

constexpr int kRoundTrips = 21;
constexpr int kTransfers = 3;
constexpr size_t kTransferBytes = 4u << 20;
constexpr int kChannel = 1;  // the measurement's own tag space; the agreement runs on channel 0

using Clock = std::chrono::steady_clock;
double usSince(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

// The rank this one measures its link with, or -1: across nodes when there are several (node 2k
// with node 2k+1, ranks of the same local index), else ranks 2k and 2k+1.
int tunePartner(const detail::CommImpl& comm) {
  const int r = comm.rank();
  if (comm.nodeCount() == 1) return (r ^ 1) < comm.size() ? r ^ 1 : -1;
  const int otherNode = comm.nodeOf(r) ^ 1;
  if (otherNode >= comm.nodeCount()) return -1;
  const auto& there = comm.ranksOnNode(otherNode);
  const int local = comm.localRank();
  return local < static_cast<int>(there.size()) ? there[static_cast<size_t>(local)] : -1;
}

// Returns {one-way latency in us, us per byte} for this rank's pair, or zeros when it sits out.
void measurePair(Context& c, int partner, double* latencyUs, double* usPerByte) {
  const int r = c.rank();
  *latencyUs = *usPerByte = 0;
  if (partner < 0) return;
  const bool leader = r < partner;
  uint8_t token[8] = {};
  std::vector<double> rtts;
  for (int i = 0; i < kRoundTrips; ++i) {
    auto t0 = Clock::now();
    if (leader) {
      c.wait(c.send(partner, token, sizeof token, kChannel));
      c.wait(c.recv(partner, token, sizeof token, kChannel));
    } else {
      c.wait(c.recv(partner, token, sizeof token, kChannel));
      c.wait(c.send(partner, token, sizeof token, kChannel));
    }
    rtts.push_back(usSince(t0));
  }
  std::nth_element(rtts.begin(), rtts.begin() + kRoundTrips / 2, rtts.end());
  *latencyUs = rtts[kRoundTrips / 2] / 2;
  uint8_t* buf = c.scratch(kTransferBytes, 0);
  double best = 0;
  for (int i = 0; i < kTransfers; ++i) {
    auto t0 = Clock::now();
    if (leader) {
      c.wait(c.send(partner, buf, kTransferBytes, kChannel));
      c.wait(c.recv(partner, token, sizeof token, kChannel));
    } else {
      c.wait(c.recv(partner, buf, kTransferBytes, kChannel));
      c.wait(c.send(partner, token, sizeof token, kChannel));
    }
    double us = std::max(1.0, usSince(t0) - 2 * *latencyUs);
    best = std::max(best, static_cast<double>(kTransferBytes) / us);  // bytes per us
  }
  *usPerByte = 1.0 / best;
}

}  // namespace

void tuneLinksIfAsked(detail::CommImpl& comm) {
  measureLinksIfAsked(comm);
  // The selector, once: the cost model of the slowest link the communicator has (a flat
  // algorithm runs at the pace of its slowest link), or the measured figures.
  CostModel model = costModelFor(comm.slowestLink());
  // Between hosts, one ring: a second one runs the other way, so each host's link carries two
  // TCP flows that share it unevenly, and the slower sets the pace. Within a host they help over
  // loopback (docs/performance.md, "Why the defaults").
  if (comm.nodeCount() > 1 && !ringChannelsSet()) model.ringChannels = 1;
  // Between hosts, no halving-doubling unless forced: across virtual nodes it lost to the ring at
  // the medium sizes it wins over loopback. Each of its steps starts a connection that sat idle
  // through the previous ones (TCP restarts slow start after idle; the ring keeps its connections
  // streaming) -- a likely cause, not a measured one.
  if (comm.nodeCount() > 1) model.halvingDoubling = false;
  if (const auto& link = comm.link()) {
    model.latencyUs = link->latencyUs;
    model.gbps = link->gbps;
  }
  // Node-aware choices: how many nodes, the most ranks on one, and the links within a node.
  NodeShape shape;
  shape.nodes = comm.nodeCount();
  for (int k = 0; k < comm.nodeCount(); ++k)
    shape.maxLocal = std::max(shape.maxLocal, static_cast<int>(comm.ranksOnNode(k).size()));
  shape.evenNodes = true;
  for (int k = 0; k < comm.nodeCount(); ++k)
    shape.evenNodes = shape.evenNodes && static_cast<int>(comm.ranksOnNode(k).size()) == shape.maxLocal;
  shape.intra = costModelFor(comm.nodeLink());
  const LocalArena* arena = comm.arena();
  shape.direct = arena != nullptr && static_cast<int>(arena->ranks.size()) == comm.size() && comm.size() > 1;
  shape.directMinBytes = directMinBytesFromEnv();
  if (shape.direct) shape.directSmallMaxBytes = directSmallMaxBytes(arena->bytes);
  comm.setSelector(std::make_shared<const Selector>(model, algoOverrideFromEnv(), shape));
}

void measureLinksIfAsked(detail::CommImpl& comm) {
  // By default only a communicator across nodes measures: its network is what the defaults
  // cannot know (on a slow link recursive doubling loses to the ring at sizes where loopback
  // keeps it ahead).
  const int64_t tune = tuneParam();
  if (tune == 0 || comm.size() == 1 || (tune < 0 && comm.nodeCount() == 1)) return;
  const int partner = tunePartner(comm);
  double agreed[2] = {0, 0};
  comm.run("tune", [&](int64_t seq) {
    Context c(comm, seq, "tune", "pairs");
    double mine[2];
    measurePair(c, partner, &mine[0], &mine[1]);
    Args a;
    a.send = mine;
    a.recv = agreed;
    a.count = 2;
    a.type = DataType::Float64;
    a.op = ReduceOp::Max;
    a.elem = sizeof(double);
    allReduceRecursiveDoubling(c, a);
  });
  const double gbps = agreed[1] > 0 ? 1e-3 / agreed[1] : 0;
  comm.setLink(detail::LinkModel{agreed[0], gbps});
  if (comm.rank() == 0) LOOM_INFO("measured links: %.1f us latency, %.2f GB/s (LOOM_TUNE)", agreed[0], gbps);
}

}  // namespace detail
}  // namespace loom
