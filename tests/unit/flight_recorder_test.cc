// The flight recorder, the hang report built from every rank's record, and the dump signal's setting.
#include "comm/flight_recorder.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <string>

#include "comm/dump_signal.hpp"
#include "core/signature.hpp"

using loom::FlightEntry;

namespace {

const uint64_t kAllReduce =
    loom::makeSignature(loom::SigKind::AllReduce, loom::DataType::Float32, loom::ReduceOp::Sum, 0, 4194304);
const uint64_t kBroadcast =
    loom::makeSignature(loom::SigKind::Broadcast, loom::DataType::Int32, loom::ReduceOp::Sum, 3, 7);

std::vector<FlightEntry> history(bool entered) {
  loom::FlightRecorder f;
  f.running(1041, kBroadcast, "chain");
  f.finished(1041, true);
  if (entered) f.running(1042, kAllReduce, "ring");
  return loom::parseFlight(f.serialize());
}

}  // namespace

TEST(FlightRecorder, KeepsTheLastEntriesInOrderWithTheirStates) {
  loom::FlightRecorder f(4);
  for (int s = 0; s < 6; ++s) {
    f.queued(s, kAllReduce);
    f.running(s, kAllReduce, "ring");
    if (s < 5) f.finished(s, s != 3);
  }
  auto v = loom::parseFlight(f.serialize());
  ASSERT_EQ(v.size(), 4u);  // the oldest two were overwritten
  EXPECT_EQ(v[0].seq, 2);
  EXPECT_EQ(v[1].state, FlightEntry::State::Failed);
  EXPECT_EQ(v[3].state, FlightEntry::State::Running);
  EXPECT_EQ(v[3].algo, "ring");
  EXPECT_EQ(v[3].sig, kAllReduce);
  EXPECT_GE(v[3].startAge, 0);
  EXPECT_LT(v[3].endAge, 0);  // not finished
  EXPECT_GE(v[2].endAge, 0);
}

TEST(FlightRecorder, ReportNamesWhoHasNotEnteredAndWhoWaits) {
  std::map<int, std::vector<FlightEntry>> byRank;
  for (int r = 0; r < 8; ++r) byRank[r] = history(r != 3);
  const std::string report = loom::hangReport(8, byRank, 1042);
  EXPECT_NE(report.find("hang report for all_reduce #1042 of 4194304 float32 (sum):"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 3 has not entered all_reduce #1042; its last completed op is broadcast #1041"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("ranks 0-2,4-7 are waiting in it since"), std::string::npos) << report;
  EXPECT_NE(report.find("the last op every answering rank completed is broadcast #1041"), std::string::npos) << report;
}

TEST(FlightRecorder, ReportNamesSilentRanksAndOtherCalls) {
  std::map<int, std::vector<FlightEntry>> byRank;
  byRank[0] = history(true);
  byRank[1] = history(true);
  loom::FlightRecorder other;
  other.running(1042, kBroadcast, "chain");
  byRank[2] = loom::parseFlight(other.serialize());
  const std::string report = loom::hangReport(4, byRank, 1042);
  EXPECT_NE(report.find("rank 2 is in broadcast #1042 of 7 int32 from rank 3, not all_reduce"), std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 3 did not answer"), std::string::npos) << report;
  EXPECT_NE(report.find("ranks 0-1 are waiting in it"), std::string::npos) << report;
}

TEST(FlightRecorder, RankListsAreCompact) {
  EXPECT_EQ(loom::rankList({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
  EXPECT_EQ(loom::rankList({}), "");
  EXPECT_EQ(loom::rankList({4}), "4");
}

TEST(DumpSignal, NamesAndNumbersAreReadAndKillIsRefused) {
  using loom::detail::dumpSignalNumber;
  EXPECT_EQ(dumpSignalNumber(""), 0);
  EXPECT_EQ(dumpSignalNumber("USR1"), SIGUSR1);
  EXPECT_EQ(dumpSignalNumber("SIGUSR2"), SIGUSR2);
  EXPECT_EQ(dumpSignalNumber(std::to_string(SIGRTMIN)), SIGRTMIN);
  EXPECT_EQ(dumpSignalNumber("KILL"), -1);
  EXPECT_EQ(dumpSignalNumber("9"), -1);
  EXPECT_EQ(dumpSignalNumber("19"), -1);  // SIGSTOP
  EXPECT_EQ(dumpSignalNumber("0"), -1);
  EXPECT_EQ(dumpSignalNumber("10x"), -1);
}

TEST(FlightRecorder, FormatShowsTheLastEntriesWithTheirState) {
  loom::FlightRecorder f;
  f.queued(0, 0);
  f.running(0, 0, "ring");
  f.finished(0, true);
  f.queued(1, 0);
  f.running(1, 0, "rd");
  const std::string all = loom::formatFlight(f.snapshot(), 16), last = loom::formatFlight(f.snapshot(), 1);
  EXPECT_NE(all.find("#0      done"), std::string::npos) << all;
  EXPECT_NE(all.find("#1      running"), std::string::npos) << all;
  EXPECT_NE(all.find("ended"), std::string::npos) << all;
  EXPECT_EQ(last.find("#0"), std::string::npos) << last;
  EXPECT_NE(last.find("rd"), std::string::npos) << last;
}

TEST(FlightRecorder, PublishedRecordsAnswerTheirRequestAndLaterOnes) {
  loom::FlightRecorder f;
  f.queued(7, 0);
  f.running(7, 0, "ring");
  const std::string text = loom::publishedFlight(3, f.serialize());
  EXPECT_EQ(loom::flightKey(5), "flight/5");
  auto read = loom::readPublishedFlight(text, 3);
  ASSERT_TRUE(read.has_value());
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ((*read)[0].seq, 7);
  EXPECT_EQ((*read)[0].algo, "ring");
  EXPECT_TRUE(loom::readPublishedFlight(text, 1).has_value());   // answers the earlier requests too
  EXPECT_FALSE(loom::readPublishedFlight(text, 4).has_value());  // stale for a later request
  EXPECT_FALSE(loom::readPublishedFlight("3", 1).has_value());   // no record after the number
  EXPECT_FALSE(loom::readPublishedFlight("x3\n", 0).has_value());
  EXPECT_FALSE(loom::readPublishedFlight("\n7 0 running ring 1 -1\n", 0).has_value());
  EXPECT_FALSE(loom::readPublishedFlight("\nx\n", 0).has_value());
}
