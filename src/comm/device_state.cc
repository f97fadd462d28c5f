// Shared machinery of stream-ordered device operations (see device_state.hpp).
#include "comm/device_state.hpp"

#include <chrono>
#include <thread>
#include <vector>

#include "core/format.hpp"
#include "core/status.hpp"

namespace loom {
namespace detail {
namespace {

// Completion flags: 32-bit words in mapped host memory, one per communicator. Never freed: a
// stream may still read its flag after the communicator is gone (it was released before).
struct FlagPool {
  std::mutex mu;
  std::map<device::DeviceRuntime*, std::vector<volatile uint32_t*>> freeByRuntime;
  std::vector<void*> pages;  // every page handed out, so that it stays reachable (leak checkers)
  static FlagPool& get() {
    static auto* p = new FlagPool();  // process lifetime, like the flags
    return *p;
  }
  volatile uint32_t* take(device::DeviceRuntime& rt) {
    std::lock_guard<std::mutex> lock(mu);
    auto& free = freeByRuntime[&rt];
    if (free.empty()) {
      constexpr size_t kPerPage = 64;  // one cache line apart each
      auto* page = static_cast<uint32_t*>(rt.allocPinned(kPerPage * 64));
      pages.push_back(page);
      for (size_t i = 0; i < kPerPage; ++i) free.push_back(page + i * 16);
    }
    volatile uint32_t* f = free.back();
    free.pop_back();
    return f;
  }
};

}  // namespace

DeviceState::DeviceState(device::DeviceRuntime& rt) : rt_(rt), flag_(FlagPool::get().take(rt)) {
  issued_ = released_ = *flag_;
}

DeviceState::~DeviceState() {
  releaseAll();
  for (auto& [dev, s] : streams_) {
    rt_.destroyStream(s.d2h);
    rt_.destroyStream(s.h2d);
  }
  for (auto& slot : slots_) rt_.freePinned(slot.mem);
  for (auto& scratch : scratch_) rt_.freeDevice(scratch.mem);
  for (auto& [mem, pinned] : retired_) pinned ? rt_.freePinned(mem) : rt_.freeDevice(mem);
}

void DeviceState::release(uint32_t token) {
  std::lock_guard<std::mutex> lock(relMu_);
  if (static_cast<int32_t>(token - released_) <= 0) return;
  released_ = token;
  // A sequentially consistent store: everything before it (the copies back) is visible first.
  __atomic_store_n(const_cast<uint32_t*>(flag_), token, __ATOMIC_SEQ_CST);
}

void DeviceState::releaseAll() {
  std::lock_guard<std::mutex> lock(callMu_);
  release(issued_);
}

DeviceState::Streams& DeviceState::streams(int dev) {
  auto it = streams_.find(dev);
  if (it != streams_.end()) return it->second;
  Streams s;
  s.d2h = rt_.createStream();
  s.h2d = rt_.createStream();
  return streams_.emplace(dev, s).first->second;
}

uint8_t* DeviceState::grow(Slot& s, size_t bytes, bool pinned) {
  if (s.bytes < bytes) {
    // The old block is kept until the state goes: cudaFree and cudaFreeHost wait for the whole
    // device, and the caller's stream is held for the very operation asking (it would never return).
    // Sizes double, so the kept blocks add up to less than the largest.
    size_t size = 4096;
    while (size < bytes) size *= 2;
    void* mem = pinned ? rt_.allocPinned(size) : rt_.allocDevice(size);
    if (s.mem != nullptr) retired_.emplace_back(s.mem, pinned);
    s.mem = mem;
    s.bytes = size;
  }
  return static_cast<uint8_t*>(s.mem);
}

uint8_t* DeviceState::slot(int i, size_t bytes) { return grow(slots_[static_cast<size_t>(i)], bytes, true); }

uint8_t* DeviceState::deviceScratch(int i, size_t bytes) {
  return grow(scratch_[static_cast<size_t>(i)], bytes, false);
}

std::shared_ptr<DeviceState> stateOf(detail::CommImpl& c, device::DeviceRuntime& rt) { return c.deviceState(rt); }

void waitEvent(device::DeviceRuntime& rt, device::EventHandle e, const detail::CommImpl& c, const Deadline& deadline,
               const char* what) {
  for (int spins = 0; !rt.eventDone(e); ++spins) {
    if (spins < 200) {
      std::this_thread::yield();
      continue;
    }
    c.checkOk();
    if (deadline.expired()) {
      LOOM_THROW(ErrorCode::Timeout, c.rank(),
                 strFormat("%s did not complete within %.1f s", what, deadline.totalSeconds()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void awaitInput(device::DeviceRuntime& rt, device::EventHandle ready, int dev, const detail::CommImpl& c,
                const std::string& what) {
  struct EventGuard {
    device::DeviceRuntime& rt;
    device::EventHandle e;
    ~EventGuard() { rt.destroyEvent(e); }
  } guard{rt, ready};
  rt.setDevice(dev);
  waitEvent(rt, ready, c, Deadline(c.timeout()), what.c_str());
}

void drainStream(device::DeviceRuntime& rt, device::StreamHandle s, const detail::CommImpl& c, const char* what) {
  device::EventHandle e = rt.recordEvent(s);
  struct Guard {
    device::DeviceRuntime& rt;
    device::EventHandle e;
    ~Guard() {
      try {  // the device may still be writing memory the caller reuses next: let it finish
        while (!rt.eventDone(e)) std::this_thread::sleep_for(std::chrono::microseconds(50));
      } catch (...) {
      }
      rt.destroyEvent(e);
    }
  } g{rt, e};
  waitEvent(rt, e, c, Deadline(c.timeout()), what);
}

Work holdStream(device::DeviceRuntime& rt, const std::shared_ptr<DeviceState>& st, void* stream,
                device::EventHandle ready, const std::function<RequestPtr()>& submit) {
  RequestPtr done;
  uint32_t token = 0;
  {
    std::lock_guard<std::mutex> lock(st->callMutex());
    token = st->nextToken();
    try {
      done = submit();
    } catch (...) {
      st->release(token);
      rt.destroyEvent(ready);
      throw;
    }
  }
  done->onDone([st, token](const Status&) { st->release(token); });
  rt.waitValue(stream, st->flag(), token);
  return Work(done);
}

void rejectCapture(device::DeviceRuntime& rt, void* stream, const detail::CommImpl& c, const char* what) {
  if (!rt.capturing(stream)) return;
  LOOM_THROW(ErrorCode::InvalidUsage, c.rank(),
             strFormat("%s: the stream is being captured into a CUDA graph; Loom's collectives are driven by the "
                       "host and cannot be captured: run them outside the capture",
                       what));
}

Work launchDeviceCall(detail::CommImpl& c, coll::Coll kind, int device, void* stream, uint64_t sig, int64_t seqs,
                      DeviceBody body) {
  device::DeviceRuntime* rt = device::runtime();
  if (rt == nullptr) LOOM_THROW(ErrorCode::Internal, c.rank(), "device collective without a device runtime");
  const char* what = coll::collName(kind);
  rejectCapture(*rt, stream, c, what);
  rt->prepare(device);
  std::shared_ptr<DeviceState> st = stateOf(c, *rt);
  device::EventHandle ready = rt->recordEvent(stream);
  auto run = [&c, st, what, device, body = std::move(body), ready](int64_t seq) {
    awaitInput(st->rt(), ready, device, c,
               strFormat("the work queued on the stream before %s #%lld", what, static_cast<long long>(seq)));
    body(seq, *st);
  };
  return holdStream(*rt, st, stream, ready, [&] { return c.submit(what, run, sig, seqs); });
}

}  // namespace detail
}  // namespace loom
