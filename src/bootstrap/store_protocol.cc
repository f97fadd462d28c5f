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

Bytes encodeKeys(const std::vector<std::string>& keys) {
  size_t n = 4;
  for (const auto& k : keys) n += 4 + k.size();
  Bytes out(n);
  putU32(out.data(), static_cast<uint32_t>(keys.size()));
  size_t at = 4;
  for (const auto& k : keys) {
    putU32(out.data() + at, static_cast<uint32_t>(k.size()));
    std::memcpy(out.data() + at + 4, k.data(), k.size());
    at += 4 + k.size();
  }
  return out;
}

bool decodeKeys(const Bytes& value, std::vector<std::string>* keys, std::string* why) {
  if (value.size() < 4) {
    *why = "a key list without its count";
    return false;
  }
  const uint32_t count = getU32(value.data());
  if (count > kMaxKeysPerRequest) {
    *why = "a key list of " + std::to_string(count) + " keys";
    return false;
  }
  keys->clear();
  size_t at = 4;
  for (uint32_t i = 0; i < count; ++i) {
    if (value.size() - at < 4) {
      *why = "a key list cut short";
      return false;
    }
    const uint32_t len = getU32(value.data() + at);
    if (len == 0 || len > kMaxKey || value.size() - at - 4 < len) {
      *why = "a listed key of length " + std::to_string(len);
      return false;
    }
    keys->emplace_back(reinterpret_cast<const char*>(value.data() + at + 4), len);
    at += 4 + len;
  }
  if (at != value.size()) {
    *why = "bytes after a key list";
    return false;
  }
  return true;
}

Bytes encodeValues(const std::vector<std::optional<Bytes>>& values) {
  Bytes out;
  for (const auto& v : values) {
    const size_t len = v ? v->size() : 0;
    // What does not fit in one reply is left out; the client asks again for it.
    const bool fits = v && out.size() + 5 + len <= kMaxFrame;
    const size_t at = out.size();
    out.resize(at + 5 + (fits ? len : 0));
    out[at] = fits ? 1 : 0;
    putU32(out.data() + at + 1, static_cast<uint32_t>(fits ? len : 0));
    if (fits && len > 0) std::memcpy(out.data() + at + 5, v->data(), len);
  }
  return out;
}

Bytes encodePairs(const std::vector<std::pair<std::string, Bytes>>& pairs) {
  size_t n = 4;
  for (const auto& [k, v] : pairs) n += 8 + k.size() + v.size();
  Bytes out(n);
  putU32(out.data(), static_cast<uint32_t>(pairs.size()));
  size_t at = 4;
  for (const auto& [k, v] : pairs) {
    putU32(out.data() + at, static_cast<uint32_t>(k.size()));
    std::memcpy(out.data() + at + 4, k.data(), k.size());
    at += 4 + k.size();
    putU32(out.data() + at, static_cast<uint32_t>(v.size()));
    if (!v.empty()) std::memcpy(out.data() + at + 4, v.data(), v.size());
    at += 4 + v.size();
  }
  return out;
}

bool decodePairs(const Bytes& value, std::vector<std::pair<std::string, Bytes>>* pairs, std::string* why) {
  pairs->clear();
  return walkPairs(
      value,
      [&](std::string_view k, std::string_view v) { pairs->emplace_back(std::string(k), Bytes(v.begin(), v.end())); },
      why);
}

bool decodeValues(const Bytes& payload, size_t count, std::vector<std::optional<Bytes>>* values) {
  values->assign(count, std::nullopt);
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    if (payload.size() - at < 5) return false;
    const bool found = payload[at] != 0;
    const uint32_t len = getU32(payload.data() + at + 1);
    if (payload.size() - at - 5 < len) return false;
    if (found)
      (*values)[i] = Bytes(payload.begin() + static_cast<std::ptrdiff_t>(at + 5),
                           payload.begin() + static_cast<std::ptrdiff_t>(at + 5 + len));
    at += 5 + len;
  }
  return at == payload.size();
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
  if (op < static_cast<uint8_t>(Op::Set) || op > static_cast<uint8_t>(Op::Wait)) {
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
  if (out->op == Op::Wait && valueLen != 4) {
    *why = "wait needs a 4-byte time";
    return Parse::Malformed;
  }
  out->value.assign(buf + 9 + keyLen, buf + 9 + keyLen + valueLen);
  *consumed = 4 + frame;
  return Parse::Done;
}

}  // namespace storewire
}  // namespace loom
