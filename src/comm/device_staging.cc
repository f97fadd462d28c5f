// Collectives on device buffers through pinned host staging (see device_staging.hpp).
#include "comm/device_staging.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>

#include "comm/device_state.hpp"
#include "core/deadline.hpp"
#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace detail {

using coll::Args;
using coll::Coll;
using coll::collName;
namespace {

LOOM_PARAM_INT(stagingBytesParam, "LOOM_DEVICE_STAGING_BYTES", 4 << 20,
               "pinned host bytes per staging slot for collectives on device buffers (3 slots per communicator)");

// Elements of the host-side staging per element of a chunk: input and output blocks together.
size_t stagingFactor(Coll kind, int size) {
  const auto n = static_cast<size_t>(size);
  switch (kind) {
    case Coll::AllGather:
    case Coll::ReduceScatter:
    case Coll::Gather:
    case Coll::Scatter:
      return n + 1;
    case Coll::AllToAll:
      return 2 * n;
    default:
      return 2;
  }
}

// Which sides a rank copies: its input to the host, the result back to the device.
bool copiesIn(Coll kind, const Args& a, int rank) {
  return (kind != Coll::Broadcast && kind != Coll::Scatter) || rank == a.root;
}
bool copiesOut(Coll kind, const Args& a, int rank) {
  if (kind == Coll::Reduce || kind == Coll::Gather) return rank == a.root;
  if (kind == Coll::Broadcast && rank == a.root) return a.send != a.recv;
  return true;
}

// Whether a rank's input, or its output, holds a block per rank (staged a chunk of each at once).
bool blocksIn(Coll kind) { return kind == Coll::ReduceScatter || kind == Coll::AllToAll || kind == Coll::Scatter; }
bool blocksOut(Coll kind) { return kind == Coll::AllGather || kind == Coll::AllToAll || kind == Coll::Gather; }

// One staged chunk: elements [off, off + m) of each block.
struct Chunk {
  size_t off = 0, m = 0;
};

}  // namespace

size_t deviceStagingBytes() { return static_cast<size_t>(std::max<int64_t>(stagingBytesParam(), 4096)); }

DeviceChunks planDeviceChunks(Coll kind, size_t count, size_t elem, int size, size_t stagingBytes) {
  DeviceChunks d;
  const size_t perElem = stagingFactor(kind, size) * elem;
  d.elems = std::max<size_t>(1, stagingBytes / perElem);
  d.chunks = count == 0 ? 1 : (count + d.elems - 1) / d.elems;
  return d;
}

int locateBuffers(const detail::CommImpl& c, std::initializer_list<const void*> buffers, void* stream,
                  const char* what) {
  device::DeviceRuntime* rt = device::runtime();
  if (rt == nullptr) {
    if (stream != nullptr) {
      LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
                 strFormat("%s: a CUDA stream was given, but %s; pass no stream for host buffers", what,
                           device::unavailableReason().c_str()));
    }
    return -1;
  }
  int dev = -2;  // none looked at yet
  bool anyHost = false;
  for (const void* p : buffers) {
    if (p == nullptr) continue;
    const int d = rt->deviceOf(p);
    if (d < 0) {
      anyHost = true;
    } else if (dev >= 0 && d != dev) {
      LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
                 strFormat("%s: buffers on two devices (%d and %d); one call works on one device", what, dev, d));
    } else {
      dev = d;
    }
  }
  if (dev >= 0 && anyHost) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("%s: a mix of host and device (CUDA device %d) buffers; pass all host or all device buffers",
                         what, dev));
  }
  if (dev < 0 && anyHost && stream != nullptr) {
    LOOM_THROW(ErrorCode::InvalidArgument, c.rank(),
               strFormat("%s: a CUDA stream was given with host buffers; pass no stream for host buffers", what));
  }
  if (dev < 0 && stream != nullptr) dev = rt->currentDevice();  // count 0 on a stream: still stream-ordered
  return dev < 0 ? -1 : dev;
}

namespace {

// One staged collective on the op queue: its chunks pipelined through three pinned host slots.
// Chunk j is copied in from the device into slot j % 3 while chunk j - 1 runs on the host and
// chunk j - 2 is copied out; a slot is reused once its last copy out has landed.
struct StagedCall {
  detail::CommImpl& c;
  device::DeviceRuntime& rt;
  DeviceState& st;
  DeviceState::Streams& cs;
  Coll kind;
  const Args& a;
  DeviceChunks plan;
  size_t chunks;
  const size_t N = static_cast<size_t>(c.size()), E = a.elem;
  size_t slotIn = 0;
  uint8_t* slots[3] = {};
  device::EventHandle inEv[3] = {}, outEv[3] = {};  // the last copy into / out of each slot

  // Host bytes of a chunk of m elements: the input block(s), the output block(s).
  size_t inBytes(size_t m) const {
    if (a.counts) return extent(0, N) * E;
    return (blocksIn(kind) ? N : 1) * m * E;
  }
  size_t outBytes(size_t m) const {
    if (a.counts) return extent(2 * N, 3 * N) * E;
    return (blocksOut(kind) ? N : 1) * m * E;
  }
  // The end of the farthest block of an all-to-all-v's counts (at `count`) and displacements.
  size_t extent(size_t count, size_t displ) const {
    const auto& v = *a.counts;
    size_t end = 0;
    for (size_t j = 0; j < N; ++j) end = std::max(end, v[displ + j] + v[count + j]);
    return end;
  }
  Chunk chunkAt(size_t j) const {
    Chunk k;
    k.off = j * plan.elems;
    k.m = a.counts ? 0 : std::min(plan.elems, a.count - std::min(a.count, k.off));
    return k;
  }
  void copyIn(size_t j) {
    if (!copiesIn(kind, a, c.rank())) return;
    const Chunk k = chunkAt(j);
    uint8_t* h = slots[j % 3];
    const auto* src = static_cast<const uint8_t*>(a.send);
    if (a.counts) {
      rt.copyAsync(h, src, inBytes(0), cs.d2h);
    } else if (blocksIn(kind)) {
      rt.copy2DAsync(h, k.m * E, src + k.off * E, a.count * E, k.m * E, N, cs.d2h);
    } else {
      rt.copyAsync(h, src + k.off * E, k.m * E, cs.d2h);
    }
  }
  void copyOut(size_t j) {
    if (!copiesOut(kind, a, c.rank())) return;
    const Chunk k = chunkAt(j);
    const uint8_t* h = slots[j % 3] + slotIn;
    auto* dst = static_cast<uint8_t*>(a.recv);
    if (a.counts) {
      const auto& v = *a.counts;
      for (size_t p = 0; p < N; ++p)
        rt.copyAsync(dst + v[3 * N + p] * E, h + v[3 * N + p] * E, v[2 * N + p] * E, cs.h2d);
    } else if (blocksOut(kind)) {
      rt.copy2DAsync(dst + k.off * E, a.count * E, h, k.m * E, k.m * E, N, cs.h2d);
    } else {
      rt.copyAsync(dst + k.off * E, h, k.m * E, cs.h2d);
    }
  }
  void settle(device::EventHandle& e, const char* what) {
    if (e == nullptr) return;
    waitEvent(rt, e, c, Deadline(c.timeout()), what);
    rt.destroyEvent(e);
    e = nullptr;
  }
  // Chunk j on the host, as call `seq` + j (its own number in the flight recorder).
  void runChunk(size_t j, int64_t seq, const HostRun& run) {
    const Chunk k = chunkAt(j);
    Args h = a;
    h.device = -1;
    h.send = slots[j % 3];
    h.recv = slots[j % 3] + slotIn;
    if (!a.counts) h.count = k.m;
    if (j == 0) {
      run(h, seq);
    } else {
      c.runRecorded(seq + static_cast<int64_t>(j), [&](int64_t sub) { run(h, sub); });
    }
  }
  void pipeline(int64_t seq, const HostRun& run) {
    slotIn = inBytes(plan.elems);
    for (int i = 0; i < 3; ++i) slots[i] = st.slot(i, slotIn + outBytes(plan.elems) + 64);
    copyIn(0);
    inEv[0] = rt.recordEvent(cs.d2h);
    for (size_t j = 0; j < chunks; ++j) {
      const auto s = static_cast<int>(j % 3);
      if (j + 1 < chunks) {
        const auto s1 = static_cast<int>((j + 1) % 3);
        settle(outEv[s1], "a staged copy to the device");
        copyIn(j + 1);
        inEv[s1] = rt.recordEvent(cs.d2h);
      }
      settle(inEv[s], "a staged copy from the device");
      runChunk(j, seq, run);
      copyOut(j);
      outEv[s] = rt.recordEvent(cs.h2d);
    }
    for (auto& e : outEv) settle(e, "a staged copy to the device");
  }
  // After a failure: copies in flight still target the slots, so they finish before the slots
  // are reused.
  void drainCopies() noexcept {
    for (auto* evs : {inEv, outEv})
      for (int i = 0; i < 3; ++i)
        if (evs[i] != nullptr) {
          try {
            while (!rt.eventDone(evs[i])) std::this_thread::sleep_for(std::chrono::microseconds(50));
          } catch (...) {
          }
          rt.destroyEvent(evs[i]);
        }
  }
};

}  // namespace

Work launchOnDevice(detail::CommImpl& c, Coll kind, const Args& a, void* stream, uint64_t sig, const HostRun& run) {
  const DeviceChunks plan = planDeviceChunks(kind, a.counts ? 1 : a.count, a.elem, c.size(), deviceStagingBytes());
  const size_t chunks = a.counts ? 1 : plan.chunks;
  auto body = [&c, kind, a, run, plan, chunks](int64_t seq, DeviceState& st) {
    StagedCall call{c, st.rt(), st, st.streams(a.device), kind, a, plan, chunks};
    try {
      call.pipeline(seq, run);
    } catch (...) {
      call.drainCopies();
      throw;
    }
  };
  return launchDeviceCall(c, kind, a.device, stream, sig, static_cast<int64_t>(chunks), body);
}

}  // namespace detail
}  // namespace loom
