// A rank process for collectives on device buffers between processes, where CUDA IPC maps the
// peers' buffers for real: `device_worker fake` installs the emulated device (whose memory is
// memfd-backed, so another process maps it as CUDA IPC would), `device_worker cuda` uses the GPU
// (exit 77, with the reason, where none is usable). Launched by loomrun. Each rank:
//   1. checks every peer is linked by cuda_ipc;
//   2. runs the collectives matrix on device buffers against the reference;
//   3. all-reduces one buffer five times: peers' buffers are mapped once, then reused (fake only);
//   4. destroys the communicator: every mapping is closed (fake only).
// Prints "device worker ok" and exits 0, or prints what failed and exits 1.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/block_pool.hpp"
#include "common/collective_check.hpp"
#include "common/fake_device.hpp"
#include "device/runtime.hpp"
#include "loom/loom.hpp"

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

}  // namespace

int main(int argc, char** argv) {
  const bool fake = argc > 1 && std::strcmp(argv[1], "fake") == 0;
  std::unique_ptr<loomtest::FakeDevice> dev;
  if (fake) {
    dev = std::make_unique<loomtest::FakeDevice>();
    loom::device::setRuntimeForTesting(dev.get());
  }
  loom::device::DeviceRuntime* rt = loom::device::runtime();
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
      for (int p = 0; p < n; ++p)
        if (p != rank && c.transportOf(p) != "cuda_ipc")
          fail("rank " + std::to_string(rank) + ": rank " + std::to_string(p) + " is linked by " + c.transportOf(p) +
               ", not cuda_ipc");
      const size_t cases = loomtest::runMatrix(c, {0, 1, 7, 1021, 70001}, fail);
      std::printf("rank %d: %zu cases on device buffers\n", rank, cases);

      // The same buffer again and again: mapped once per peer, then found in the cache.
      const size_t count = 4099;
      void* buf = buffers.alloc(count * 4);
      std::vector<float> host(count, 1.0f);
      int opensAfterFirst = 0;
      for (int round = 0; round < 5; ++round) {
        buffers.upload(buf, host.data(), count * 4);
        c.allReduce(buf, buf, count, loom::DataType::Float32, loom::ReduceOp::Sum, buffers.stream(rank));
        buffers.synchronize(buffers.stream(rank));
        std::vector<float> out(count);
        buffers.download(out.data(), buf, count * 4);
        if (out[count - 1] != static_cast<float>(n)) fail("rank " + std::to_string(rank) + ": wrong sum");
        if (round == 0 && dev) opensAfterFirst = dev->ipcOpens();
      }
      if (dev && n > 1 && dev->ipcOpens() != opensAfterFirst)
        fail("rank " + std::to_string(rank) + ": the peers' buffers were mapped again (" +
             std::to_string(dev->ipcOpens() - opensAfterFirst) + " more opens) instead of reused");
      if (dev && n > 1 && dev->ipcOpens() == 0) fail("rank " + std::to_string(rank) + ": no peer buffer was mapped");
      buffers.free(buf);
    }
    if (dev && dev->ipcCloses() != dev->ipcOpens())
      fail("rank " + std::to_string(rank) + ": " + std::to_string(dev->ipcOpens() - dev->ipcCloses()) +
           " mappings left open after the communicator was destroyed");
    if (dev && dev->ruleBreaks() > 0)
      fail("rank " + std::to_string(rank) + ": what would hang a real GPU:\n" + dev->ruleBreakReport());
    if (dev) std::printf("rank %d: %d peer buffers mapped, all closed\n", rank, dev->ipcOpens());
    loomtest::setDeviceBuffers(nullptr);
  } catch (const std::exception& e) {
    fail(std::string("rank ") + std::to_string(rank) + ": " + e.what());
  }
  if (fake) loom::device::setRuntimeForTesting(nullptr);
  if (failures > 0) return 1;
  std::printf("rank %d: device worker ok\n", rank);
  return 0;
}
