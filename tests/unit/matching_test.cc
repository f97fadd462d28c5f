// The tag matcher on its own: per-tag order, tags independent of each other, receives before and
// after their messages, counts, closing, and the shared truncation error. Checked against a
// reference model (a queue per tag) over random interleavings.
#include "transport/matching.hpp"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

using Matcher = loom::TagMatcher<int, std::string>;  // receive ids, message payloads

TEST(TagMatcher, AMessageWaitsForItsReceive) {
  Matcher m;
  EXPECT_FALSE(m.takeRecv(7).has_value());
  m.keep(7, "a");
  EXPECT_TRUE(m.anyKept());
  EXPECT_FALSE(m.takeMessage(8).has_value()) << "another tag must not match";
  auto got = m.takeMessage(7);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, "a");
  EXPECT_FALSE(m.anyKept());
}

TEST(TagMatcher, AReceiveWaitsForItsMessage) {
  Matcher m;
  EXPECT_FALSE(m.takeMessage(3).has_value());
  m.post(3, 1);
  EXPECT_EQ(m.postedOn(3), 1u);
  EXPECT_FALSE(m.takeRecv(4).has_value());
  auto r = m.takeRecv(3);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, 1);
  EXPECT_FALSE(m.anyPosted());
}

TEST(TagMatcher, PerTagOrderAcrossInterleavedTags) {
  Matcher m;
  // Messages a1 b1 a2 b2 a3 arrive; receives on b then a take them in send order per tag.
  for (const char* s : {"a1", "b1", "a2", "b2", "a3"}) m.keep(s[0] == 'a' ? 1 : 2, s);
  EXPECT_EQ(m.keptOn(1), 3u);
  EXPECT_EQ(m.keptOn(2), 2u);
  EXPECT_EQ(*m.takeMessage(2), "b1");
  EXPECT_EQ(*m.takeMessage(1), "a1");
  EXPECT_EQ(*m.takeMessage(1), "a2");
  EXPECT_EQ(*m.takeMessage(2), "b2");
  EXPECT_EQ(*m.takeMessage(1), "a3");
  EXPECT_FALSE(m.takeMessage(1).has_value());
}

TEST(TagMatcher, PostedReceivesMatchInPostingOrder) {
  Matcher m;
  m.post(5, 10);
  m.post(6, 20);
  m.post(5, 11);
  EXPECT_EQ(m.postedOn(5), 2u);
  EXPECT_EQ(*m.takeRecv(5), 10);
  EXPECT_EQ(*m.takeRecv(5), 11);
  EXPECT_EQ(*m.takeRecv(6), 20);
}

TEST(TagMatcher, CollectiveTagsAndTheHighestTag) {
  Matcher m;
  const uint32_t tags[] = {0u, 0x80000000u, 0x8fffffffu, 0xffffffffu};
  for (uint32_t t : tags) m.post(t, static_cast<int>(t & 0xff));
  for (uint32_t t : tags) {
    auto r = m.takeRecv(t);
    ASSERT_TRUE(r.has_value()) << t;
    EXPECT_EQ(*r, static_cast<int>(t & 0xff));
  }
}

TEST(TagMatcher, ClosingTakesThePostedAndKeepsWholeMessages) {
  Matcher m;
  m.post(1, 1);
  m.post(2, 2);
  m.keep(3, "whole");
  m.keep(3, "partial");
  auto posted = m.takeAllPosted();
  ASSERT_EQ(posted.size(), 2u);
  EXPECT_EQ(posted[0], 1);
  EXPECT_EQ(posted[1], 2);
  EXPECT_FALSE(m.anyPosted());
  m.dropKeptIf([](const std::string& s) { return s == "partial"; });
  std::vector<std::string> left;
  m.forEachKept([&](const std::string& s) { left.push_back(s); });
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0], "whole");
}

TEST(TagMatcher, MoveOnlyRecords) {
  loom::TagMatcher<std::unique_ptr<int>, std::unique_ptr<int>> m;
  m.post(1, std::make_unique<int>(4));
  auto r = m.takeRecv(1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(**r, 4);
}

// Random interleavings of posts and arrivals on a few tags, against a queue per tag: every
// message goes to the receive of the same ordinal on its tag, whichever came first.
TEST(TagMatcher, AgreesWithAQueuePerTag) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 200; ++round) {
    Matcher m;
    std::map<uint32_t, int> sent, posted;            // per tag: messages sent, receives posted so far
    std::map<std::pair<uint32_t, int>, int> recvOf;  // (tag, ordinal) -> receive id
    std::map<int, std::string> got;                  // receive id -> message
    int nextRecv = 0;
    const int ops = 1 + static_cast<int>(rng() % 60);
    const uint32_t tags = 1 + rng() % 4;
    for (int i = 0; i < ops; ++i) {
      const uint32_t tag = rng() % tags;
      if (rng() % 2 == 0) {  // a message arrives
        const std::string msg = std::to_string(tag) + ":" + std::to_string(sent[tag]++);
        if (auto r = m.takeRecv(tag)) {
          got[*r] = msg;
        } else {
          m.keep(tag, msg);
        }
      } else {  // a receive is posted
        const int id = nextRecv++;
        recvOf[{tag, posted[tag]++}] = id;
        if (auto msg = m.takeMessage(tag)) {
          got[id] = *msg;
        } else {
          m.post(tag, id);
        }
      }
    }
    for (const auto& [key, id] : recvOf) {
      const auto& [tag, ordinal] = key;
      if (ordinal < sent[tag]) {
        ASSERT_EQ(got.count(id), 1u) << "receive " << ordinal << " on tag " << tag << " unmatched";
        EXPECT_EQ(got[id], std::to_string(tag) + ":" + std::to_string(ordinal));
      } else {
        EXPECT_EQ(got.count(id), 0u);
      }
    }
    for (const auto& [tag, n] : sent) {
      const int matched = std::min(n, posted[tag]);
      EXPECT_EQ(m.keptOn(tag), static_cast<size_t>(n - matched));
      EXPECT_EQ(m.postedOn(tag), static_cast<size_t>(posted[tag] - matched));
    }
  }
}

TEST(TagMatcher, TruncationErrorNamesBothSizesAndThePeer) {
  loom::Status s = loom::truncationError(3, 9, 4096, 100);
  EXPECT_FALSE(s.ok);
  EXPECT_EQ(s.code, loom::ErrorCode::InvalidUsage);
  EXPECT_EQ(s.peer, 3);
  EXPECT_NE(s.message.find("4096 bytes from rank 3 (tag 9)"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find("receive buffer of 100 bytes"), std::string::npos) << s.message;
}

}  // namespace
