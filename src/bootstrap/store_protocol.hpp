// Wire format of the TCP rendezvous store. Pure encode/decode with every length checked, so the
// server can be fed arbitrary bytes (stray clients, port scanners, fuzzers) without harm.
//
// Handshake (before any request), with K the job key:
//   server -> client: "LOOMSTS1" nonceS[16]
//   client -> server: "LOOMSTC1" nonceC[16] HMAC(K, "store-client" nonceS nonceC)[32]
//   server -> client: HMAC(K, "store-server" nonceC nonceS)[32]
// Request:  u32 length (of what follows, little-endian) u8 op u32 keyLength key value
// Response: u32 length u8 status payload
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

enum class Op : uint8_t { Set = 1, TryGet = 2, Add = 3 };
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

void putU32(uint8_t* p, uint32_t v);
uint32_t getU32(const uint8_t* p);
void putI64(uint8_t* p, int64_t v);
int64_t getI64(const uint8_t* p);

}  // namespace storewire
}  // namespace loom
