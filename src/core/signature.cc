#include "core/signature.hpp"

#include <algorithm>

#include "core/format.hpp"

namespace loom {
namespace {

constexpr uint64_t kCountBits = 35, kRootBits = 17, kRootShift = 36;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kDeviceBit = uint64_t{1} << kCountBits;
constexpr uint64_t kRootMask = (uint64_t{1} << kRootBits) - 1;
constexpr uint64_t kReproducibleBit = uint64_t{1} << (kRootShift + kRootBits);

const char* kindName(uint64_t k) {
  static const char* names[] = {"?",          "all_reduce",     "broadcast",  "reduce",
                                "all_gather", "reduce_scatter", "all_to_all", "barrier"};
  return names[k & 7];
}

}  // namespace

uint64_t makeSignature(SigKind kind, DataType type, ReduceOp op, int root, size_t count) {
  const bool reduces = kind == SigKind::AllReduce || kind == SigKind::Reduce || kind == SigKind::ReduceScatter;
  const bool rooted = kind == SigKind::Broadcast || kind == SigKind::Reduce;
  if (kind == SigKind::Barrier) return uint64_t{7} << 61;
  const uint64_t k = static_cast<uint64_t>(kind) & 7;
  const uint64_t t = static_cast<uint64_t>(type) & 15;
  const uint64_t o = reduces ? static_cast<uint64_t>(op) & 7 : 0;
  const uint64_t r = rooted ? static_cast<uint64_t>(std::max(root, 0)) & kRootMask : 0;
  const uint64_t c = std::min<uint64_t>(count, kCountMask);
  return k << 61 | t << 57 | o << 54 | r << kRootShift | c;
}

// All-to-all takes no op: its op bits set to 7 mark the form with counts per peer.
constexpr uint64_t kVariableOp = 7;

uint64_t makeAllToAllvSignature(DataType type) {
  return makeSignature(SigKind::AllToAll, type, ReduceOp::Sum, 0, 0) | kVariableOp << 54;
}

uint64_t onDeviceBuffers(uint64_t sig) { return sig == 0 ? 0 : sig | kDeviceBit; }
bool isOnDeviceBuffers(uint64_t sig) { return (sig & kDeviceBit) != 0; }
uint64_t inReproducibleMode(uint64_t sig) { return sig == 0 ? 0 : sig | kReproducibleBit; }
bool isInReproducibleMode(uint64_t sig) { return (sig & kReproducibleBit) != 0; }

std::string describeSignature(uint64_t sig) {
  const std::string where = std::string((sig & kDeviceBit) != 0 ? " on device buffers" : "") +
                            ((sig & kReproducibleBit) != 0 && (sig >> 61) != 0 ? " in reproducible mode" : "");
  const uint64_t k = sig >> 61;
  if (sig == kDeviceIpcMessage) return "a send from device buffers (through CUDA IPC)";
  if (sig == kDeviceIpcAck) return "the acknowledgement of a device send";
  if (sig == kDeviceAnySourceRecv) return "a receive from any rank into device buffers";
  if (k == 0) return "a point-to-point message";
  if (k == 7) return "barrier";
  const auto type = static_cast<DataType>((sig >> 57) & 15);
  const auto typeName = [type] {
    return static_cast<int>(type) <= static_cast<int>(DataType::Bfloat16) ? toString(type) : "?";
  };
  if (k == 6 && ((sig >> 54) & 7) == kVariableOp) return strFormat("all_to_all_v of %s", typeName()) + where;
  const auto op = static_cast<ReduceOp>((sig >> 54) & 7);
  const uint64_t root = (sig >> kRootShift) & kRootMask, count = sig & kCountMask;
  const bool reduces = k == 1 || k == 3 || k == 5;
  const bool rooted = k == 2 || k == 3;
  std::string s = strFormat("%s of %llu %s", kindName(k), static_cast<unsigned long long>(count),
                            static_cast<int>(type) <= static_cast<int>(DataType::Bfloat16) ? toString(type) : "?");
  if (rooted) s += strFormat(" %s rank %llu", k == 2 ? "from" : "to", static_cast<unsigned long long>(root));
  if (reduces) s += strFormat(" (%s)", static_cast<int>(op) <= static_cast<int>(ReduceOp::Avg) ? toString(op) : "?");
  return s + where;
}

Status signatureMismatch(int peer, uint64_t theirs, int me, uint64_t mine) {
  if ((theirs == kDeviceIpcMessage && mine == 0) || (theirs == 0 && mine == kDeviceIpcMessage)) {
    const bool theirsOnDevice = theirs != 0;
    return Status::error(ErrorCode::InvalidUsage,
                         strFormat("rank %d sent from %s buffers where rank %d receives into %s buffers: between "
                                   "ranks of one node, the two ends of a send/recv must pass buffers of the same "
                                   "kind, device memory or host memory",
                                   peer, theirsOnDevice ? "device" : "host", me, theirsOnDevice ? "host" : "device"),
                         peer);
  }
  if (theirs != 0 && mine != 0 && (theirs ^ mine) == kDeviceBit) {
    const bool theirsOnDevice = (theirs & kDeviceBit) != 0;
    return Status::error(ErrorCode::InvalidUsage,
                         strFormat("rank %d called %s on %s buffers where rank %d called it on %s buffers: every rank "
                                   "must pass buffers of the same kind, device memory or host memory",
                                   peer, describeSignature(theirs & ~kDeviceBit).c_str(),
                                   theirsOnDevice ? "device" : "host", me, theirsOnDevice ? "host" : "device"),
                         peer);
  }
  if (theirs != 0 && mine != 0 && (theirs ^ mine) == kReproducibleBit) {
    const bool theirsOn = (theirs & kReproducibleBit) != 0;
    return Status::error(ErrorCode::InvalidUsage,
                         strFormat("rank %d is %sin reproducible mode where rank %d is %s(in %s): every rank of a "
                                   "communicator must set LOOM_REPRODUCIBLE (Options::reproducible) alike",
                                   peer, theirsOn ? "" : "not ", me, theirsOn ? "not " : "",
                                   describeSignature(mine & ~kReproducibleBit).c_str()),
                         peer);
  }
  return Status::error(ErrorCode::InvalidUsage,
                       strFormat("rank %d called %s where rank %d called %s: the ranks must call the same "
                                 "collectives in the same order, with the same counts, datatypes, ops, roots and "
                                 "buffer kinds",
                                 peer, describeSignature(theirs).c_str(), me, describeSignature(mine).c_str()),
                       peer);
}

}  // namespace loom
