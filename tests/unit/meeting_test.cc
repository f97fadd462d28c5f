// The store meeting's errors where the store says who is missing: ranks that never came are
// named, and where every rank came but the last one in never handed out what the others wait
// for, the error says that instead of naming no one.
#include "comm/meeting.hpp"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.hpp"

namespace {

using loom::Bytes;

// A store in memory that loses every value set under a key ending in "/all", as if the last rank
// in had counted itself in and died before it set what the others wait for.
class LosingStore : public loom::Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (key.size() >= 4 && key.compare(key.size() - 4, 4, "/all") == 0) return;
    values_[key] = value;
  }
  std::optional<Bytes> tryGet(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[key] += delta;
  }

 private:
  std::mutex mu_;
  std::map<std::string, Bytes> values_;
  std::map<std::string, int64_t> counts_;
};

// Runs `ranks` ranks of a meeting over `store`, each doing `step`; the error of each (empty: none).
template <typename Step>
std::vector<std::string> meet(loom::Store& store, int ranks, Step step) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      loom::detail::StoreMeeting m(store, r, ranks, "test", "memory", false);
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

}  // namespace
