// The store meeting's errors where the store says who is missing: ranks that never came are
// named, and where every rank came but the last one in never handed out what the others wait
// for, the error says that instead of naming no one; a rank whose set-up failed is named at
// once. The join store: the records swapped answer reads without the store, and a record that
// says its rank failed, or does not decode, is named.
#include "comm/meeting.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bootstrap/auth.hpp"
#include "bootstrap/store_protocol.hpp"
#include "core/status.hpp"

namespace {

using loom::Bytes;

// A store in memory that loses every value set under a key ending in "/all", as if the last rank
// in had counted itself in and died before it set what the others wait for.
class LosingStore : public loom::Store {
 public:
  explicit LosingStore(bool lose = true) : lose_(lose) {}
  void set(const std::string& key, const Bytes& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (lose_ && key.size() >= 4 && key.compare(key.size() - 4, 4, "/all") == 0) return;
    values_[key] = value;
  }
  std::optional<Bytes> tryGet(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    bytesRead_ += it->second.size();
    ++reads_[key];
    return it->second;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[key] += delta;
  }
  /// The bytes of every value read so far, and how often `key` was read.
  size_t bytesRead() {
    std::lock_guard<std::mutex> lock(mu_);
    return bytesRead_;
  }
  int readsOf(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_[key];
  }

 private:
  const bool lose_;
  size_t bytesRead_ = 0;
  std::map<std::string, int> reads_;
  std::mutex mu_;
  std::map<std::string, Bytes> values_;
  std::map<std::string, int64_t> counts_;
};

// Runs `ranks` ranks of a meeting over `store`, each doing `step`; the error of each (empty: none).
template <typename Step>
std::vector<std::string> meet(loom::Store& store, int ranks, Step step, loom::detail::RecordTree tree = {}) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      loom::detail::StoreMeeting m(store, r, ranks, "test", "memory", false, tree);
      try {
        step(m, r);
      } catch (const loom::Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(Meeting, RecordsNeverHandedOutAreNamedAsSuch) {
  LosingStore store;
  const auto errors = meet(store, 3, [](loom::detail::StoreMeeting& m, int r) {
    m.swap(Bytes{static_cast<uint8_t>(r)}, "", loom::Deadline(std::chrono::milliseconds(500)), false);
  });
  int told = 0;
  for (const auto& e : errors) {
    if (e.empty()) continue;  // the last one in has the records itself
    ++told;
    EXPECT_NE(e.find("all 3 ranks joined communicator \"test\" at memory, but the last one in did not hand out"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(told, 2);
}

TEST(Meeting, ADoneNeverSaidIsNamedAsSuch) {
  LosingStore store;
  const auto errors = meet(
      store, 3, [](loom::detail::StoreMeeting& m, int) { m.done("", loom::Deadline(std::chrono::milliseconds(500))); });
  int told = 0;
  for (const auto& e : errors) {
    if (e.empty()) continue;
    ++told;
    EXPECT_NE(e.find("every rank set up its links, but the last one to finish did not say so"), std::string::npos) << e;
  }
  EXPECT_EQ(told, 2);
}

// A rank whose set-up failed says so in the meeting's last step: the ranks waiting there name it,
// and why, at once, not at their deadline.
TEST(Meeting, ARankThatFailedItsSetUpIsNamedAtOnce) {
  LosingStore store(/*lose=*/false);
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = meet(store, 3, [](loom::detail::StoreMeeting& m, int r) {
    m.done(r == 1 ? "no room in /dev/shm" : "", loom::Deadline(std::chrono::seconds(20)));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(errors[1], "");  // its caller throws its own error
  for (int r : {0, 2})
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank(s) 1 failed setting up their links; rank 1: no room in "
                                                  "/dev/shm"),
              std::string::npos)
        << errors[static_cast<size_t>(r)];
}

TEST(Meeting, RanksThatNeverCameAreNamed) {
  LosingStore store;
  std::string error;
  try {
    loom::detail::StoreMeeting m(store, 0, 4, "test", "memory", false);  // ranks 1 to 3 never come
    m.swap(Bytes{1}, "", loom::Deadline(std::chrono::milliseconds(300)), false);
  } catch (const loom::Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("only 1 of 4 ranks joined communicator \"test\" at memory"), std::string::npos) << error;
  EXPECT_NE(error.find("missing rank(s) 1-3."), std::string::npos) << error;
}

// A record as a rank's transports leave it: its keys, each ending in its rank.
Bytes recordOf(int rank, const std::string& host) {
  const std::string r = std::to_string(rank);
  return loom::storewire::encodePairs({{"host/" + r, Bytes(host.begin(), host.end())},
                                       {"tcp/" + r, Bytes{static_cast<uint8_t>(rank), 7}},
                                       {"empty/" + r, Bytes{}}});
}

loom::detail::RecordTree treeFor(std::chrono::milliseconds wait, bool passOn = true) {
  loom::detail::RecordTree tree;
  tree.on = tree.everyRank = true;
  tree.key = loom::deriveJobKey("meeting test");
  tree.commId = loom::randomNonce();
  tree.wait = wait;
  tree.passOn = passOn;
  return tree;
}

// Swaps `ranks` records through a tree; checks that every rank got every record, its own
// included, in rank order.
std::vector<std::string> swapInTree(LosingStore& store, int ranks, const loom::detail::RecordTree& tree) {
  std::vector<std::vector<Bytes>> got(static_cast<size_t>(ranks));
  auto errors = meet(
      store, ranks,
      [&](loom::detail::StoreMeeting& m, int r) {
        got[static_cast<size_t>(r)] = m.swap(recordOf(r, "node"), "", loom::Deadline(std::chrono::seconds(60)), false);
      },
      tree);
  for (int r = 0; r < ranks; ++r) {
    const auto& records = got[static_cast<size_t>(r)];
    EXPECT_EQ(records.size(), static_cast<size_t>(ranks)) << "rank " << r;
    for (size_t q = 0; q < records.size(); ++q) {
      // Each record as written, and the address its rank listens on for the records.
      std::vector<std::pair<std::string, Bytes>> pairs;
      std::string why;
      if (!loom::storewire::decodePairs(records[q], &pairs, &why) || pairs.size() != 4) {
        ADD_FAILURE() << "rank " << r << ", record " << q << ": " << why << ", " << pairs.size() << " pairs";
        continue;
      }
      EXPECT_EQ(loom::storewire::encodePairs({pairs[0], pairs[1], pairs[2]}), recordOf(static_cast<int>(q), "node"));
      EXPECT_EQ(pairs[3].first, "fanout/" + std::to_string(q));
    }
  }
  return errors;
}

// In a tree, the store hands out the records once (to the last rank in, which leaves them there
// for whoever gets them from no one) and a few bytes to every other rank: 21 ranks, three levels.
TEST(Meeting, RecordsGoDownATreeOfTheRanksNotFromTheStoreToEach) {
  LosingStore store(/*lose=*/false);
  const int ranks = 21;
  const auto errors = swapInTree(store, ranks, treeFor(std::chrono::seconds(30)));
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(store.readsOf("joined/records"), 0);
  size_t recordBytes = 0;
  for (int r = 0; r < ranks; ++r) recordBytes += store.tryGet("record/" + std::to_string(r))->size();
  const size_t read = store.bytesRead() - recordBytes;  // the tryGets just now
  // The records once (the last rank's gather), and a few bytes per rank beside: without the tree
  // every rank reads them all (21 times as many).
  std::printf("[ meeting ] %d ranks: the store gave %zu bytes, the records are %zu\n", ranks, read, recordBytes);
  EXPECT_LE(read, recordBytes + 64u * ranks);
}

// A rank that passes nothing on leaves its children to read the records from the store once
// their wait is over: here no rank passes them on, so every rank but the last one in does.
TEST(Meeting, RanksThatGetTheRecordsFromNoOneReadThemFromTheStore) {
  LosingStore store(/*lose=*/false);
  const int ranks = 9;
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = swapInTree(store, ranks, treeFor(std::chrono::milliseconds(200), /*passOn=*/false));
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(store.readsOf("joined/records"), ranks - 1);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
}

Bytes text(const std::string& s) { return Bytes(s.begin(), s.end()); }

// A rank that failed before it had a record does not listen: it reads the records from the store,
// passes them on to its children all the same, and every rank has its failure in its place.
TEST(Meeting, ARankThatFailedBeforeItsRecordTakesPartInTheTree) {
  LosingStore store(/*lose=*/false);
  const int ranks = 9;
  std::vector<std::vector<Bytes>> got(ranks);
  const auto errors = meet(
      store, ranks,
      [&](loom::detail::StoreMeeting& m, int r) {
        got[static_cast<size_t>(r)] =
            m.swap(recordOf(r, "node"), r == 4 ? "no interface" : "", loom::Deadline(std::chrono::seconds(60)), false);
      },
      treeFor(std::chrono::seconds(30)));
  const std::string mark = loom::detail::failedMark("no interface");
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "");
    ASSERT_EQ(got[static_cast<size_t>(r)].size(), static_cast<size_t>(ranks)) << r;
    EXPECT_EQ(got[static_cast<size_t>(r)][4], Bytes(mark.begin(), mark.end())) << r;
  }
  EXPECT_LE(store.readsOf("joined/records"), 1);  // rank 4 alone, unless it was the last one in
}

TEST(JoinStore, LearnedRecordsAnswerReadsWithoutTheStore) {
  auto base = std::make_shared<LosingStore>();
  base->set("elsewhere", text("from the store"));
  loom::detail::JoinStore store(base);
  std::vector<Bytes> records;
  for (int r = 0; r < 300; ++r) records.push_back(recordOf(r, r < 150 ? "node-a" : "node-b"));
  loom::detail::learnRecords(store, records, 0);
  for (int r = 0; r < 300; ++r) {
    const std::string k = std::to_string(r);
    std::string_view host;
    ASSERT_TRUE(store.findLearned("host/" + k, &host)) << r;
    EXPECT_EQ(host, r < 150 ? "node-a" : "node-b");
    EXPECT_EQ(store.tryGet("tcp/" + k), (Bytes{static_cast<uint8_t>(r), 7}));
    EXPECT_EQ(store.get("tcp/" + k, loom::Deadline(std::chrono::milliseconds(1))), (Bytes{static_cast<uint8_t>(r), 7}));
    EXPECT_EQ(store.tryGet("empty/" + k), Bytes{});  // set, and empty: not absent
  }
  // Keys no record holds go to the store; several at once keep their order.
  const auto many = store.tryGetMany({"tcp/5", "elsewhere", "tcp/299", "nowhere"});
  ASSERT_EQ(many.size(), 4u);
  EXPECT_EQ(many[0], (Bytes{5, 7}));
  EXPECT_EQ(many[1], text("from the store"));
  EXPECT_EQ(many[2], (Bytes{43, 7}));
  EXPECT_FALSE(many[3].has_value());
  std::string_view none;
  EXPECT_FALSE(store.findLearned("elsewhere", &none));
  // Records learned later replace the keys they share with earlier ones.
  loom::detail::learnRecords(store, {recordOf(5, "node-c")}, 0);
  std::string_view host;
  ASSERT_TRUE(store.findLearned("host/5", &host));
  EXPECT_EQ(host, "node-c");
  ASSERT_TRUE(store.findLearned("host/6", &host));
  EXPECT_EQ(host, "node-a");
}

TEST(JoinStore, ARecordThatSaysItsRankFailedOrDoesNotDecodeIsNamed) {
  auto message = [](std::vector<Bytes> records, int* peer) {
    loom::detail::JoinStore store(std::make_shared<LosingStore>());
    try {
      loom::detail::learnRecords(store, std::move(records), 0);
    } catch (const loom::Error& e) {
      *peer = e.peer();
      return std::string(e.what());
    }
    return std::string();
  };
  int peer = -1;
  const std::string mark = loom::detail::failedMark("no interface for its side channels");
  std::string e = message({recordOf(0, "a"), recordOf(1, "a"), Bytes(mark.begin(), mark.end())}, &peer);
  EXPECT_NE(e.find("rank 2 could not join: no interface for its side channels"), std::string::npos) << e;
  EXPECT_EQ(peer, 2);
  // Cut short, or a count of pairs it does not hold: named, and nothing of it read.
  Bytes cut = recordOf(1, "a");
  cut.resize(cut.size() - 3);
  e = message({recordOf(0, "a"), cut, recordOf(2, "a")}, &peer);
  EXPECT_NE(e.find("rank 1 sent a record this rank cannot read (a listed key of length 7"), std::string::npos) << e;
  EXPECT_EQ(peer, 1);
  Bytes huge = recordOf(0, "a");
  huge[0] = huge[1] = huge[2] = huge[3] = 0xff;
  e = message({huge}, &peer);
  EXPECT_NE(e.find("rank 0 sent a record this rank cannot read (a list of 4294967295 pairs"), std::string::npos) << e;
  EXPECT_EQ(peer, 0);
  // A key longer than the store takes is refused as the store refuses it.
  const Bytes longKey = loom::storewire::encodePairs({{std::string(5000, 'k'), Bytes{'1'}}});
  e = message({recordOf(0, "a"), recordOf(1, "a"), recordOf(2, "a"), longKey}, &peer);
  EXPECT_NE(e.find("rank 3 sent a record this rank cannot read (a listed key of length 5000"), std::string::npos) << e;
  EXPECT_EQ(peer, 3);
}

}  // namespace
