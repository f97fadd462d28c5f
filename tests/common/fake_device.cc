#include "fake_device.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/reduce.hpp"
#include "loom/loom.hpp"

namespace loomtest {
namespace {
// A stream wait holds its stream at most this long, then gives up and counts as stuck.
constexpr auto kWaitLimit = std::chrono::seconds(60);
// How long a free through the runtime waits for the streams held before it (see waitLikeCudaFree).
constexpr auto kFreeWaitLimit = std::chrono::seconds(10);

// What a fake IPC handle holds.
struct FakeHandle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
  uint64_t serial;  // unique per allocation, as CUDA's handles are (fd numbers are reused)
};
constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'F', 'A', 'K', 'E'};
static_assert(sizeof(FakeHandle) <= loom::device::IpcHandle::kBytes, "fits a handle");

[[noreturn]] void fail(const std::string& what) {
  throw loom::Error(loom::ErrorCode::Cuda, "fake device: " + what + ": " + std::strerror(errno));
}
}  // namespace

FakeDevice::FakeDevice() : default_(std::make_unique<Stream>()) { default_->worker = std::thread(run, default_.get()); }

FakeDevice::~FakeDevice() {
  auto stop = [](Stream& s) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.stop = true;
    }
    s.cv.notify_all();
    if (s.worker.joinable()) s.worker.join();
  };
  stop(*default_);
  for (auto& s : streams_)
    if (s) stop(*s);
  for (auto& [p, a] : allocs_) {
    munmap(reinterpret_cast<void*>(p), a.bytes);
    close(a.fd);
  }
  for (auto& [p, n] : opened_) munmap(p, n);
}

void FakeDevice::run(Stream* st) {
  std::unique_lock<std::mutex> lock(st->mu);
  for (;;) {
    st->cv.wait(lock, [st] { return st->stop || !st->ops.empty(); });
    if (st->ops.empty()) return;  // stopping, nothing left
    auto fn = std::move(st->ops.front());
    st->ops.pop_front();
    st->busy = true;
    lock.unlock();
    fn();
    lock.lock();
    st->busy = false;
    st->cv.notify_all();
  }
}

void* FakeDevice::alloc(size_t bytes, bool pooled) {
  Alloc a;
  a.pooled = pooled;
  static std::atomic<uint64_t> serials{0};
  a.serial = ++serials;
  a.bytes = bytes == 0 ? 1 : bytes;
  a.fd = memfd_create("loom-fake-device", MFD_CLOEXEC);
  if (a.fd < 0) fail("memfd_create");
  if (ftruncate(a.fd, static_cast<off_t>(a.bytes)) != 0) {
    close(a.fd);
    fail("ftruncate");
  }
  void* p = mmap(nullptr, a.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
  if (p == MAP_FAILED) {
    close(a.fd);
    fail("mmap");
  }
  std::memset(p, 0xA5, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  allocs_[reinterpret_cast<uintptr_t>(p)] = a;
  return p;
}

void FakeDevice::free(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs_.end()) return;
  munmap(p, it->second.bytes);
  close(it->second.fd);
  allocs_.erase(it);
}

bool FakeDevice::allocationOf(const void* p, loom::device::DeviceAllocation* out) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.upper_bound(a);
  if (it == allocs_.begin() || a >= std::prev(it)->first + std::prev(it)->second.bytes) return false;
  --it;
  out->base = it->first;
  out->bytes = it->second.bytes;
  out->id = it->second.serial;
  return true;
}

int FakeDevice::exportDmabuf(const void* p, size_t bytes, uint64_t* offset, std::string* why) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.upper_bound(a);
  if (it == allocs_.begin() || a >= std::prev(it)->first + std::prev(it)->second.bytes) {
    *why = "fake device: exportDmabuf of memory it did not allocate";
    return -1;
  }
  --it;
  if (a + bytes > it->first + it->second.bytes) {
    *why = "fake device: exportDmabuf of a range past its allocation's end";
    return -1;
  }
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    *why = std::string("fake device: dup: ") + std::strerror(errno);
    return -1;
  }
  dmabufExports_++;
  *offset = a - it->first;
  return fd;
}

int FakeDevice::deviceOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto check = [a](const auto& m) {
    auto it = m.upper_bound(a);
    if (it == m.begin()) return false;
    --it;
    return a < it->first + it->second.bytes;
  };
  if (check(allocs_)) return 0;
  for (const auto& [q, n] : opened_) {  // a peer's memory, mapped by ipcOpen
    const auto b = reinterpret_cast<uintptr_t>(q);
    if (a >= b && a < b + n) return 0;
  }
  return -1;
}

void FakeDevice::noteBreak(const std::string& what) const {
  std::lock_guard<std::mutex> lock(rulesMu_);
  if (breaks_.size() < 20) breaks_.push_back(what);
}

int FakeDevice::ruleBreaks() const {
  std::lock_guard<std::mutex> lock(rulesMu_);
  return static_cast<int>(breaks_.size());
}

std::string FakeDevice::ruleBreakReport() const {
  std::lock_guard<std::mutex> lock(rulesMu_);
  std::string out;
  for (const auto& b : breaks_) out += b + "\n";
  return out;
}

void FakeDevice::waitLikeCudaFree(const char* what) const {
  // cudaFree and cudaFreeHost wait for the work queued on the device before them: here, for the
  // stream waits pending now. One that is still held after the limit would never have let go.
  auto held = [this](uint64_t upTo) {
    std::lock_guard<std::mutex> lock(rulesMu_);
    for (const auto& [id, w] : pendingWaits_)
      if (id < upTo &&
          static_cast<int32_t>(__atomic_load_n(const_cast<uint32_t*>(w.first), __ATOMIC_ACQUIRE) - w.second) < 0)
        return true;
    return false;
  };
  uint64_t upTo = 0;
  {
    std::lock_guard<std::mutex> lock(rulesMu_);
    upTo = nextWait_;
  }
  const auto limit = std::chrono::steady_clock::now() + kFreeWaitLimit;
  while (held(upTo)) {
    if (std::chrono::steady_clock::now() > limit) {
      noteBreak(std::string(what) + " while a stream stayed held: cudaFree would have waited for it forever");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void FakeDevice::freeDevice(void* p) noexcept {
  if (p == nullptr) return;
  waitLikeCudaFree("device memory freed through the runtime");
  free(p);
}

void FakeDevice::reduceAsync(void* dst, const void* const* srcs, int n, size_t count, loom::DataType type,
                             loom::ReduceOp op, int divisor, loom::device::StreamHandle s) {
  if (count == 0 || n < 1) return;
  if (!prepared_.load()) noteBreak("a reduction kernel launched before DeviceRuntime::prepare");
  ++reductions_;
  std::vector<const void*> in(srcs, srcs + n);
  enqueue(s, [dst, in, count, type, op, divisor] {
    // Into a temporary first: dst may be any of the inputs, as the CUDA kernel allows.
    const size_t bytes = count * loom::sizeOf(type);
    std::vector<uint8_t> acc(bytes);
    std::memcpy(acc.data(), in[0], bytes);
    for (size_t i = 1; i < in.size(); ++i) loom::kernels::reduce(acc.data(), acc.data(), in[i], count, type, op);
    if (divisor > 1) loom::kernels::divide(acc.data(), count, type, divisor);
    std::memcpy(dst, acc.data(), bytes);
  });
}

void FakeDevice::reduceCanonicalAsync(void* dst, const void* const* srcs, int n, size_t count, loom::DataType type,
                                      loom::ReduceOp op, loom::device::StreamHandle s) {
  if (count == 0 || n < 1) return;
  if (!prepared_.load()) noteBreak("a reduction kernel launched before DeviceRuntime::prepare");
  if (n > loom::device::kMaxCanonicalInputs) noteBreak("a canonical reduction of more inputs than the device takes");
  ++reductions_;
  ++canonicalReductions_;
  std::vector<const void*> in(srcs, srcs + n);
  enqueue(s, [dst, in, count, type, op] {
    loom::kernels::reduceCanonical(dst, in.data(), static_cast<int>(in.size()), count, type, op);
  });
}

void FakeDevice::convertAsync(void* dst, loom::DataType dstType, const void* src, loom::DataType srcType, size_t count,
                              float scale, loom::device::StreamHandle s) {
  if (!prepared_.load()) noteBreak("a conversion kernel launched before DeviceRuntime::prepare");
  using loom::DataType;
  const bool toHalf = srcType == DataType::Float32 && (dstType == DataType::Float16 || dstType == DataType::Bfloat16);
  const bool fromHalf = dstType == DataType::Float32 && (srcType == DataType::Float16 || srcType == DataType::Bfloat16);
  if (!toHalf && !fromHalf) {
    errno = EINVAL;
    fail("convertAsync between other types than float32 and a half");
  }
  enqueue(s, [=] {
    namespace k = loom::kernels;
    for (size_t i = 0; i < count; ++i) {
      if (toHalf) {
        const float v = static_cast<const float*>(src)[i] * scale;
        static_cast<uint16_t*>(dst)[i] = dstType == DataType::Float16 ? k::floatToFp16(v) : k::floatToBf16(v);
      } else {
        const uint16_t h = static_cast<const uint16_t*>(src)[i];
        static_cast<float*>(dst)[i] = (srcType == DataType::Float16 ? k::fp16ToFloat(h) : k::bf16ToFloat(h)) * scale;
      }
    }
  });
}

loom::device::IpcHandle FakeDevice::ipcExport(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.upper_bound(a);
  if (it == allocs_.begin() || a >= std::prev(it)->first + std::prev(it)->second.bytes) {
    errno = EINVAL;
    fail("ipcExport of memory it did not allocate");
  }
  --it;
  if (it->second.pooled) {
    errno = EINVAL;  // cudaIpcGetMemHandle on a pool's memory: cudaErrorInvalidValue
    fail("ipcExport of memory from a stream-ordered pool");
  }
  FakeHandle f{};
  std::memcpy(f.magic, kMagic, sizeof(kMagic));
  f.pid = static_cast<int32_t>(getpid());
  f.fd = it->second.fd;
  f.bytes = it->second.bytes;
  f.serial = it->second.serial;
  loom::device::IpcHandle h;
  std::memcpy(h.bytes, &f, sizeof(f));
  h.offset = a - it->first;
  ++exports_;
  return h;
}

void* FakeDevice::ipcOpen(const loom::device::IpcHandle& h) {
  FakeHandle f{};
  std::memcpy(&f, h.bytes, sizeof(f));
  if (std::memcmp(f.magic, kMagic, sizeof(kMagic)) != 0) {
    errno = EINVAL;
    fail("ipcOpen of a handle it did not make");
  }
  if (f.pid == static_cast<int32_t>(getpid())) {
    errno = EINVAL;  // as CUDA: a process cannot open its own handles
    fail("ipcOpen of a handle exported by this process");
  }
  const std::string path = "/proc/" + std::to_string(f.pid) + "/fd/" + std::to_string(f.fd);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) fail("open " + path);
  void* p = mmap(nullptr, f.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) fail("mmap " + path);
  std::lock_guard<std::mutex> lock(mu_);
  opened_[p] = f.bytes;
  ++opens_;
  return p;
}

void FakeDevice::ipcClose(void* base) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = opened_.find(base);
  if (it == opened_.end()) return;
  munmap(base, it->second);
  opened_.erase(it);
  ++closes_;
}

FakeDevice::Stream& FakeDevice::streamOf(loom::device::StreamHandle s) {
  return s == nullptr ? *default_ : *static_cast<Stream*>(s);
}

loom::device::StreamHandle FakeDevice::createStream() {
  auto s = std::make_unique<Stream>();
  s->worker = std::thread(run, s.get());
  std::lock_guard<std::mutex> lock(mu_);
  streams_.push_back(std::move(s));
  return streams_.back().get();
}

void FakeDevice::destroyStream(loom::device::StreamHandle h) noexcept {
  std::unique_ptr<Stream> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& s : streams_)
      if (s.get() == h) gone = std::move(s);
  }
  if (!gone) return;
  {
    std::lock_guard<std::mutex> lock(gone->mu);
    gone->stop = true;
  }
  gone->cv.notify_all();
  gone->worker.join();
}

void FakeDevice::enqueue(loom::device::StreamHandle s, std::function<void()> fn) {
  Stream& st = streamOf(s);
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.ops.push_back(std::move(fn));
  }
  st.cv.notify_all();
}

void FakeDevice::launch(loom::device::StreamHandle s, std::function<void()> fn) { enqueue(s, std::move(fn)); }

void FakeDevice::synchronize(loom::device::StreamHandle s) {
  Stream& st = streamOf(s);
  std::unique_lock<std::mutex> lock(st.mu);
  st.cv.wait(lock, [&st] { return st.ops.empty() && !st.busy; });
}

void FakeDevice::setCapturing(loom::device::StreamHandle s, bool on) { streamOf(s).capturing = on; }
bool FakeDevice::capturing(loom::device::StreamHandle s) { return streamOf(s).capturing; }

loom::device::EventHandle FakeDevice::recordEvent(loom::device::StreamHandle s) {
  auto e = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_[e.get()] = e;
  }
  enqueue(s, [e] { e->store(true, std::memory_order_release); });
  return e.get();
}
bool FakeDevice::eventDone(loom::device::EventHandle e) {
  return static_cast<std::atomic<bool>*>(e)->load(std::memory_order_acquire);
}
// As cudaEventDestroy, it may come before the stream reaches the event: the queued op keeps it.
void FakeDevice::destroyEvent(loom::device::EventHandle e) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  events_.erase(e);
}

void FakeDevice::copyAsync(void* dst, const void* src, size_t bytes, loom::device::StreamHandle s) {
  if (bytes == 0) return;
  copies_++;
  if (deviceOf(dst) < 0 || deviceOf(src) < 0) hostCopies_++;
  enqueue(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

void FakeDevice::copy2DAsync(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows,
                             loom::device::StreamHandle s) {
  if (width == 0 || rows == 0) return;
  copies_++;
  if (deviceOf(dst) < 0 || deviceOf(src) < 0) hostCopies_++;
  enqueue(s, [=] {
    for (size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<uint8_t*>(dst) + r * dstPitch, static_cast<const uint8_t*>(src) + r * srcPitch, width);
  });
}

void* FakeDevice::allocPinned(size_t bytes) { return std::calloc(1, bytes == 0 ? 1 : bytes); }
void FakeDevice::freePinned(void* p) noexcept {
  if (p == nullptr) return;
  waitLikeCudaFree("pinned memory freed through the runtime");
  std::free(p);
}

void FakeDevice::waitValue(loom::device::StreamHandle s, volatile uint32_t* flag, uint32_t value) {
  uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(rulesMu_);
    id = nextWait_++;
    pendingWaits_.emplace(id, std::make_pair(flag, value));
  }
  enqueue(s, [this, flag, value, id] {
    struct Done {
      FakeDevice* d;
      uint64_t id;
      ~Done() {
        std::lock_guard<std::mutex> lock(d->rulesMu_);
        d->pendingWaits_.erase(id);
      }
    } done{this, id};
    const auto limit = std::chrono::steady_clock::now() + kWaitLimit;
    while (static_cast<int32_t>(__atomic_load_n(const_cast<uint32_t*>(flag), __ATOMIC_ACQUIRE) - value) < 0) {
      if (std::chrono::steady_clock::now() > limit) {
        stuck_.fetch_add(1);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
}

}  // namespace loomtest
