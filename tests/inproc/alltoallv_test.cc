// All-to-all with counts per peer (Communicator::allToAllv): uneven and empty blocks, displacements
// with gaps, every world size from 1 to 5, checked against the blocks each rank was meant to get;
// counts that disagree between ranks fail both calls instead of corrupting or hanging.
#include <gtest/gtest.h>

#include "common/ranks.hpp"

using loom::DataType;

namespace {

// What rank `from` sends rank `to`: (from + 2 * to) % 4 elements (some blocks empty), each
// element naming its source, destination and position.
size_t countOf(int from, int to) { return static_cast<size_t>((from + 2 * to) % 4); }
int64_t valueOf(int from, int to, size_t i) { return from * 1000000 + to * 1000 + static_cast<int64_t>(i); }

void exchange(loom::Communicator& c) {
  const int n = c.size(), r = c.rank();
  std::vector<size_t> sendCounts(n), sendDispls(n), recvCounts(n), recvDispls(n);
  size_t sendTotal = 0, recvTotal = 0;
  for (int p = 0; p < n; ++p) {
    sendCounts[p] = countOf(r, p);
    sendDispls[p] = sendTotal + 1;  // a gap of one element before each block
    sendTotal += sendCounts[p] + 1;
    recvCounts[p] = countOf(p, r);
    recvDispls[p] = recvTotal + 2;  // and two before each received block
    recvTotal += recvCounts[p] + 2;
  }
  std::vector<int64_t> send(sendTotal, -1), recv(recvTotal, -7);
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < sendCounts[p]; ++i) send[sendDispls[p] + i] = valueOf(r, p, i);
  loom::Work w =
      c.iallToAllv(send.data(), sendCounts, sendDispls, recv.data(), recvCounts, recvDispls, DataType::Int64);
  w.wait();
  std::vector<int64_t> want(recvTotal, -7);  // the gaps stay untouched
  for (int p = 0; p < n; ++p)
    for (size_t i = 0; i < recvCounts[p]; ++i) want[recvDispls[p] + i] = valueOf(p, r, i);
  EXPECT_EQ(recv, want) << "rank " << r << " of " << n;
}

}  // namespace

TEST(AllToAllv, UnevenBlocksEveryWorldSize) {
  for (int n = 1; n <= 5; ++n) loomtest::runOk(n, exchange);
}

TEST(AllToAllv, LargeBlocks) {
  loomtest::runOk(3, [](loom::Communicator& c) {
    const int n = c.size(), r = c.rank();
    const size_t big = (1u << 20) + 7;  // 8 MiB of int64 per block, past the small-message paths
    std::vector<size_t> counts(n, big), displs(n);
    for (int p = 0; p < n; ++p) displs[p] = static_cast<size_t>(p) * big;
    std::vector<int64_t> send(big * n), recv(big * n, -1);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < big; ++i) send[p * big + i] = valueOf(r, p, i % 997);
    c.allToAllv(send.data(), counts, displs, recv.data(), counts, displs, DataType::Int64);
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < big; i += 4099) ASSERT_EQ(recv[p * big + i], valueOf(p, r, i % 997)) << p << " " << i;
  });
}

TEST(AllToAllv, CountsThatDisagreeFailBothRanks) {
  loom::Options o;
  o.timeout = std::chrono::seconds(5);
  auto results = loomtest::runRanks(
      2,
      [](loom::Communicator& c) {
        std::vector<float> buf(64, 1.0f), out(64);
        // Rank 0 sends 10 elements to rank 1, which expects 12; rank 1 sends 12, rank 0 expects 10.
        const std::vector<size_t> displs = {0, 16};
        const std::vector<size_t> send = c.rank() == 0 ? std::vector<size_t>{1, 10} : std::vector<size_t>{12, 1};
        const std::vector<size_t> recv = c.rank() == 0 ? std::vector<size_t>{1, 10} : std::vector<size_t>{12, 1};
        c.allToAllv(buf.data(), send, displs, out.data(), recv, displs, DataType::Float32);
      },
      o);
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& r = results[rank];
    ASSERT_FALSE(r.error.empty()) << "rank " << rank << " should have failed";
    EXPECT_EQ(r.error.find("timed out"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("all_to_all"), std::string::npos) << r.error;
  }
}

TEST(AllToAllv, BadArgumentsAreRejected) {
  loomtest::runOk(2, [](loom::Communicator& c) {
    std::vector<float> a(32), b(32);
    const auto code = loomtest::errorCodeOf;
    const std::vector<size_t> two = {1, 1}, displs = {0, 1};
    EXPECT_EQ(code([&] { c.allToAllv(a.data(), {1}, {0}, b.data(), two, displs, DataType::Float32); }),
              loom::ErrorCode::InvalidArgument);  // one count for two ranks
    EXPECT_EQ(code([&] { c.allToAllv(a.data(), two, displs, a.data(), two, displs, DataType::Float32); }),
              loom::ErrorCode::InvalidArgument);  // in place
    EXPECT_EQ(code([&] { c.allToAllv(nullptr, two, displs, b.data(), two, displs, DataType::Float32); }),
              loom::ErrorCode::InvalidArgument);
    EXPECT_EQ(code([&] {
                c.allToAllv(a.data(), {2, 2}, displs, b.data(), two, displs, DataType::Float32);
              }),
              loom::ErrorCode::InvalidArgument);  // each rank sends itself 2 and expects 1
    EXPECT_EQ(code([&] {
                c.allToAllv(a.data(), two, {0, SIZE_MAX / 2}, b.data(), two, displs, DataType::Float32);
              }),
              loom::ErrorCode::InvalidArgument);  // overflowing displacement
    EXPECT_EQ(code([&] { c.allToAllv(a.data(), two, displs, b.data(), two, displs, static_cast<DataType>(42)); }),
              loom::ErrorCode::InvalidArgument);
    c.barrier();  // still usable
  });
}
