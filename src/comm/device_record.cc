// Device records of CUDA IPC collectives (see device_record.hpp).
#include "comm/device_record.hpp"

#include <atomic>
#include <cstring>

#include "collectives/arena_sync.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/signature.hpp"

namespace loom {
namespace detail {

using coll::Segment;

using coll::barrier;
using coll::Context;
namespace {

static_assert(sizeof(DeviceRecord) <= LocalArena::kDeviceRecordBytes, "a record fits its arena slot");

// Said once per process: a pool buffer costs a device copy per call, which a user may want to know.
void noteBounce(const Error& e) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  LOOM_INFO("device buffers that CUDA IPC cannot share go through a device copy (%s)", e.message().c_str());
}

}  // namespace

void failCommunicatorWithCurrent(detail::CommImpl& comm, const std::string& label) {
  Status s = statusFromCurrentException();
  if (comm.failureState()->failed()) return;
  s.message = label + ": " + s.message;
  comm.failureState()->fail(s);
}

uint8_t* shareDeviceBuffer(DeviceState& st, const void* p, size_t bytes, int slot, bool input,
                           device::StreamHandle work, const std::function<void()>& drain, uint64_t* ptr,
                           device::IpcHandle* h) {
  if (p == nullptr) return nullptr;
  device::DeviceRuntime& rt = st.rt();
  try {
    *h = rt.ipcExport(p);
    *ptr = reinterpret_cast<uintptr_t>(p);
    return nullptr;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::Cuda) throw;
    noteBounce(e);
  }
  uint8_t* bounce = st.deviceScratch(slot, bytes);
  if (input && bytes > 0) {
    rt.copyAsync(bounce, p, bytes, work);
    drain();
  }
  *h = rt.ipcExport(bounce);
  *ptr = reinterpret_cast<uintptr_t>(bounce);
  return bounce;
}

std::vector<DeviceRecord> exchangeRecords(const Context& ctx, const LocalArena& ar, const DeviceRecord& mine,
                                          uint64_t* step, const std::string& label) {
  const auto N = ar.ranks.size(), ME = static_cast<size_t>(ar.me);
  std::memcpy(ar.deviceRecords[ME], &mine, sizeof(mine));
  barrier(ctx, ar, ++*step);
  std::vector<DeviceRecord> recs(N);
  for (size_t p = 0; p < N; ++p) std::memcpy(&recs[p], ar.deviceRecords[p], sizeof(DeviceRecord));
  for (size_t p = 0; p < N; ++p) {
    const DeviceRecord& r = recs[p];
    if (p == ME || (r.seq == mine.seq && r.sig == mine.sig && r.bytes == mine.bytes)) continue;
    // The calls the ranks published on entry say more where they can: a peer on the host path
    // wrote no device record.
    const auto seq = static_cast<int64_t>(mine.seq);
    if (Status m = ctx.comm().localCallMismatch(seq, mine.sig); !m.ok) {
      m.message = label + ": " + m.message;
      failDeviceCall(ctx, m);
    }
    failDeviceCall(
        ctx, Status::error(ErrorCode::InvalidUsage,
                           strFormat("%s: rank %d is in collective #%llu, %s (%llu bytes), where this rank "
                                     "is in %s (%llu bytes): the ranks called this collective with "
                                     "different counts, datatypes, ops or roots",
                                     label.c_str(), ar.ranks[p], static_cast<unsigned long long>(r.seq),
                                     describeSignature(r.sig).c_str(), static_cast<unsigned long long>(r.bytes),
                                     describeSignature(mine.sig).c_str(), static_cast<unsigned long long>(mine.bytes)),
                           ar.ranks[p], seq));
  }
  return recs;
}

uint8_t* peerDeviceBuffer(detail::CommImpl& comm, device::DeviceRuntime& rt, const DeviceRecord& mine,
                          const DeviceRecord& theirs, bool self, uint64_t ptr, const device::IpcHandle& h, int dev) {
  if (ptr == 0) return nullptr;
  if (self) return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(ptr));
  if (theirs.proc == mine.proc) {  // a rank of this process: its pointer as it is
    if (theirs.device != dev) rt.enablePeerAccess(theirs.device);
    return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(ptr));
  }
  return static_cast<uint8_t*>(comm.ipcCache()->map(rt, theirs.proc, h)) + h.offset;
}

}  // namespace detail
}  // namespace loom
