// The ib connection's wire protocol (ib_connection.hpp says how it goes): the message types, the
// header every message starts with, the work request ids, and the connection's private records.
// For ib_connection.cc and ib_messages.cc only.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/ib/ib_connection.hpp"

namespace loom {
namespace ib {
namespace proto {

enum class Msg : uint8_t { Eager = 1, Rts, Cts, Nack, Credit };

// Work request ids: the kind in the top two bits, then what it refers to.
constexpr uint64_t kRecvSlot = 1ULL << 62;
constexpr uint64_t kSendSlot = 2ULL << 62;
constexpr uint64_t kWrite = 3ULL << 62;
constexpr uint64_t kKindMask = 3ULL << 62;
// The "slot" of a send that went inline: it used none.
constexpr uint64_t kNoSlot = 0xfffff;

// Send work requests per queue pair: the staging slots' SENDs and the writes in flight.
constexpr int kSendWr = 256;

}  // namespace proto

struct IbConnection::Header {
  uint8_t type = 0;
  uint8_t pad[3] = {};
  uint32_t tag = 0;
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint64_t sig = 0;              // the call's signature; in a NACK, the refusing receive's (0: too small)
  uint64_t addr = 0;             // CTS: where to write
  uint32_t rkey = 0;             // CTS: the key to write with
  uint32_t id = 0;               // CTS: the immediate data the writes carry
  uint16_t grant[kMaxQps] = {};  // credits returned, per queue pair
};

struct IbConnection::SendOp {
  RequestPtr req;
  const uint8_t* buf = nullptr;
  size_t bytes = 0;
  uint32_t tag = 0;
  uint64_t sig = 0;
  uint64_t seq = 0;
  Registration reg;
  size_t chunksLeft = 0;
};

struct IbConnection::RecvOp : PostedRecv {
  size_t received = 0;
  Registration reg;
};

struct IbConnection::Unexpected {
  Header h;
  std::vector<uint8_t> data;  // an EAGER's payload
};

struct IbConnection::Outgoing {
  Header h;
  std::vector<uint8_t> payload;
};

struct IbConnection::Write {
  std::shared_ptr<SendOp> op;
  size_t offset = 0;
  size_t len = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
  uint32_t id = 0;
  int qp = 0;
};

}  // namespace ib
}  // namespace loom
