// Collective signatures: what a rank's collective call is (kind, datatype, op, root, count) in 64
// bits, carried in the transport header of every message of that collective. A receive whose
// signature differs from the message's fails at once, on the rank that sees it, with both calls
// spelled out ("rank 3 called broadcast of 1024 float32 from rank 0 where this rank called
// all_reduce of 1024 float32 (sum)"), instead of a hang or silently mixed data. The check costs
// no message and no round trip. Zero means "not a collective" and matches anything.
//
// Layout (high to low): kind 3 bits, datatype 4, op 3, reproducible 1, root 17, device buffers 1,
// count 35 (saturating: counts beyond 2^35 elements compare equal there, and the byte counts still
// differ). The device bit makes a rank that passes device buffers where its peers pass host memory
// fail at the first message or shared-memory check, on both sides, instead of at the timeout; the
// reproducible bit does the same for a rank in reproducible mode among ranks that are not (their
// algorithms differ).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.hpp"
#include "loom/loom.hpp"

namespace loom {

enum class SigKind : uint8_t {
  None = 0,
  AllReduce = 1,
  Broadcast = 2,
  Reduce = 3,
  AllGather = 4,
  ReduceScatter = 5,
  AllToAll = 6,
  Barrier = 7,
  Gather = 8,
  Scatter = 9
};

/// The signature of a call; the op is kept only where it matters (reductions), the root only
/// where there is one (broadcast, reduce, gather, scatter). `count` is the per-rank count the API
/// was given.
uint64_t makeSignature(SigKind kind, DataType type, ReduceOp op, int root, size_t count);

/// The signature of an all-to-all with counts per peer: the counts differ between ranks, so only
/// the kind (all-to-all, marked variable) and the datatype are compared.
uint64_t makeAllToAllvSignature(DataType type);

/// `sig` marked as a call on device buffers (0 stays 0), and whether it is so marked.
uint64_t onDeviceBuffers(uint64_t sig);
bool isOnDeviceBuffers(uint64_t sig);
/// `sig` marked as a reduction in reproducible mode (0 stays 0), and whether it is so marked.
uint64_t inReproducibleMode(uint64_t sig);
bool isInReproducibleMode(uint64_t sig);

/// Marks of the point-to-point messages of device send/recv through CUDA IPC (comm/device_p2p.cc):
/// kind 0 like every point-to-point message, but not 0, so that a host receive never takes a
/// descriptor as data, nor a device receive host bytes as a descriptor.
constexpr uint64_t kDeviceIpcMessage = uint64_t{1} << 35;         ///< a device send's descriptor
constexpr uint64_t kDeviceIpcAck = kDeviceIpcMessage | 1;         ///< its receiver's acknowledgement
constexpr uint64_t kDeviceAnySourceRecv = kDeviceIpcMessage | 2;  ///< a device receive from any source
inline bool isMarkedMessage(uint64_t sig) { return sig != 0 && (sig >> 60) == 0; }

/// Whether a message with `theirs` may complete a receive posted with `mine`. A device receive
/// from any source takes a descriptor or plain bytes (Request::matchedSignature says which).
inline bool signaturesAgree(uint64_t mine, uint64_t theirs) {
  if (mine == kDeviceAnySourceRecv) return theirs == 0 || theirs == kDeviceIpcMessage;
  if (isMarkedMessage(mine) || isMarkedMessage(theirs)) return mine == theirs;
  return mine == 0 || theirs == 0 || mine == theirs;
}

/// "all_reduce of 1024 float32 (sum)", "broadcast of 7 int8 from rank 3", "barrier".
std::string describeSignature(uint64_t sig);

/// The error of a receive on rank `me` whose message came from `peer` with another signature:
/// "rank 0 called all_reduce of ... where rank 1 called broadcast of ...", readable wherever it
/// is relayed.
Status signatureMismatch(int peer, uint64_t theirs, int me, uint64_t mine);

}  // namespace loom
