// Everything decoded from bytes that come from outside: store requests, unique ids, addresses.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/rendezvous.hpp"
#include "bootstrap/store_protocol.hpp"
#include "loom/loom.hpp"

using namespace loom;

TEST(StoreWire, RoundTrip) {
  Bytes frame = storewire::encodeRequest(storewire::Op::Set, "key", Bytes{1, 2, 3});
  storewire::Request r;
  size_t used = 0;
  std::string why;
  ASSERT_EQ(storewire::decodeRequest(frame.data(), frame.size(), &r, &used, &why), storewire::Parse::Done);
  EXPECT_EQ(used, frame.size());
  EXPECT_EQ(r.key, "key");
  EXPECT_EQ(r.value, (Bytes{1, 2, 3}));
  for (size_t cut = 0; cut < frame.size(); ++cut)
    EXPECT_EQ(storewire::decodeRequest(frame.data(), cut, &r, &used, &why), storewire::Parse::Incomplete);
}

TEST(StoreWire, HostileFramesAreMalformed) {
  storewire::Request r;
  size_t used = 0;
  std::string why;
  uint8_t huge[9] = {0xff, 0xff, 0xff, 0x7f, 1, 1, 0, 0, 0};  // 2 GiB length
  EXPECT_EQ(storewire::decodeRequest(huge, sizeof(huge), &r, &used, &why), storewire::Parse::Malformed);
  Bytes badOp = storewire::encodeRequest(storewire::Op::Set, "k", {});
  badOp[4] = 99;
  EXPECT_EQ(storewire::decodeRequest(badOp.data(), badOp.size(), &r, &used, &why), storewire::Parse::Malformed);
  Bytes badKey = storewire::encodeRequest(storewire::Op::Set, "k", {});
  storewire::putU32(badKey.data() + 5, 1000);  // key longer than the frame
  EXPECT_EQ(storewire::decodeRequest(badKey.data(), badKey.size(), &r, &used, &why), storewire::Parse::Malformed);
  Bytes badAdd = storewire::encodeRequest(storewire::Op::Add, "k", Bytes{1});
  EXPECT_EQ(storewire::decodeRequest(badAdd.data(), badAdd.size(), &r, &used, &why), storewire::Parse::Malformed);
}

TEST(StoreWire, KeyListsAndPairsRoundTripAndRejectHostileCounts) {
  std::vector<std::string> keys{"a", "bb", std::string(storewire::kMaxKey, 'k')}, back;
  std::string why;
  ASSERT_TRUE(storewire::decodeKeys(storewire::encodeKeys(keys), &back, &why)) << why;
  EXPECT_EQ(back, keys);
  std::vector<std::pair<std::string, Bytes>> pairs{{"x", Bytes{1}}, {"y", Bytes{}}}, pairsBack;
  ASSERT_TRUE(storewire::decodePairs(storewire::encodePairs(pairs), &pairsBack, &why)) << why;
  EXPECT_EQ(pairsBack, pairs);
  std::vector<std::optional<Bytes>> values{Bytes{1, 2}, std::nullopt, Bytes{}}, valuesBack;
  ASSERT_TRUE(storewire::decodeValues(storewire::encodeValues(values), 3, &valuesBack));
  EXPECT_EQ(valuesBack, values);
  EXPECT_FALSE(storewire::decodeValues(storewire::encodeValues(values), 4, &valuesBack));  // fewer than asked
  // Hostile: a huge count, a length past the end, an empty key, bytes after the list.
  Bytes huge(4);
  storewire::putU32(huge.data(), 0xffffffffu);
  EXPECT_FALSE(storewire::decodeKeys(huge, &back, &why));
  EXPECT_FALSE(storewire::decodePairs(huge, &pairsBack, &why));
  Bytes cut = storewire::encodeKeys({"abc"});
  cut.pop_back();
  EXPECT_FALSE(storewire::decodeKeys(cut, &back, &why));
  EXPECT_FALSE(storewire::decodeKeys(storewire::encodeKeys({""}), &back, &why));
  Bytes extra = storewire::encodeKeys({"abc"});
  extra.push_back(0);
  EXPECT_FALSE(storewire::decodeKeys(extra, &back, &why));
  Bytes pairCut = storewire::encodePairs({{"k", Bytes(10, 1)}});
  pairCut.resize(pairCut.size() - 3);
  EXPECT_FALSE(storewire::decodePairs(pairCut, &pairsBack, &why));
}

TEST(StoreWire, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) {
    Bytes b(rng() % 64);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    storewire::Request r;
    size_t used = 0;
    std::string why;
    auto p = storewire::decodeRequest(b.data(), b.size(), &r, &used, &why);
    if (p == storewire::Parse::Done) {
      EXPECT_LE(used, b.size());
    }
  }
}

TEST(UniqueIdWire, RoundTripAndRejections) {
  UniqueIdFields f;
  f.store = SockAddr::resolve("::1", 4242).front();
  f.key.fill(9);
  f.commId.fill(3);
  uint8_t raw[kUniqueIdBytes];
  encodeUniqueId(f, raw);
  UniqueIdFields g;
  std::string why;
  ASSERT_TRUE(decodeUniqueId(raw, sizeof(raw), &g, &why)) << why;
  EXPECT_EQ(g.store.toString(), "[::1]:4242");
  EXPECT_EQ(g.key, f.key);
  EXPECT_EQ(g.commId, f.commId);
  EXPECT_FALSE(decodeUniqueId(raw, 100, &g, &why));
  uint8_t bad[kUniqueIdBytes];
  std::memcpy(bad, raw, sizeof(raw));
  bad[0] = 'X';
  EXPECT_FALSE(decodeUniqueId(bad, sizeof(bad), &g, &why));
  std::memcpy(bad, raw, sizeof(raw));
  bad[4] = 77;
  EXPECT_FALSE(decodeUniqueId(bad, sizeof(bad), &g, &why));
  EXPECT_NE(why.find("format"), std::string::npos);
  EXPECT_THROW(UniqueId::fromBytes(bad, sizeof(bad)), Error);
  EXPECT_THROW(UniqueId::fromHex("zz"), Error);
}

TEST(SockAddrWire, V4AndV6) {
  for (const char* host : {"127.0.0.1", "::1", "192.0.2.7"}) {
    SockAddr a = SockAddr::resolve(host, 1234).front(), b;
    uint8_t w[SockAddr::kWireBytes];
    a.toWire(w);
    ASSERT_TRUE(SockAddr::fromWire(w, &b));
    EXPECT_EQ(a.toString(), b.toString());
  }
  uint8_t junk[SockAddr::kWireBytes] = {9, 0, 1, 1};
  SockAddr c;
  EXPECT_FALSE(SockAddr::fromWire(junk, &c));
}
