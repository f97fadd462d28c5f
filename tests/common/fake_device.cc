#include "fake_device.hpp"

#include <cstdlib>
#include <cstring>

namespace loomtest {
namespace {
// A stream wait holds its stream at most this long, then gives up and counts as stuck.
constexpr auto kWaitLimit = std::chrono::seconds(60);
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
  for (auto& [p, n] : allocs_) std::free(reinterpret_cast<void*>(p));
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

void* FakeDevice::alloc(size_t bytes) {
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  std::memset(p, 0xA5, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  allocs_[reinterpret_cast<uintptr_t>(p)] = bytes == 0 ? 1 : bytes;
  return p;
}

void FakeDevice::free(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.find(reinterpret_cast<uintptr_t>(p));
  if (it == allocs_.end()) return;
  allocs_.erase(it);
  std::free(p);
}

int FakeDevice::deviceOf(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocs_.upper_bound(a);
  if (it == allocs_.begin()) return -1;
  --it;
  return a < it->first + it->second ? 0 : -1;
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
  enqueue(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}

void FakeDevice::copy2DAsync(void* dst, size_t dstPitch, const void* src, size_t srcPitch, size_t width, size_t rows,
                             loom::device::StreamHandle s) {
  if (width == 0 || rows == 0) return;
  enqueue(s, [=] {
    for (size_t r = 0; r < rows; ++r)
      std::memmove(static_cast<uint8_t*>(dst) + r * dstPitch, static_cast<const uint8_t*>(src) + r * srcPitch, width);
  });
}

void* FakeDevice::allocPinned(size_t bytes) { return std::calloc(1, bytes == 0 ? 1 : bytes); }
void FakeDevice::freePinned(void* p) noexcept { std::free(p); }

void FakeDevice::waitValue(loom::device::StreamHandle s, volatile uint32_t* flag, uint32_t value) {
  enqueue(s, [this, flag, value] {
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
