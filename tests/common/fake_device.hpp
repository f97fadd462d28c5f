// An emulated GPU for tests on machines without one: a DeviceRuntime whose "device memory" is
// host memory it hands out (and recognises), whose streams are threads running their queued work
// in order, whose events complete when their stream reaches them, and whose stream waits really
// hold the stream until the host stores the flag. It checks the stream-ordered staging logic of
// Loom's device collectives (ordering, overlap, release on failure) exactly as the CUDA runtime
// would drive it; the CUDA kernels and copies themselves are tested by the gpu suite.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/runtime.hpp"

namespace loomtest {

class FakeDevice final : public loom::device::DeviceRuntime {
 public:
  FakeDevice();
  ~FakeDevice() override;

  // ---- What tests use. ----
  /// "Device memory" of `bytes` (filled with 0xA5), recognised by deviceOf until freed. `pooled`:
  /// as from a stream-ordered pool (cudaMallocAsync), which ipcExport refuses as CUDA does.
  void* alloc(size_t bytes, bool pooled = false);
  void free(void* p);
  /// Queues `fn` on stream `s` (a "kernel"): it runs after everything queued before it.
  void launch(loom::device::StreamHandle s, std::function<void()> fn);
  /// Waits until every op queued on `s` so far has run.
  void synchronize(loom::device::StreamHandle s) override;
  /// Makes `s` report that it is being captured into a graph.
  void setCapturing(loom::device::StreamHandle s, bool on);
  /// Stream waits that gave up (held longer than their limit): each is a stream Loom never released.
  int stuckWaits() const { return stuck_.load(); }
  /// Peer allocations mapped by ipcOpen so far, and unmapped by ipcClose.
  int ipcOpens() const { return opens_.load(); }
  int ipcCloses() const { return closes_.load(); }
  /// Buffers exported for CUDA IPC, and n-input reductions queued (the IPC path's; staging reduces on the host).
  int ipcExports() const { return exports_.load(); }
  int reductions() const { return reductions_.load(); }
  /// Of which canonical (reproducible mode's; reduceCanonicalAsync).
  int canonicalReductions() const { return canonicalReductions_.load(); }
  /// Copies queued (copyAsync, copy2DAsync): staging through host memory makes them.
  int copies() const { return copies_.load(); }
  /// Those of them to or from host memory: staging (device to device copies are not counted).
  int hostCopies() const { return hostCopies_.load(); }
  /// dma-buf files handed out by exportDmabuf.
  int dmabufExports() const { return dmabufExports_.load(); }
  /// What dmabufSupported says (true: as on a GPU and kernel that export dma-bufs).
  bool dmabuf = true;
  /// Breaks of two rules that CUDA enforces by hanging, which this device only counts: a kernel
  /// launched before prepare() (CUDA loads kernels lazily, and the load waits for held streams),
  /// and device or pinned memory freed through the runtime while a stream is held, that stayed held
  /// (freeDevice and freePinned wait for the streams held before them, as cudaFree and
  /// cudaFreeHost wait for the device, and give up after 10 s). What happened, one line each.
  int ruleBreaks() const;
  std::string ruleBreakReport() const;

  // ---- DeviceRuntime. ----
  const char* name() const override { return "fake"; }
  int deviceOf(const void* p) override;
  int deviceCount() override { return 1; }
  int currentDevice() override { return 0; }
  void setDevice(int) override {}
  std::string pciBusId(int) override { return busId; }
  /// What pciBusId says ("": unknown, as the default runtime says).
  std::string busId;
  void prepare(int) override { prepared_.store(true); }
  loom::device::StreamHandle createStream() override;
  void destroyStream(loom::device::StreamHandle s) noexcept override;
  bool capturing(loom::device::StreamHandle s) override;
  loom::device::EventHandle recordEvent(loom::device::StreamHandle s) override;
  bool eventDone(loom::device::EventHandle e) override;
  void destroyEvent(loom::device::EventHandle e) noexcept override;
  void copyAsync(void* dst, const void* src, size_t bytes, loom::device::StreamHandle s) override;
  void copy2DAsync(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows,
                   loom::device::StreamHandle s) override;
  void* allocDevice(size_t bytes) override { return alloc(bytes); }
  void freeDevice(void* p) noexcept override;
  void* allocPinned(size_t bytes) override;
  void freePinned(void* p) noexcept override;
  void waitValue(loom::device::StreamHandle s, volatile uint32_t* flag, uint32_t value) override;
  std::string waitMechanism() override { return "emulated"; }
  void reduceCanonicalAsync(void* dst, const void* const* srcs, int n, size_t count, loom::DataType type,
                            loom::ReduceOp op, loom::device::StreamHandle s) override;
  void reduceAsync(void* dst, const void* const* srcs, int n, size_t count, loom::DataType type, loom::ReduceOp op,
                   int divisor, loom::device::StreamHandle s) override;
  void convertAsync(void* dst, loom::DataType dstType, const void* src, loom::DataType srcType, size_t count,
                    float scale, loom::device::StreamHandle s) override;
  /// Handles name the allocation's memfd in the exporting process: another process maps it
  /// through /proc/<pid>/fd, so that CUDA IPC's cross-process path runs for real.
  loom::device::IpcHandle ipcExport(const void* p) override;
  void* ipcOpen(const loom::device::IpcHandle& h) override;
  void ipcClose(void* base) noexcept override;
  void enablePeerAccess(int) override {}
  /// Allocations are told apart by a serial number, as CUDA's by their buffer ids.
  bool allocationOf(const void* p, loom::device::DeviceAllocation* out) override;
  bool dmabufSupported(int) override { return dmabuf; }
  /// A duplicate of the allocation's memfd: what a real driver's dma-buf is to an adapter.
  int exportDmabuf(const void* p, size_t bytes, uint64_t* offset, std::string* why) override;

 private:
  struct Stream {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> ops;
    bool busy = false, stop = false, capturing = false;
    std::thread worker;
  };
  Stream& streamOf(loom::device::StreamHandle s);
  void enqueue(loom::device::StreamHandle s, std::function<void()> fn);
  static void run(Stream* st);

  struct Alloc {
    size_t bytes = 0;
    int fd = -1;  // the memfd behind it
    uint64_t serial = 0;
    bool pooled = false;
  };
  std::mutex mu_;
  std::map<uintptr_t, Alloc> allocs_;  // start -> allocation
  std::map<void*, size_t> opened_;     // ipcOpen mappings -> bytes
  std::atomic<int> opens_{0}, closes_{0}, exports_{0}, reductions_{0}, copies_{0}, hostCopies_{0}, dmabufExports_{0};
  std::atomic<int> canonicalReductions_{0};
  std::map<void*, std::shared_ptr<std::atomic<bool>>> events_;
  std::unique_ptr<Stream> default_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::atomic<int> stuck_{0};
  // The rules of ruleBreaks().
  void noteBreak(const std::string& what) const;
  void waitLikeCudaFree(const char* what) const;
  std::atomic<bool> prepared_{false};
  mutable std::mutex rulesMu_;
  std::map<uint64_t, std::pair<volatile uint32_t*, uint32_t>> pendingWaits_;  // id -> flag, value
  uint64_t nextWait_ = 0;
  mutable std::vector<std::string> breaks_;
};

}  // namespace loomtest
