// DeviceRuntime over the CUDA runtime API (linked statically: libloom needs no CUDA library to
// load, and finds the driver, libcuda.so.1, at run time). Stream waits use the driver's stream
// memory operations (cuStreamWaitValue32, reached through cudaGetDriverEntryPointByVersion, so
// that libloom does not link libcuda) and fall back to a one-thread spin kernel where the device
// or driver refuses them.
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <mutex>
#include <set>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/status.hpp"
#include "device/runtime.hpp"
#include "kernels/reduce_cuda.hpp"

namespace loom {
namespace device {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    LOOM_THROW(ErrorCode::Cuda, -1, strFormat("%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e)));
  }
}

using WaitValueFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using AddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
using PointerAttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
using DeviceAttributeFn = CUresult (*)(int*, CUdevice_attribute, CUdevice);
using RangeHandleFn = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);

// A driver function through the runtime (no libcuda link), or nullptr where the driver lacks it.
void* driverFunction(const char* name, int version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q) == cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    return fn;
  (void)cudaGetLastError();
  return nullptr;
}

class CudaRuntime final : public DeviceRuntime {
 public:
  const char* name() const override { return "cuda"; }

  int deviceOf(const void* p) override {
    if (p == nullptr) return -1;
    cudaPointerAttributes attr{};
    cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free error state for the next call
      return -1;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
  }
  int deviceCount() override {
    int n = 0;
    check(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    return n;
  }
  int currentDevice() override {
    int d = 0;
    check(cudaGetDevice(&d), "cudaGetDevice");
    return d;
  }
  void setDevice(int device) override { check(cudaSetDevice(device), "cudaSetDevice"); }
  std::string pciBusId(int device) override {
    char id[32] = {0};
    if (cudaDeviceGetPCIBusId(id, sizeof id, device) != cudaSuccess) return std::string();
    std::string out(id);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  }

  void prepare(int device) override {
    std::lock_guard<std::mutex> lock(prepareMu_);  // a second caller waits until the kernels are in
    if (device < 0 || prepared_.count(device) != 0) return;
    int current = 0;
    check(cudaGetDevice(&current), "cudaGetDevice");
    if (current != device) setDevice(device);
    try {
      kernels::cuda::preload();
    } catch (...) {
      if (current != device) (void)cudaSetDevice(current);
      throw;
    }
    if (current != device) setDevice(current);
    prepared_.insert(device);
  }

  StreamHandle createStream() override {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }
  void destroyStream(StreamHandle s) noexcept override {
    if (s != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  bool capturing(StreamHandle s) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(s), &st), "cudaStreamIsCapturing");
    return st != cudaStreamCaptureStatusNone;
  }

  EventHandle recordEvent(StreamHandle s) override {
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaError_t r = cudaEventRecord(e, static_cast<cudaStream_t>(s));
    if (r != cudaSuccess) {
      (void)cudaEventDestroy(e);
      check(r, "cudaEventRecord");
    }
    return e;
  }
  bool eventDone(EventHandle e) override {
    cudaError_t r = cudaEventQuery(static_cast<cudaEvent_t>(e));
    if (r == cudaErrorNotReady) return false;
    check(r, "cudaEventQuery");
    return true;
  }
  void destroyEvent(EventHandle e) noexcept override {
    if (e != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }

  void copyAsync(void* dst, const void* src, size_t bytes, StreamHandle s) override {
    if (bytes == 0) return;
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(s)), "cudaMemcpyAsync");
  }
  void copy2DAsync(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows,
                   StreamHandle s) override {
    if (width == 0 || rows == 0) return;
    check(cudaMemcpy2DAsync(dst, dstPitch, src, srcPitch, width, rows, cudaMemcpyDefault, static_cast<cudaStream_t>(s)),
          "cudaMemcpy2DAsync");
  }

  void* allocDevice(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cudaMalloc");
    return p;
  }
  void freeDevice(void* p) noexcept override {
    if (p != nullptr) (void)cudaFree(p);
  }
  void synchronize(StreamHandle s) override {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(s)), "cudaStreamSynchronize");
  }

  void* allocPinned(size_t bytes) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
    std::memset(p, 0, bytes);
    return p;
  }
  void freePinned(void* p) noexcept override {
    if (p != nullptr) (void)cudaFreeHost(p);
  }

  void waitValue(StreamHandle s, volatile uint32_t* flag, uint32_t value) override {
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, const_cast<uint32_t*>(flag), 0), "cudaHostGetDevicePointer");
    if (WaitValueFn fn = waitValueFn()) {
      CUresult r = fn(static_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(dev), value, CU_STREAM_WAIT_VALUE_GEQ);
      if (r == CUDA_SUCCESS) return;
      if (r != CUDA_ERROR_NOT_SUPPORTED) {
        LOOM_THROW(ErrorCode::Cuda, -1, strFormat("cuStreamWaitValue32 failed: CUresult %d", static_cast<int>(r)));
      }
      LOOM_INFO("cuStreamWaitValue32 is not supported here: streams wait on a spin kernel instead");
      useSpin_.store(true);
    }
    kernels::cuda::spinWait(static_cast<volatile uint32_t*>(dev), value, s);
  }
  std::string waitMechanism() override {
    return waitValueFn() != nullptr ? "stream memory operations (cuStreamWaitValue32)"
                                    : "a spin kernel on mapped host memory";
  }

  void reduceAsync(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op, int divisor,
                   StreamHandle s) override {
    if (count == 0 || n < 1) return;
    constexpr int kMax = kernels::cuda::kMaxInputs;
    const int first = std::min(n, kMax);
    kernels::cuda::reduceN(dst, srcs, first, count, type, op, first == n ? divisor : 1, s);
    // More inputs than one kernel reads: fold them in, kMax - 1 at a time, onto dst.
    for (int i = first; i < n; i += kMax - 1) {
      const void* more[kMax];
      more[0] = dst;
      const int m = std::min(kMax - 1, n - i);
      for (int j = 0; j < m; ++j) more[j + 1] = srcs[i + j];
      kernels::cuda::reduceN(dst, more, m + 1, count, type, op, i + m == n ? divisor : 1, s);
    }
  }

  void reduceCanonicalAsync(void* dst, const void* const* srcs, int n, size_t count, DataType type, ReduceOp op,
                            StreamHandle s) override {
    kernels::cuda::reduceCanonicalN(dst, srcs, n, count, type, op, s);
  }

  void convertAsync(void* dst, DataType dstType, const void* src, DataType srcType, size_t count, float scale,
                    StreamHandle s) override {
    kernels::cuda::convert(dst, dstType, src, srcType, count, scale, s);
  }

  IpcHandle ipcExport(const void* p) override {
    static auto range = reinterpret_cast<AddressRangeFn>(driverFunction("cuMemGetAddressRange", 3020));
    if (range == nullptr) LOOM_THROW(ErrorCode::Cuda, -1, "the CUDA driver has no cuMemGetAddressRange");
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = range(&base, &size, reinterpret_cast<CUdeviceptr>(p));
    if (r != CUDA_SUCCESS) {
      LOOM_THROW(ErrorCode::Cuda, -1,
                 strFormat("cuMemGetAddressRange failed for %p: CUresult %d", p, static_cast<int>(r)));
    }
    cudaIpcMemHandle_t h{};
    cudaError_t e = cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      LOOM_THROW(ErrorCode::Cuda, -1,
                 strFormat("cudaIpcGetMemHandle failed for the allocation holding %p: %s (%s); memory from "
                           "cudaMallocAsync pools or cuMemCreate cannot be shared this way",
                           p, cudaGetErrorString(e), cudaGetErrorName(e)));
    }
    IpcHandle out;
    static_assert(sizeof(h) == IpcHandle::kBytes, "cudaIpcMemHandle_t is 64 bytes");
    std::memcpy(out.bytes, &h, sizeof(h));
    out.offset = reinterpret_cast<uintptr_t>(p) - static_cast<uintptr_t>(base);
    return out;
  }
  bool allocationOf(const void* p, DeviceAllocation* out) override {
    static auto range = reinterpret_cast<AddressRangeFn>(driverFunction("cuMemGetAddressRange", 3020));
    static auto attribute = reinterpret_cast<PointerAttributeFn>(driverFunction("cuPointerGetAttribute", 4000));
    if (range == nullptr || attribute == nullptr) return false;
    CUdeviceptr base = 0;
    size_t size = 0;
    unsigned long long id = 0;
    const auto ptr = reinterpret_cast<CUdeviceptr>(p);
    if (range(&base, &size, ptr) != CUDA_SUCCESS || attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CUDA_SUCCESS)
      return false;
    out->base = static_cast<uintptr_t>(base);
    out->bytes = size;
    out->id = id;
    return true;
  }
  bool dmabufSupported(int device) override {
    static auto attribute = reinterpret_cast<DeviceAttributeFn>(driverFunction("cuDeviceGetAttribute", 2000));
    static auto handle = driverFunction("cuMemGetHandleForAddressRange", 11070);
    int v = 0;
    return attribute != nullptr && handle != nullptr &&
           attribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, device) == CUDA_SUCCESS && v == 1;
  }
  int exportDmabuf(const void* p, size_t bytes, uint64_t* offset, std::string* why) override {
    static auto handle = reinterpret_cast<RangeHandleFn>(driverFunction("cuMemGetHandleForAddressRange", 11070));
    if (handle == nullptr) {
      *why = "the CUDA driver has no cuMemGetHandleForAddressRange (it needs CUDA 11.7 or later)";
      return -1;
    }
    // The driver exports whole host pages; device allocations are aligned far more coarsely.
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto a = reinterpret_cast<uintptr_t>(p);
    const uintptr_t start = a & ~(page - 1);
    const size_t length = (a + bytes - start + page - 1) & ~(page - 1);
    int fd = -1;
    const CUresult r = handle(&fd, static_cast<CUdeviceptr>(start), length, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS) {
      *why = strFormat("cuMemGetHandleForAddressRange failed for %zu bytes at %p: CUresult %d", length,
                       reinterpret_cast<void*>(start), static_cast<int>(r));
      return -1;
    }
    *offset = a - start;
    return fd;
  }
  void* ipcOpen(const IpcHandle& h) override {
    cudaIpcMemHandle_t handle{};
    std::memcpy(&handle, h.bytes, sizeof(handle));
    void* p = nullptr;
    cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      LOOM_THROW(ErrorCode::Cuda, -1,
                 strFormat("cudaIpcOpenMemHandle failed: %s (%s); the peer's GPU may not be visible to this "
                           "process (CUDA_VISIBLE_DEVICES), or peer access is impossible; LOOM_TRANSPORT=^cuda_ipc "
                           "stages through host memory instead",
                           cudaGetErrorString(e), cudaGetErrorName(e)));
    }
    return p;
  }
  void ipcClose(void* base) noexcept override {
    if (base != nullptr) (void)cudaIpcCloseMemHandle(base);
  }
  void enablePeerAccess(int peer) override {
    if (peer == currentDevice()) return;
    cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      LOOM_THROW(ErrorCode::Cuda, -1,
                 strFormat("cudaDeviceEnablePeerAccess(%d) failed: %s (%s); the GPUs cannot reach each other's "
                           "memory: LOOM_TRANSPORT=^cuda_ipc stages through host memory instead",
                           peer, cudaGetErrorString(e), cudaGetErrorName(e)));
    }
  }

 private:
  WaitValueFn waitValueFn() {
    if (useSpin_.load()) return nullptr;
    std::call_once(fnOnce_, [this] {
      fn_ = reinterpret_cast<WaitValueFn>(driverFunction("cuStreamWaitValue32", 12000));
      if (fn_ == nullptr) useSpin_.store(true);
    });
    return useSpin_.load() ? nullptr : fn_;
  }
  std::mutex prepareMu_;
  std::set<int> prepared_;  // devices whose context holds the kernels
  std::once_flag fnOnce_;
  WaitValueFn fn_ = nullptr;
  std::atomic<bool> useSpin_{false};
};

}  // namespace

// The runtime when a device is usable, else nullptr with the reason in `why`. Probed once.
DeviceRuntime* cudaRuntime(std::string* why) {
  static std::string reason;
  static DeviceRuntime* rt = []() -> DeviceRuntime* {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      reason = strFormat("no usable CUDA device or driver: cudaGetDeviceCount says %s (%s)", cudaGetErrorString(e),
                         cudaGetErrorName(e));
      (void)cudaGetLastError();
      return nullptr;
    }
    if (n == 0) {
      reason = "no CUDA device: cudaGetDeviceCount found none";
      return nullptr;
    }
    return new CudaRuntime();  // lives as long as the process: CUDA work may run until exit
  }();
  if (rt == nullptr && why != nullptr) *why = reason;
  return rt;
}

}  // namespace device
}  // namespace loom
