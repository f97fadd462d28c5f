// DeviceRuntime: the few things Loom asks of a GPU runtime to run collectives on device buffers,
// behind one interface so that the collectives' stream and staging logic does not depend on CUDA
// headers. The CUDA implementation (device/cuda_runtime.cc) is built with the `cuda` feature and
// is active where a CUDA device is present; tests install an emulated device (a host-memory
// "GPU" whose streams are threads) to check that logic on machines without one.
//
// Handles are opaque: a stream is a cudaStream_t (nullptr: the legacy default stream), an event
// a cudaEvent_t. Every call throws loom::Error with ErrorCode::Cuda naming the call on failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/loom.hpp"

namespace loom {
namespace device {

using StreamHandle = void*;
using EventHandle = void*;

/// Inputs of one canonical reduction on the device at most (DeviceRuntime::reduceCanonicalAsync):
/// reproducible reductions take CUDA IPC among at most this many ranks, else the staging path.
constexpr int kMaxCanonicalInputs = 8;

/// The allocation that holds a device pointer: its range, and an id that no other allocation of
/// the process has had (CUDA's buffer id), so that memory freed and allocated again at the same
/// address is told apart from the old.
struct DeviceAllocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  uint64_t id = 0;
};

/// What another process needs to map a device allocation (CUDA IPC): the runtime's handle of the
/// allocation (a cudaIpcMemHandle_t) and where the exported pointer lies in it.
struct IpcHandle {
  static constexpr size_t kBytes = 64;
  uint8_t bytes[kBytes] = {};
  uint64_t offset = 0;  ///< of the exported pointer from the allocation's start
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  /// "cuda", or a test double's name; used in messages.
  virtual const char* name() const = 0;
  /// The device whose memory `p` points into, or -1 when `p` is host memory (pageable, pinned or
  /// mapped host memory all count as host: the CPU can read them directly).
  virtual int deviceOf(const void* p) = 0;
  /// Devices visible to this process.
  virtual int deviceCount() = 0;
  /// The calling thread's current device.
  virtual int currentDevice() = 0;
  /// Makes `device` current on the calling thread.
  virtual void setDevice(int device) = 0;
  /// The PCI address of `device` ("0000:3b:00.0", lower case), or "" where the runtime cannot say:
  /// the ib transport picks the RDMA adapter nearest the rank's GPU by it.
  virtual std::string pciBusId(int device) {
    (void)device;
    return std::string();
  }

  /// Readies `device` for Loom's work, once per process and device (later calls return at once):
  /// loads the kernels, whose lazy load at a first launch would wait for a stream Loom holds. Called
  /// on the caller's thread by every device operation before it holds the caller's stream.
  virtual void prepare(int device) { (void)device; }

  /// A non-blocking stream on the current device.
  virtual StreamHandle createStream() = 0;
  virtual void destroyStream(StreamHandle s) noexcept = 0;
  /// True while `s` is being captured into a CUDA graph.
  virtual bool capturing(StreamHandle s) = 0;

  /// A new event recorded on `s` (it completes once everything queued on `s` before it has).
  virtual EventHandle recordEvent(StreamHandle s) = 0;
  /// True once `e` has completed; throws if the device reported an error.
  virtual bool eventDone(EventHandle e) = 0;
  virtual void destroyEvent(EventHandle e) noexcept = 0;

  /// Queues a copy of `bytes` on `s`, between any two of host and device memory.
  virtual void copyAsync(void* dst, const void* src, size_t bytes, StreamHandle s) = 0;
  /// Queues a strided copy: `rows` rows of `width` bytes, `srcPitch` and `dstPitch` bytes apart.
  virtual void copy2DAsync(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows,
                           StreamHandle s) = 0;

  /// Device memory on the current device (tools, benchmarks, an in-place all-to-all's scratch).
  virtual void* allocDevice(size_t bytes) = 0;
  virtual void freeDevice(void* p) noexcept = 0;
  /// Waits on this thread until everything queued on `s` has completed; throws on a device error.
  virtual void synchronize(StreamHandle s) = 0;

  /// Page-locked host memory the device can read and write (mapped), zeroed; freed by freePinned.
  virtual void* allocPinned(size_t bytes) = 0;
  virtual void freePinned(void* p) noexcept = 0;
  /// Holds `s` (work queued on it later does not start) until the 32-bit word at `flag`, in
  /// allocPinned memory, reaches `value`: until (int32_t)(*flag - value) >= 0, so that a counter
  /// may wrap around. The host releases it by storing to *flag.
  virtual void waitValue(StreamHandle s, volatile uint32_t* flag, uint32_t value) = 0;
  /// How waitValue holds a stream here ("stream memory operations", "spin kernel"), for logs.
  virtual std::string waitMechanism() = 0;

  /// Queues dst[i] = op over srcs[0..n)[i], in that order (n >= 1; dst may be one of them; the
  /// sources may be other processes' memory opened with ipcOpen); divisor > 1 then divides (avg).
  virtual void reduceAsync(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op,
                           int divisor, StreamHandle s) = 0;

  /// Queues reproducible mode's canonical reduction (kernels::reduceCanonical, the same bits as the
  /// CPU's): dst[i] = the canonical tree over srcs[0..n)[i], half precision widened to float32 and
  /// rounded once, avg divided once by n. Float types, sum, avg and prod; 1 <= n <=
  /// kMaxCanonicalInputs; dst may be one of the sources.
  virtual void reduceCanonicalAsync(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op,
                                    StreamHandle s) = 0;

  /// Queues dst[i] = src[i] * scale converted between float32 and float16 or bfloat16 (either
  /// way; rounded to nearest even): gradient compression on the device.
  virtual void convertAsync(void* dst, DataType dstType, const void* src, DataType srcType, size_t count, float scale,
                            StreamHandle s) = 0;

  /// The handle another process opens to reach the device memory at `p` (cudaIpcGetMemHandle of
  /// the allocation holding it). Throws for memory that cannot be shared (e.g. stream-ordered pools).
  virtual IpcHandle ipcExport(const void* p) = 0;
  /// Maps another process's exported allocation; returns its start (add IpcHandle::offset).
  /// Handles exported by this process cannot be opened here: use the pointer itself.
  virtual void* ipcOpen(const IpcHandle& h) = 0;
  /// Unmaps what ipcOpen returned.
  virtual void ipcClose(void* base) noexcept = 0;
  /// Lets kernels on the current device use memory of `peer` (another device) by its pointers, as
  /// ranks of one process on two GPUs do. Idempotent; throws where the devices cannot.
  virtual void enablePeerAccess(int peer) = 0;

  // ---- GPUDirect RDMA: an RDMA adapter reading and writing device memory in place. ----
  /// The allocation holding device pointer `p`; false where the runtime cannot say.
  virtual bool allocationOf(const void* p, DeviceAllocation* out) {
    (void)p;
    (void)out;
    return false;
  }
  /// Whether `device` can export its memory as dma-buf files (the kernel and driver allow it).
  virtual bool dmabufSupported(int device) {
    (void)device;
    return false;
  }
  /// A dma-buf file descriptor for the device memory [p, p + bytes) (whole host pages), which the
  /// caller closes once an adapter has imported it; *offset is where p lies in it. -1 with *why
  /// set where the range cannot be exported.
  virtual int exportDmabuf(const void* p, size_t bytes, uint64_t* offset, std::string* why) {
    (void)p;
    (void)bytes;
    (void)offset;
    *why = std::string(name()) + " cannot export device memory as a dma-buf";
    return -1;
  }
};

/// The runtime in use, never started by this call: a test's (setRuntimeForTesting), else CUDA's
/// where Loom is built with CUDA, a device is present and this process already uses CUDA (its
/// driver initialised, by Loom or anyone: device/presence.hpp), else nullptr (every buffer is then
/// host memory, as it must be: device memory exists only where CUDA is in use). So host buffers
/// never make Loom start CUDA or create a context on a GPU.
DeviceRuntime* runtime();

/// runtime(), starting CUDA where it is not yet (where built with it and a device is present):
/// for tools and tests that allocate device memory through the runtime themselves.
DeviceRuntime* startRuntime();

/// Whether this process may have a CUDA device, decided without starting CUDA: exactly where CUDA
/// is in use (or a test's runtime is installed), else from the driver's device files and
/// CUDA_VISIBLE_DEVICES. The cuda_ipc transport reaches local peers where this holds.
bool devicesPresent();

/// Why runtime() gives nullptr, or startRuntime() once called, in one line ("Loom is built without
/// CUDA", "this process has not used CUDA", "no usable CUDA device or driver: ..."); "" where it
/// does not. Starts nothing.
std::string unavailableReason();

/// Installs `rt` (nullptr: back to the real one) for tests. Not thread-safe against calls in flight.
void setRuntimeForTesting(DeviceRuntime* rt);

}  // namespace device
}  // namespace loom
