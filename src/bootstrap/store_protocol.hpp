// Wire format of the TCP rendezvous store. Pure encode/decode with every length checked, so the
// server can be fed arbitrary bytes (stray clients, port scanners, fuzzers) without harm.
//
// Handshake (before any request), with K the job key:
//   server -> client: "LOOMSTS1" nonceS[16]
//   client -> server: "LOOMSTC1" nonceC[16] HMAC(K, "store-client" nonceS nonceC)[32]
//   server -> client: HMAC(K, "store-server" nonceC nonceS)[32]
// Request:  u32 length (of what follows, little-endian) u8 op u32 keyLength key value
// Response: u32 length u8 status payload
// GetMany (many keys in one round trip, so that a rank's bootstrap costs the store O(1) requests,
// not one per peer): key "many", value u32 count (u32 length key)*count; reply Ok, payload
// (u8 found u32 length value)*count, values left out (found 0) once the reply would pass kMaxFrame.
// SetMany: key "many", value u32 count (u32 length key u32 length value)*count; reply Ok.
// Wait: key, value u32 milliseconds; the reply (Ok and the value, or NotFound) comes once the key
// is set or the time has passed (at most kMaxWaitMs), so that a waiting rank costs the store one
// request per wait instead of a poll every few milliseconds. A client's later requests wait for it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bootstrap/store.hpp"

namespace loom {
namespace storewire {

constexpr char kServerMagic[8] = {'L', 'O', 'O', 'M', 'S', 'T', 'S', '1'};
constexpr char kClientMagic[8] = {'L', 'O', 'O', 'M', 'S', 'T', 'C', '1'};
constexpr size_t kServerHello = 8 + 16;
constexpr size_t kClientHello = 8 + 16 + 32;
constexpr size_t kServerProof = 32;

constexpr uint32_t kMaxFrame = 64u << 20;  // a value larger than 64 MiB is refused
constexpr uint32_t kMaxKey = 4096;

enum class Op : uint8_t { Set = 1, TryGet = 2, Add = 3, GetMany = 4, SetMany = 5, Wait = 6 };
constexpr uint32_t kMaxWaitMs = 60000;
constexpr uint32_t kMaxKeysPerRequest = 4096;
enum class Reply : uint8_t { Ok = 0, NotFound = 1, Error = 2 };

struct Request {
  Op op = Op::Set;
  std::string key;
  Bytes value;
};

enum class Parse { Incomplete, Done, Malformed };

/// Encodes a request frame.
Bytes encodeRequest(Op op, const std::string& key, const Bytes& value);
/// Encodes a response frame.
Bytes encodeReply(Reply status, const Bytes& payload);
/// Tries to decode one request from buf[0..len); on Done sets *consumed. On Malformed, *why says why.
Parse decodeRequest(const uint8_t* buf, size_t len, Request* out, size_t* consumed, std::string* why);

/// GetMany's list of keys, and its reply's values (nullopt: not set, or left out).
Bytes encodeKeys(const std::vector<std::string>& keys);
bool decodeKeys(const Bytes& value, std::vector<std::string>* keys, std::string* why);
Bytes encodeValues(const std::vector<std::optional<Bytes>>& values);
/// SetMany's pairs.
Bytes encodePairs(const std::vector<std::pair<std::string, Bytes>>& pairs);
bool decodePairs(const Bytes& value, std::vector<std::pair<std::string, Bytes>>* pairs, std::string* why);
/// Walks an encoded list of pairs in place: visit(key, value), string_views into `value`, for each
/// pair in turn. False, with *why, where the list does not decode (the pairs before were visited).
template <typename Visit>
bool walkPairs(const Bytes& value, Visit&& visit, std::string* why);
bool decodeValues(const Bytes& payload, size_t count, std::vector<std::optional<Bytes>>* values);

void putU32(uint8_t* p, uint32_t v);
uint32_t getU32(const uint8_t* p);
void putI64(uint8_t* p, int64_t v);
int64_t getI64(const uint8_t* p);

template <typename Visit>
bool walkPairs(const Bytes& value, Visit&& visit, std::string* why) {
  if (value.size() < 4) {
    *why = "a list of pairs without its count";
    return false;
  }
  const uint32_t count = getU32(value.data());
  if (count > kMaxKeysPerRequest) {
    *why = "a list of " + std::to_string(count) + " pairs";
    return false;
  }
  const auto* text = reinterpret_cast<const char*>(value.data());
  size_t at = 4;
  for (uint32_t i = 0; i < count; ++i) {
    if (value.size() - at < 4) {
      *why = "a list of pairs cut short";
      return false;
    }
    const uint32_t klen = getU32(value.data() + at);
    if (klen == 0 || klen > kMaxKey || value.size() - at - 4 < static_cast<size_t>(klen) + 4) {
      *why = "a listed key of length " + std::to_string(klen);
      return false;
    }
    const std::string_view key(text + at + 4, klen);
    at += 4 + klen;
    const uint32_t vlen = getU32(value.data() + at);
    if (value.size() - at - 4 < vlen) {
      *why = "a listed value of length " + std::to_string(vlen);
      return false;
    }
    visit(key, std::string_view(text + at + 4, vlen));
    at += 4 + vlen;
  }
  if (at != value.size()) {
    *why = "bytes after a list of pairs";
    return false;
  }
  return true;
}

}  // namespace storewire
}  // namespace loom
