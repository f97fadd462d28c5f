// The cost model and LOOM_ALGO parsing, without a network: the choices documented in docs/performance.md
// (and printed by loom-info --algos) hold for the default model.
#include "collectives/select.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "transport/shm/shm_transport.hpp"
#include "transport/tcp/tcp_transport.hpp"

using loom::coll::Algo;
using loom::coll::Coll;
using loom::coll::CostModel;
using loom::coll::modelUs;
using loom::coll::selectAlgo;

TEST(Select, LatencyBoundSizesUseRecursiveDoubling) {
  CostModel m;
  for (int n : {2, 3, 4, 8, 64, 256}) {
    EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, n, m, ""), Algo::RecursiveDoubling) << n;
    EXPECT_EQ(selectAlgo(Coll::AllReduce, 1024, n, m, ""), Algo::RecursiveDoubling) << n;
  }
}

TEST(Select, LargeSizesUseTheRing) {
  CostModel m;
  for (int n : {2, 3, 4, 8, 64, 256}) EXPECT_EQ(selectAlgo(Coll::AllReduce, 256u << 20, n, m, ""), Algo::Ring) << n;
  EXPECT_EQ(selectAlgo(Coll::Broadcast, 256u << 20, 8, m, ""), Algo::Chain);
  EXPECT_EQ(selectAlgo(Coll::Reduce, 256u << 20, 8, m, ""), Algo::Ring);
}

// Halving-doubling: the ring's bytes in log2(n) steps each way, from 4 ranks, at medium sizes
// (docs/performance.md, "Why the defaults": the measured crossovers).
TEST(Select, HalvingDoublingWinsAtMediumSizesFromFourRanks) {
  CostModel m;
  for (int n : {4, 8, 64, 256}) EXPECT_EQ(selectAlgo(Coll::AllReduce, 1u << 20, n, m, ""), Algo::HalvingDoubling) << n;
  for (int n : {4, 8}) EXPECT_EQ(selectAlgo(Coll::AllReduce, 64u << 10, n, m, ""), Algo::RecursiveDoubling) << n;
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 4u << 20, 4, m, ""), Algo::Ring);
  // Two or three ranks: no fewer steps than the ring.
  for (int n : {2, 3})
    for (size_t b = 8; b <= (64u << 20); b *= 4)
      EXPECT_NE(selectAlgo(Coll::AllReduce, b, n, m, ""), Algo::HalvingDoubling);
  // Non-powers of two pay the fold: 5 ranks keep the ring where 4 and 8 take halving-doubling.
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 1u << 20, 5, m, ""), Algo::Ring);
  EXPECT_NE(selectAlgo(Coll::AllReduce, 1u << 20, 4, m, ""), Algo::DoubleTree);
  // Between hosts the communicator's model leaves it out (tune.cc); forcing it still works.
  CostModel between;
  between.halvingDoubling = false;
  for (int n : {4, 8, 64})
    for (size_t b = 8; b <= (64u << 20); b *= 4)
      EXPECT_NE(selectAlgo(Coll::AllReduce, b, n, between, ""), Algo::HalvingDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 1u << 20, 8, between, "hd"), Algo::HalvingDoubling);
}

TEST(Select, ModelledTimeGrowsWithSize) {
  CostModel m;
  for (Algo a : {Algo::Ring, Algo::RecursiveDoubling, Algo::HalvingDoubling, Algo::DoubleTree})
    for (int n : {2, 5, 16}) {
      if (a == Algo::HalvingDoubling && n < 4) continue;
      double prev = 0;
      for (size_t b = 8; b <= (64u << 20); b *= 4) {
        double t = modelUs(Coll::AllReduce, a, b, n, m);
        EXPECT_GE(t, prev) << loom::coll::algoName(a) << " " << n << " ranks " << b << " B";
        prev = t;
      }
    }
  EXPECT_EQ(modelUs(Coll::AllReduce, Algo::Ring, 1 << 20, 1, m), 0);
}

TEST(Select, SlowerLinksMoveTheRingCrossoverUp) {
  CostModel fast, slowLatency;
  slowLatency.latencyUs = 500;
  // With a high per-message latency the many-step ring loses at 16 MiB, and halving-doubling's
  // 6 steps lose to recursive doubling's 3 at 1 MiB.
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 16u << 20, 8, fast, ""), Algo::Ring);
  EXPECT_NE(selectAlgo(Coll::AllReduce, 16u << 20, 8, slowLatency, ""), Algo::Ring);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 1u << 20, 8, fast, ""), Algo::HalvingDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 1u << 20, 8, slowLatency, ""), Algo::RecursiveDoubling);
}

// All-gather: Bruck's log2 n steps where latency dominates (small blocks, many ranks), the ring's
// pipelined n - 1 steps where bandwidth does.
TEST(Select, AllGatherTakesBrucksStepsOnManyRanksAndTheRingForBulk) {
  CostModel m;
  EXPECT_EQ(selectAlgo(Coll::AllGather, 8 * 256, 256, m, ""), Algo::RecursiveDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllGather, 64 * 16, 16, m, ""), Algo::RecursiveDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllGather, 8, 2, m, ""), Algo::Ring);  // one step either way
  EXPECT_EQ(selectAlgo(Coll::AllGather, 256u << 20, 16, m, ""), Algo::Ring);
}

TEST(Select, OverridesApplyWhereTheAlgorithmExists) {
  CostModel m;
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "ring"), Algo::Ring);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "dbtree"), Algo::DoubleTree);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "recursive_doubling"), Algo::RecursiveDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "hd"), Algo::HalvingDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "halving_doubling"), Algo::HalvingDoubling);
  EXPECT_EQ(selectAlgo(Coll::Broadcast, 8, 4, m, "hd"), Algo::Binomial);
  // Per collective: only all-reduce is forced; broadcast keeps its model choice.
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 256u << 20, 4, m, "allreduce:rd"), Algo::RecursiveDoubling);
  EXPECT_EQ(selectAlgo(Coll::Broadcast, 256u << 20, 4, m, "allreduce:rd"), Algo::Chain);
  EXPECT_EQ(selectAlgo(Coll::Broadcast, 256u << 20, 4, m, "allreduce:rd,broadcast:tree"), Algo::Binomial);
  // An algorithm a collective does not have is ignored for it; unknown names are ignored.
  EXPECT_EQ(selectAlgo(Coll::AllGather, 8, 4, m, "rd"), Algo::RecursiveDoubling);  // Bruck's
  EXPECT_EQ(selectAlgo(Coll::AllGather, 256u << 20, 4, m, "hd"), Algo::Ring);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "warp-drive"), Algo::RecursiveDoubling);
  EXPECT_EQ(selectAlgo(Coll::AllReduce, 8, 4, m, "nonsense,ring"), Algo::Ring);
}

TEST(Selector, ResolvesTheOverridePerCollectiveOnce) {
  loom::coll::Selector sel(CostModel{}, "allreduce:ring,broadcast:tree");
  EXPECT_EQ(sel.pick(Coll::AllReduce, 8, 4).algo, Algo::Ring);
  EXPECT_EQ(sel.pick(Coll::Broadcast, 256u << 20, 4).algo, Algo::Binomial);
  // Not forced: the model decides, as selectAlgo would.
  EXPECT_EQ(sel.pick(Coll::Reduce, 256u << 20, 8).algo, selectAlgo(Coll::Reduce, 256u << 20, 8, CostModel{}, ""));
}

TEST(Selector, SharedMemoryLinksHaveTheirOwnModel) {
  const auto shm = loom::coll::costModelFor(loom::shm::ShmTransport::linkProperties()),
             tcp = loom::coll::costModelFor(loom::tcp::TcpTransport::linkProperties());
  EXPECT_LT(shm.latencyUs, tcp.latencyUs);
  EXPECT_GT(shm.gbps, tcp.gbps);
  loom::coll::Selector sel(shm, "");
  EXPECT_EQ(sel.pick(Coll::AllReduce, 8, 2).algo, Algo::RecursiveDoubling);
  EXPECT_EQ(sel.pick(Coll::AllReduce, 64u << 20, 4).algo, Algo::Ring);
}

TEST(Selector, RingChunksAreLargerOverSocketsUnlessSet) {
  // Over TCP the ring cuts 2 MiB chunks (fewer, larger sends), over shared memory 512 KiB ones
  // (they stay in cache); the chain and tree pipelines keep LOOM_CHUNK_BYTES's default.
  const auto shm = loom::coll::costModelFor(loom::shm::ShmTransport::linkProperties()),
             tcp = loom::coll::costModelFor(loom::tcp::TcpTransport::linkProperties());
  EXPECT_EQ(tcp.chunkBytes, size_t{2} << 20);
  EXPECT_EQ(shm.chunkBytes, size_t{512} << 10);
  EXPECT_EQ(tcp.pipeChunkBytes, size_t{512} << 10);
  EXPECT_EQ(shm.pipeChunkBytes, size_t{512} << 10);
}

TEST(Selector, NodeAwareWhenSeveralNodesHoldSeveralRanks) {
  const auto tcp = loom::coll::costModelFor(loom::tcp::TcpTransport::linkProperties()),
             shm = loom::coll::costModelFor(loom::shm::ShmTransport::linkProperties());
  loom::coll::NodeShape shape;
  shape.nodes = 4;
  shape.maxLocal = 8;
  shape.intra = shm;
  loom::coll::Selector sel(tcp, "", shape);
  EXPECT_TRUE(sel.hierarchical());
  // 32 ranks, 8 per node: small all-reduces cross the network in 2 leader steps, not 5 flat ones.
  EXPECT_EQ(sel.pick(Coll::AllReduce, 1024, 32).algo, Algo::Hierarchical);
  EXPECT_EQ(sel.pick(Coll::Broadcast, 1024, 32).algo, Algo::Hierarchical);
  EXPECT_LT(sel.hierarchicalUs(Coll::AllReduce, 1024),
            modelUs(Coll::AllReduce, Algo::RecursiveDoubling, 1024, 32, tcp));
  // One node, or one rank per node: never.
  shape.nodes = 1;
  EXPECT_FALSE(loom::coll::Selector(tcp, "", shape).hierarchical());
  shape.nodes = 4;
  shape.maxLocal = 1;
  EXPECT_FALSE(loom::coll::Selector(tcp, "", shape).hierarchical());
  // Forced by name, where it can run; with one rank per node it cannot, and the model decides.
  EXPECT_NE(loom::coll::Selector(tcp, "hier", shape).pick(Coll::Reduce, 8, 4).algo, Algo::Hierarchical);
  shape.maxLocal = 8;
  EXPECT_EQ(loom::coll::Selector(tcp, "hier", shape).pick(Coll::Reduce, 8, 32).algo, Algo::Hierarchical);
}

// Nodes of equal size give large all-reduces the 2D form: only a slice per rank crosses the
// network, every local rank working its links, which the model counts.
TEST(Selector, EvenNodesMakeLargeNodeAwareAllReducesCheaper) {
  const auto tcp = loom::coll::costModelFor(loom::tcp::TcpTransport::linkProperties()),
             shm = loom::coll::costModelFor(loom::shm::ShmTransport::linkProperties());
  loom::coll::NodeShape shape;
  shape.nodes = 2;
  shape.maxLocal = 2;
  shape.intra = shm;
  const double leaders = loom::coll::Selector(tcp, "", shape).hierarchicalUs(Coll::AllReduce, 64u << 20);
  shape.evenNodes = true;
  loom::coll::Selector even(tcp, "", shape);
  EXPECT_LT(even.hierarchicalUs(Coll::AllReduce, 64u << 20), leaders);
  EXPECT_EQ(even.pick(Coll::AllReduce, 64u << 20, 4).algo, Algo::Hierarchical);
  // Small buffers keep the leaders' form (the model of both is the same there).
  shape.evenNodes = false;
  EXPECT_EQ(even.hierarchicalUs(Coll::AllReduce, 1024),
            loom::coll::Selector(tcp, "", shape).hierarchicalUs(Coll::AllReduce, 1024));
}

TEST(Selector, DirectAllReduceFromItsThresholdWhenEveryRankSharesTheArena) {
  const auto shm = loom::coll::costModelFor(loom::shm::ShmTransport::linkProperties());
  loom::coll::NodeShape shape;
  shape.intra = shm;
  shape.maxLocal = 4;
  shape.direct = true;
  shape.directMinBytes = 64 * 1024;
  loom::coll::Selector sel(shm, "", shape);
  EXPECT_EQ(sel.pick(Coll::AllReduce, 64 * 1024, 4).algo, Algo::Direct);
  EXPECT_EQ(sel.pick(Coll::AllReduce, 256u << 20, 4).algo, Algo::Direct);
  EXPECT_NE(sel.pick(Coll::AllReduce, 1024, 4).algo, Algo::Direct);  // no small form configured here
  shape.directSmallMaxBytes = 16 * 1024;
  EXPECT_EQ(loom::coll::Selector(shm, "", shape).pick(Coll::AllReduce, 8, 4).algo, Algo::Direct);
  EXPECT_EQ(loom::coll::directSmallMaxBytes(4 << 20), 16u * 1024);
  EXPECT_EQ(loom::coll::directSmallMaxBytes(8192), 2048u);
  // Broadcast and all-gather: direct at every size from three ranks; with two up to
  // kDirectPairMaxBytes, then the chain and pairwise single-copy reads.
  EXPECT_EQ(sel.pick(Coll::Broadcast, 256u << 20, 4).algo, Algo::Direct);
  EXPECT_EQ(sel.pick(Coll::AllGather, 4u << 20, 4).algo, Algo::Direct);
  EXPECT_EQ(sel.pick(Coll::AllGather, 1u << 20, 4).algo, Algo::Direct);
  loom::coll::Selector two(shm, "", shape);  // a selector serves one world size (it memoizes by size)
  EXPECT_EQ(two.pick(Coll::Broadcast, loom::coll::kDirectPairMaxBytes, 2).algo, Algo::Direct);
  EXPECT_NE(two.pick(Coll::Broadcast, 256u << 20, 2).algo, Algo::Direct);
  EXPECT_EQ(two.pick(Coll::AllGather, 1024, 2).algo, Algo::Direct);
  EXPECT_EQ(two.pick(Coll::AllGather, loom::coll::kDirectPairMaxBytes, 2).algo, Algo::Direct);
  EXPECT_EQ(two.pick(Coll::AllGather, 64u << 20, 2).algo, Algo::Pairwise);
  // The direct all-reduce's threshold is the same for every world size.
  if (std::getenv("LOOM_SHM_DIRECT_MIN_BYTES") == nullptr) {
    EXPECT_EQ(loom::coll::directMinBytesFromEnv(), 16u * 1024);
  }
  shape.directMinBytes = loom::coll::directMinBytesFromEnv();
  EXPECT_EQ(loom::coll::Selector(shm, "", shape).pick(Coll::AllReduce, 1u << 20, 2).algo, Algo::Direct);
  // Forced: between the two forms too; where the ranks share no arena it cannot run, and the model
  // decides.
  EXPECT_EQ(loom::coll::Selector(shm, "direct", shape).pick(Coll::AllReduce, 4096, 4).algo, Algo::Direct);
  shape.direct = false;
  EXPECT_NE(loom::coll::Selector(shm, "", shape).pick(Coll::AllReduce, 256u << 20, 4).algo, Algo::Direct);
  EXPECT_NE(loom::coll::Selector(shm, "direct", shape).pick(Coll::AllReduce, 8, 4).algo, Algo::Direct);
}

// The algorithm table (collectives/algorithms.hpp): every default row's name and aliases parse
// back to it, bare and as "collective:name"; every collective has a row that runs anywhere; and
// what the selector picks, for every collective, size and world size, flat, on one node's arena
// and across nodes, is a row of that collective that can run the call.
TEST(AlgorithmTable, NamesParseBackEveryCollectiveAlwaysHasOneAndChoicesAreRows) {
  using namespace loom::coll;
  const auto& table = algorithmTable();
  for (const AlgoRow& row : table) {
    EXPECT_STRNE(row.why, "") << row.name;
    if (row.mode != Mode::Default) continue;
    std::vector<std::string> names{row.name};
    std::string aliases = row.aliases;
    for (size_t at = 0; !aliases.empty() && at <= aliases.size();) {
      const size_t comma = aliases.find(',', at);
      names.push_back(aliases.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    for (const std::string& name : names) {
      EXPECT_EQ(findRow(row.coll, name), &row) << collName(row.coll) << " " << name;
      EXPECT_EQ(forcedRow(row.coll, name), &row) << name;
      EXPECT_EQ(forcedRow(row.coll, std::string(collKey(row.coll)) + ":" + name), &row) << name;
    }
    EXPECT_EQ(rowOf(row.coll, row.algo), &row) << row.name;
  }
  for (int i = 0; i < kCollCount; ++i) {
    bool anywhere = false;
    for (const AlgoRow& row : table) anywhere |= row.coll == static_cast<Coll>(i) && row.needs == Needs::Links;
    EXPECT_TRUE(anywhere) << collName(static_cast<Coll>(i)) << " has no row that runs on any communicator";
  }
  CostModel m;
  NodeShape flat, oneNode, nodes;
  oneNode.direct = true;
  oneNode.directSmallMaxBytes = 4096;
  nodes.nodes = 2;
  nodes.maxLocal = 4;
  nodes.evenNodes = true;
  for (const NodeShape* shape : {&flat, &oneNode, &nodes}) {
    const Selector sel(m, "", *shape);
    for (int i = 0; i < kCollCount; ++i)
      for (size_t bytes : {size_t{0}, size_t{8}, size_t{4096}, size_t{65536}, size_t{1} << 20, size_t{256} << 20})
        for (int n : {1, 2, 3, 4, 8, 64}) {
          const auto c = static_cast<Coll>(i);
          const AlgoRow& row = sel.pick(c, bytes, n);
          Call call = Call::flat(c, bytes, n, m);
          call.shape = shape;
          EXPECT_EQ(row.coll, c);
          EXPECT_EQ(row.mode, Mode::Default);
          EXPECT_TRUE(canRun(row, call)) << collName(c) << " " << row.name;
          EXPECT_TRUE(&row >= table.data() && &row < table.data() + table.size());
        }
  }
  // Forced where it cannot run (direct across nodes, node-aware on one node): the model decides.
  EXPECT_NE(Selector(m, "direct", nodes).pick(Coll::AllReduce, 1u << 20, 8).algo, Algo::Direct);
  EXPECT_NE(Selector(m, "hier", oneNode).pick(Coll::AllReduce, 1u << 20, 4).algo, Algo::Hierarchical);
  EXPECT_EQ(Selector(m, "allreduce:hier", nodes).pick(Coll::AllReduce, 8, 8).algo, Algo::Hierarchical);
}
