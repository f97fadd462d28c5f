// SHA-256 and HMAC-SHA256 against the published test vectors (FIPS 180-4's examples, RFC 4231),
// split into updates at every offset; the job key, the proofs and the constant-time compare.
#include "bootstrap/sha256.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bootstrap/auth.hpp"

namespace {

std::string hex(const loom::Sha256Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

std::vector<uint8_t> unhex(const std::string& h) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<uint8_t>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string sha(const std::string& m) { return hex(loom::sha256(m.data(), m.size())); }

TEST(Sha256, PublishedVectors) {
  EXPECT_EQ(sha(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(
      sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
          "nopqrstu"),
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Every length around the padding's edges (55, 56, 64 bytes), cut into two updates at every place:
// the same digest as one update of the whole.
TEST(Sha256, UpdatesInPiecesMatchOneUpdate) {
  for (size_t len : {0u, 1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 128u, 200u}) {
    std::string m;
    for (size_t i = 0; i < len; ++i) m += static_cast<char>('a' + i % 26);
    const auto whole = loom::sha256(m.data(), m.size());
    for (size_t cut = 0; cut <= len; ++cut) {
      loom::Sha256 s;
      s.update(m.data(), cut);
      s.update(m.data() + cut, len - cut);
      ASSERT_EQ(s.finish(), whole) << "length " << len << ", cut at " << cut;
    }
  }
}

std::string hmac(const std::vector<uint8_t>& key, const std::string& msg) {
  const loom::MacPart part{msg.data(), msg.size()};
  return hex(loom::hmacSha256(key.data(), key.size(), &part, 1));
}

TEST(HmacSha256, Rfc4231Vectors) {
  // Case 1: a 20-byte key.
  EXPECT_EQ(hmac(std::vector<uint8_t>(20, 0x0b), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Case 2: a key shorter than the digest.
  EXPECT_EQ(hmac({'J', 'e', 'f', 'e'}, "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Case 3: 50 bytes of 0xdd under 20 bytes of 0xaa.
  EXPECT_EQ(hmac(std::vector<uint8_t>(20, 0xaa), std::string(50, '\xdd')),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Case 4.
  EXPECT_EQ(hmac(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd')),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Case 6: a key longer than a block (hashed first).
  EXPECT_EQ(hmac(std::vector<uint8_t>(131, 0xaa), "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Case 7: both longer than a block.
  EXPECT_EQ(hmac(std::vector<uint8_t>(131, 0xaa),
                 "This is a test using a larger than block-size key and a larger than block-size data. The key needs "
                 "to be hashed before being used by the HMAC algorithm."),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(HmacSha256, PartsAreConcatenated) {
  const std::vector<uint8_t> key(32, 7);
  const std::string a = "peer-client", b(16, '\x01'), c(16, '\x02');
  const loom::MacPart parts[] = {{a.data(), a.size()}, {b.data(), b.size()}, {nullptr, 0}, {c.data(), c.size()}};
  EXPECT_EQ(hex(loom::hmacSha256(key.data(), key.size(), parts, 4)), hmac(key, a + b + c));
}

TEST(Auth, MacsDependOnEveryInputAndCompareExactly) {
  const loom::JobKey key = loom::deriveJobKey("job-1");
  EXPECT_EQ(hex(key), sha("loom-job-key-v1:job-1"));
  EXPECT_NE(loom::deriveJobKey("job-2"), key);
  const loom::Nonce a = loom::randomNonce(), b = loom::randomNonce();
  EXPECT_NE(a, b);  // 128 random bits each
  const loom::Mac m = loom::computeMac(key, "store-client", a, b);
  EXPECT_TRUE(loom::macEqual(m, m.data()));
  EXPECT_NE(loom::computeMac(key, "store-server", a, b), m);
  EXPECT_NE(loom::computeMac(key, "store-client", b, a), m);
  EXPECT_NE(loom::computeMac(loom::deriveJobKey("job-2"), "store-client", a, b), m);
  const char extra[] = "ids";
  EXPECT_NE(loom::computeMac(key, "store-client", a, b, extra, 3), m);
  for (size_t i = 0; i < m.size(); ++i) {
    loom::Mac other = m;
    other[i] ^= 0x10;
    EXPECT_FALSE(loom::macEqual(m, other.data())) << i;
  }
}

}  // namespace
