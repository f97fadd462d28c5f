#include "bootstrap/store_protocol.hpp"

#include <cstring>

namespace loom {
namespace storewire {

void putU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t getU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
void putI64(uint8_t* p, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}
int64_t getI64(const uint8_t* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<int64_t>(u);
}

Bytes encodeRequest(Op op, const std::string& key, const Bytes& value) {
  Bytes out(4 + 1 + 4 + key.size() + value.size());
  putU32(out.data(), static_cast<uint32_t>(out.size() - 4));
  out[4] = static_cast<uint8_t>(op);
  putU32(out.data() + 5, static_cast<uint32_t>(key.size()));
  std::memcpy(out.data() + 9, key.data(), key.size());
  if (!value.empty()) std::memcpy(out.data() + 9 + key.size(), value.data(), value.size());
  return out;
}

Bytes encodeReply(Reply status, const Bytes& payload) {
  Bytes out(4 + 1 + payload.size());
  putU32(out.data(), static_cast<uint32_t>(out.size() - 4));
  out[4] = static_cast<uint8_t>(status);
  if (!payload.empty()) std::memcpy(out.data() + 5, payload.data(), payload.size());
  return out;
}

Parse decodeRequest(const uint8_t* buf, size_t len, Request* out, size_t* consumed, std::string* why) {
  if (len < 4) return Parse::Incomplete;
  uint32_t frame = getU32(buf);
  if (frame < 5 || frame > kMaxFrame) {
    *why = "frame length " + std::to_string(frame) + " out of range";
    return Parse::Malformed;
  }
  if (len < 4 + static_cast<size_t>(frame)) return Parse::Incomplete;
  uint8_t op = buf[4];
  if (op < static_cast<uint8_t>(Op::Set) || op > static_cast<uint8_t>(Op::Add)) {
    *why = "unknown operation " + std::to_string(op);
    return Parse::Malformed;
  }
  uint32_t keyLen = getU32(buf + 5);
  if (keyLen == 0 || keyLen > kMaxKey || keyLen > frame - 5) {
    *why = "key length " + std::to_string(keyLen) + " out of range";
    return Parse::Malformed;
  }
  out->op = static_cast<Op>(op);
  out->key.assign(reinterpret_cast<const char*>(buf + 9), keyLen);
  size_t valueLen = frame - 5 - keyLen;
  if (out->op == Op::Add && valueLen != 8) {
    *why = "add needs an 8-byte value";
    return Parse::Malformed;
  }
  out->value.assign(buf + 9 + keyLen, buf + 9 + keyLen + valueLen);
  *consumed = 4 + frame;
  return Parse::Done;
}

}  // namespace storewire
}  // namespace loom
