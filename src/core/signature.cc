#include "core/signature.hpp"

#include <algorithm>

#include "core/format.hpp"

namespace loom {
namespace {

// From the top: the kind (4 bits), the datatype (4), the op (3), the reproducible-mode bit, the
// root (17), the device bit, and the count (34 bits; larger counts saturate).
constexpr uint64_t kKindShift = 60, kTypeShift = 56, kOpShift = 53;
constexpr uint64_t kCountBits = 34, kRootBits = 17, kRootShift = 35;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kDeviceBit = uint64_t{1} << kCountBits;
constexpr uint64_t kRootMask = (uint64_t{1} << kRootBits) - 1;
constexpr uint64_t kReproducibleBit = uint64_t{1} << (kRootShift + kRootBits);
constexpr uint64_t kBarrier = static_cast<uint64_t>(SigKind::Barrier);
static_assert(kRootShift + kRootBits < kOpShift, "the signature's fields overlap");

const char* kindName(uint64_t k) {
  static const char* names[] = {"?",          "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
                                "all_to_all", "barrier",    "gather",    "scatter"};
  return k < sizeof names / sizeof names[0] ? names[k] : "?";
}

bool reducing(uint64_t k) { return k == 1 || k == 3 || k == 5; }
bool rooted(uint64_t k) { return k == 2 || k == 3 || k == 8 || k == 9; }

}  // namespace

uint64_t makeSignature(SigKind kind, DataType type, ReduceOp op, int root, size_t count) {
  const auto k = static_cast<uint64_t>(kind) & 15;
  if (k == kBarrier) return kBarrier << kKindShift;
  const uint64_t t = static_cast<uint64_t>(type) & 15;
  const uint64_t o = reducing(k) ? static_cast<uint64_t>(op) & 7 : 0;
  const uint64_t r = rooted(k) ? static_cast<uint64_t>(std::max(root, 0)) & kRootMask : 0;
  const uint64_t c = std::min<uint64_t>(count, kCountMask);
  return k << kKindShift | t << kTypeShift | o << kOpShift | r << kRootShift | c;
}

// All-to-all takes no op: its op bits set to 7 mark the form with counts per peer.
constexpr uint64_t kVariableOp = 7;

uint64_t makeAllToAllvSignature(DataType type) {
  return makeSignature(SigKind::AllToAll, type, ReduceOp::Sum, 0, 0) | kVariableOp << kOpShift;
}

uint64_t onDeviceBuffers(uint64_t sig) { return sig == 0 ? 0 : sig | kDeviceBit; }
bool isOnDeviceBuffers(uint64_t sig) { return (sig & kDeviceBit) != 0; }
uint64_t inReproducibleMode(uint64_t sig) { return sig == 0 ? 0 : sig | kReproducibleBit; }
bool isInReproducibleMode(uint64_t sig) { return (sig & kReproducibleBit) != 0; }

std::string describeSignature(uint64_t sig) {
  const std::string where = std::string((sig & kDeviceBit) != 0 ? " on device buffers" : "") +
                            ((sig & kReproducibleBit) != 0 && (sig >> kKindShift) != 0 ? " in reproducible mode" : "");
  const uint64_t k = sig >> kKindShift;
  if (sig == kDeviceIpcMessage) return "a send from device buffers (through CUDA IPC)";
  if (sig == kDeviceIpcAck) return "the acknowledgement of a device send";
  if (sig == kDeviceAnySourceRecv) return "a receive from any rank into device buffers";
  if (k == 0) return "a point-to-point message";
  if (k == kBarrier) return "barrier";
  const auto type = static_cast<DataType>((sig >> kTypeShift) & 15);
  const auto typeName = [type] {
    return static_cast<int>(type) <= static_cast<int>(DataType::Bfloat16) ? toString(type) : "?";
  };
  if (k == 6 && ((sig >> kOpShift) & 7) == kVariableOp) return strFormat("all_to_all_v of %s", typeName()) + where;
  const auto op = static_cast<ReduceOp>((sig >> kOpShift) & 7);
  const uint64_t root = (sig >> kRootShift) & kRootMask, count = sig & kCountMask;
  std::string s = strFormat("%s of %llu %s", kindName(k), static_cast<unsigned long long>(count),
                            static_cast<int>(type) <= static_cast<int>(DataType::Bfloat16) ? toString(type) : "?");
  if (rooted(k)) {
    const bool from = k == 2 || k == 9;  // broadcast and scatter send from the root
    s += strFormat(" %s rank %llu", from ? "from" : "to", static_cast<unsigned long long>(root));
  }
  if (reducing(k)) {
    s += strFormat(" (%s)", static_cast<int>(op) <= static_cast<int>(ReduceOp::Avg) ? toString(op) : "?");
  }
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
