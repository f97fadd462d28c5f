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
bool decodeValues(const Bytes& payload, size_t count, std::vector<std::optional<Bytes>>* values);

void putU32(uint8_t* p, uint32_t v);
uint32_t getU32(const uint8_t* p);
void putI64(uint8_t* p, int64_t v);
int64_t getI64(const uint8_t* p);

}  // namespace storewire
}  // namespace loom
