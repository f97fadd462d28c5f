// A rank process for collectives on device buffers between processes, where CUDA IPC maps the
// peers' buffers for real: `device_worker fake` installs the emulated device (whose memory is
// memfd-backed, so another process maps it as CUDA IPC would), `device_worker cuda` uses the GPU
// (exit 77, with the reason, where none is usable). Launched by loomrun. Each rank:
//   1. checks every peer is linked by cuda_ipc, and sends a ring of device messages of every size,
//      twice, through CUDA IPC (fake: the device counts no copy to or from host memory);
//   2. runs the collectives matrix on device buffers against the reference;
//   3. all-reduces one buffer five times: peers' buffers are mapped once, then reused (fake only);
//   4. destroys the communicator: every mapping is closed (fake only).
// `device_worker fake ib` (or `cuda ib`) checks GPUDirect RDMA over the ib transport instead (run
// with LOOM_TRANSPORT=ib): every link takes device buffers; a ring of device send/recv of every
// size, twice, arrives whole with no copy through host memory (fake: the device counts none) and,
// through the tests' verbs provider, every payload byte written by RDMA into device memory
// registered as a dma-buf, the second round with no new registration; then the collectives
// matrix (staged through host memory: collectives do not use GPUDirect).
// Prints "device worker ok" and exits 0, or prints what failed and exits 1.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm_impl.hpp"
#include "common/block_pool.hpp"
#include "common/collective_check.hpp"
#include "common/fake_device.hpp"
#include "device/runtime.hpp"
#include "loom/loom.hpp"
#include "verbs_provider/counters.h"

namespace {

// runCase's buffers through whichever DeviceRuntime is in use.
class RuntimeBuffers : public loomtest::DeviceBuffers {
 public:
  explicit RuntimeBuffers(loom::device::DeviceRuntime& rt) : rt_(rt), stream_(rt.createStream()) {}
  ~RuntimeBuffers() override { rt_.destroyStream(stream_); }
  void* alloc(size_t bytes) override { return pool_.take(bytes); }
  void free(void* p) override { pool_.give(p); }  // blocks kept: warm IPC mappings, no device-wide wait
  void upload(void* d, const void* h, size_t bytes) override {
    rt_.copyAsync(d, h, bytes, stream_);
    rt_.synchronize(stream_);
  }
  void download(void* h, const void* d, size_t bytes) override {
    rt_.copyAsync(h, d, bytes, stream_);
    rt_.synchronize(stream_);
  }
  void* stream(int) override { return stream_; }
  void synchronize(void* s) override { rt_.synchronize(s); }

 private:
  loom::device::DeviceRuntime& rt_;
  loom::device::StreamHandle stream_;
  loomtest::BlockPool pool_{[this](size_t bytes) { return rt_.allocDevice(bytes); },
                            [this](void* p) { rt_.freeDevice(p); }};
};

int failures = 0;
void fail(const std::string& m) {
  std::fprintf(stderr, "%s\n", m.c_str());
  ++failures;
}

// The tests' verbs provider's counters, where it is the verbs library loaded (else null).
const LoomTestVerbsCounters* providerCounters() {
  const char* lib = std::getenv("LOOM_IBVERBS_LIBRARY");
  void* h = lib != nullptr ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto fn = h != nullptr ? reinterpret_cast<const LoomTestVerbsCounters* (*)()>(dlsym(h, "loom_test_verbs_counters"))
                         : nullptr;
  return fn != nullptr ? fn() : nullptr;
}

int32_t value(int from, int round, size_t k, size_t i) {
  return static_cast<int32_t>(from * 1000003 + round * 7919 + static_cast<int>(k) * 131 + static_cast<int>(i % 10007));
}

// Device send/recv around the ring: by GPUDirect RDMA (step 1 and 2 of `ib`), or through CUDA IPC.
void deviceRing(loom::Communicator& c, RuntimeBuffers& buffers, loomtest::FakeDevice* dev, bool ib) {
  const int rank = c.rank(), n = c.size();
  const std::string me = "rank " + std::to_string(rank) + ": ";
  const std::string way = ib ? "ib" : "cuda_ipc";
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    if (c.transportOf(p) != way) fail(me + "rank " + std::to_string(p) + " is linked by " + c.transportOf(p));
    if (ib && !c.impl()->link(p).deviceBuffers)
      fail(me + "the link to rank " + std::to_string(p) + " takes no device buffer");
  }
  const size_t counts[] = {0, 1, 7, 1021, 16384, 70001, (size_t{1} << 20) + 3};
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  std::vector<void*> out, in;
  uint64_t payload = 0;
  for (size_t count : counts) {
    out.push_back(buffers.alloc(count * 4 + 4));
    in.push_back(buffers.alloc(count * 4 + 4));
    payload += count * 4;
  }
  uint64_t madeFirst = 0;
  for (int round = 0; round < 2; ++round) {
    std::vector<loom::PointToPoint> ops;
    for (size_t k = 0; k < std::size(counts); ++k) {
      std::vector<int32_t> h(counts[k]);
      for (size_t i = 0; i < counts[k]; ++i) h[i] = value(rank, round, k, i);
      buffers.upload(out[k], h.data(), h.size() * 4);
      ops.push_back({true, out[k], counts[k], loom::DataType::Int32, next, static_cast<uint32_t>(k)});
      ops.push_back({false, in[k], counts[k], loom::DataType::Int32, prev, static_cast<uint32_t>(k)});
    }
    const LoomTestVerbsCounters before = providerCounters() != nullptr ? *providerCounters() : LoomTestVerbsCounters{};
    const int copies = dev != nullptr ? dev->copies() : 0, hostCopies = dev != nullptr ? dev->hostCopies() : 0;
    loom::Work w = c.igroup(ops, buffers.stream(rank));
    w.wait();
    buffers.synchronize(buffers.stream(rank));
    if (w.bytes() != payload) fail(me + "the group's Work counts " + std::to_string(w.bytes()) + " bytes received");
    // By RDMA no copy at all; through CUDA IPC one device-to-device copy per message received.
    if (dev != nullptr && ib && dev->copies() != copies)
      fail(me + std::to_string(dev->copies() - copies) + " device copies: a message was staged through host memory");
    if (dev != nullptr && dev->hostCopies() != hostCopies)
      fail(me + std::to_string(dev->hostCopies() - hostCopies) +
           " copies to or from host memory: a message was staged through it");
    if (const LoomTestVerbsCounters* now = providerCounters()) {
      // What landed here: every byte received, by RDMA write (this process's provider).
      if (now->write_bytes - before.write_bytes < payload)
        fail(me + "only " + std::to_string(now->write_bytes - before.write_bytes) + " of " + std::to_string(payload) +
             " bytes received came by RDMA write");
      if (round == 0) madeFirst = now->dmabuf_registrations;
      if (round == 0 && madeFirst == 0) fail(me + "no device memory was registered as a dma-buf");
      if (round == 1 && now->dmabuf_registrations != madeFirst)
        fail(me + "device memory registered again in the second round");
    }
    for (size_t k = 0; k < std::size(counts); ++k) {
      std::vector<int32_t> h(counts[k]);
      buffers.download(h.data(), in[k], h.size() * 4);
      for (size_t i = 0; i < counts[k]; ++i)
        if (h[i] != value(prev, round, k, i)) {
          fail(me + "message of " + std::to_string(counts[k]) + " elements from rank " + std::to_string(prev) +
               ": element " + std::to_string(i) + " is wrong");
          break;
        }
    }
  }
  for (size_t k = 0; k < std::size(counts); ++k) buffers.free(out[k]), buffers.free(in[k]);
  std::printf("rank %d: device send/recv %s, %llu bytes a round\n", rank, ib ? "by GPUDirect RDMA" : "through CUDA IPC",
              static_cast<unsigned long long>(payload));
}

}  // namespace

int main(int argc, char** argv) {
  const bool fake = argc > 1 && std::strcmp(argv[1], "fake") == 0;
  const bool ib = argc > 2 && std::strcmp(argv[2], "ib") == 0;
  std::unique_ptr<loomtest::FakeDevice> dev;
  if (fake) {
    dev = std::make_unique<loomtest::FakeDevice>();
    loom::device::setRuntimeForTesting(dev.get());
  }
  loom::device::DeviceRuntime* rt = loom::device::startRuntime();
  if (rt == nullptr) {
    std::printf("no usable device: %s\n", loom::device::unavailableReason().c_str());
    return 77;
  }
  int rank = -1;
  try {
    RuntimeBuffers buffers(*rt);
    loomtest::setDeviceBuffers(&buffers);
    {
      loom::Communicator c = loom::Communicator::fromEnv();
      rank = c.rank();
      const int n = c.size();
      if (n > 1) deviceRing(c, buffers, dev.get(), ib);
      const size_t cases = loomtest::runMatrix(c, {0, 1, 7, 1021, 70001}, fail);
      std::printf("rank %d: %zu cases on device buffers\n", rank, cases);

      // The same buffer again and again: mapped once per peer, then found in the cache.
      const size_t count = 4099;
      void* buf = buffers.alloc(count * 4);
      std::vector<float> host(count, 1.0f);
      int opensAfterFirst = 0;
      for (int round = 0; round < (ib ? 0 : 5); ++round) {
        buffers.upload(buf, host.data(), count * 4);
        c.allReduce(buf, buf, count, loom::DataType::Float32, loom::ReduceOp::Sum, buffers.stream(rank));
        buffers.synchronize(buffers.stream(rank));
        std::vector<float> out(count);
        buffers.download(out.data(), buf, count * 4);
        if (out[count - 1] != static_cast<float>(n)) fail("rank " + std::to_string(rank) + ": wrong sum");
        if (round == 0 && dev) opensAfterFirst = dev->ipcOpens();
      }
      if (dev && n > 1 && !ib && dev->ipcOpens() != opensAfterFirst)
        fail("rank " + std::to_string(rank) + ": the peers' buffers were mapped again (" +
             std::to_string(dev->ipcOpens() - opensAfterFirst) + " more opens) instead of reused");
      if (dev && n > 1 && !ib && dev->ipcOpens() == 0)
        fail("rank " + std::to_string(rank) + ": no peer buffer was mapped");
      buffers.free(buf);
    }
    if (dev && dev->ipcCloses() != dev->ipcOpens())
      fail("rank " + std::to_string(rank) + ": " + std::to_string(dev->ipcOpens() - dev->ipcCloses()) +
           " mappings left open after the communicator was destroyed");
    if (dev && dev->ruleBreaks() > 0)
      fail("rank " + std::to_string(rank) + ": what would hang a real GPU:\n" + dev->ruleBreakReport());
    if (dev && !ib) std::printf("rank %d: %d peer buffers mapped, all closed\n", rank, dev->ipcOpens());
    loomtest::setDeviceBuffers(nullptr);
  } catch (const std::exception& e) {
    fail(std::string("rank ") + std::to_string(rank) + ": " + e.what());
  }
  if (fake) loom::device::setRuntimeForTesting(nullptr);
  if (failures > 0) return 1;
  std::printf("rank %d: device worker ok\n", rank);
  return 0;
}
