#include "transport/shm/segment.hpp"

#include <linux/futex.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "core/format.hpp"
#include "core/futex.hpp"
#include "core/status.hpp"

namespace loom {
namespace shm {
namespace {

size_t headerBytes() { return roundUpToPage(sizeof(SegmentHeader)); }
size_t ringControlBytes(int slots) { return roundUpToPage(sizeof(RingControl) * static_cast<size_t>(slots)); }

}  // namespace

size_t Segment::controlBytes(int slots) { return headerBytes() + ringControlBytes(slots); }

size_t Segment::sizeFor(int slots, size_t ringBytes, size_t directBytes) {
  return controlBytes(slots) + static_cast<size_t>(slots) * ringBytes + directBytes;
}

uint8_t* Segment::direct() const {
  return static_cast<uint8_t*>(base_) + controlBytes(slots_) + static_cast<size_t>(slots_) * ringBytes_;
}

RingControl* Segment::ring(int slot) const {
  return reinterpret_cast<RingControl*>(static_cast<uint8_t*>(base_) + headerBytes()) + slot;
}

uint8_t* Segment::ringData(int slot) const {
  return static_cast<uint8_t*>(base_) + controlBytes(slots_) + static_cast<size_t>(slot) * ringBytes_;
}

void Segment::initialise(int owner, const Nonce& commId) {
  // Backed just now (fallocate zeroes, and a hole reads as zeros): every atomic starts at 0.
  auto* h = header();
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->slots = static_cast<uint32_t>(slots_);
  h->totalBytes = sizeFor(slots_, ringBytes_, directBytes_);
  h->ringBytes = ringBytes_;
  h->directBytes = directBytes_;
  h->owner = static_cast<uint32_t>(owner);
  h->pid = static_cast<int32_t>(getpid());
  std::memcpy(h->commId, commId.data(), 16);
  Nonce c = randomNonce();
  std::memcpy(&h->cookie, c.data(), sizeof(h->cookie));
  h->cookie |= 1;  // never 0, which a failed read would leave
  h->cookieAddr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&h->cookie));
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->alive, &attr);
  pthread_mutexattr_destroy(&attr);
}

namespace {

// Write-faults [at, at + bytes) of a shared mapping in, which allocates its pages (a segment's name
// may be gone, so there is no descriptor to fallocate through); the kernel answers EFAULT where a
// store would have raised SIGBUS. Returns 0 or the errno; an older kernel without
// MADV_POPULATE_WRITE (Linux 5.14) counts as done: the first writes allocate the pages.
int populate(void* at, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  if (bytes == 0 || madvise(at, bytes, MADV_POPULATE_WRITE) == 0) return 0;
  return errno == EINVAL ? 0 : errno;
}

std::string noRoomText(int e) { return e == EFAULT ? "no room for its pages" : errnoText(e); }

}  // namespace

void Segment::backRing(int slot, int self) const {
  const int e = populate(ringData(slot), ringBytes());
  if (e == 0) return;
  const auto owner = static_cast<int>(header()->owner);
  LOOM_THROW_PEER(ErrorCode::System, self, owner,
                  strFormat("cannot back the ring of %zu bytes this rank writes in rank %d's shared-memory segment "
                            "/dev/shm%s: %s (a full /dev/shm? free space there (df /dev/shm), lower "
                            "LOOM_SHM_RING_BYTES, or set LOOM_TRANSPORT=^shm)",
                            ringBytes(), owner, name().c_str(), noRoomText(e).c_str()));
}

void Segment::backDirect(size_t from, size_t to) const {
  const int e = populate(direct() + from, to - from);
  if (e == 0) return;
  const auto owner = static_cast<int>(header()->owner);
  LOOM_THROW(ErrorCode::System, owner,
             strFormat("cannot back this rank's shared-memory direct area (bytes %zu to %zu of %zu, segment "
                       "/dev/shm%s): %s (a full /dev/shm? free space there (df /dev/shm), lower "
                       "LOOM_SHM_DIRECT_BYTES, or set LOOM_TRANSPORT=^shm)",
                       from, to, directBytes(), name().c_str(), noRoomText(e).c_str()));
}

void Segment::requestLink(int slot) const {
  SegmentHeader* h = header();
  setSlotBit(h->linkedBy, slot);
  h->linkRequests.fetch_add(1, std::memory_order_seq_cst);
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&h->doorbell);
}

void ring(SegmentHeader* seg, bool urgent) noexcept {
  // The bytes just published, then the look at `attending`: a store-load pair that needs a full
  // fence; the owner's side is the read-modify-write in ProgressEngine::attend, then its look at the
  // rings. So either the owner sees the bytes when it stops attending, or we see it not attending.
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer does not model fences: a read-modify-write on `attending` orders the same
  // pair (the owner's attend() is one too), at the price of a write to a shared line.
  if (seg->attending.fetch_add(0, std::memory_order_seq_cst) != 0) return;
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (seg->attending.load(std::memory_order_relaxed) != 0) return;
#endif
  if (!urgent && seg->waiters.load(std::memory_order_relaxed) == 0) return;
  seg->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (seg->sleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&seg->doorbell);
}

void recordFailure(SegmentHeader* seg, const std::string& why) noexcept {
  uint32_t expected = 0;
  if (!seg->failed.compare_exchange_strong(expected, 1)) return;
  const size_t n = std::min(why.size(), sizeof(seg->failure) - 1);
  std::memcpy(seg->failure, why.data(), n);
  seg->failure[n] = '\0';
  seg->failed.store(2, std::memory_order_release);
}

std::string recordedFailure(const SegmentHeader* seg) {
  if (seg->failed.load(std::memory_order_acquire) != 2) return "";
  return std::string(seg->failure, strnlen(seg->failure, sizeof(seg->failure)));
}

PeerState probeOwner(SegmentHeader* seg) noexcept {
  // The owner marks a clean exit before it lets the mutex go; and another prober's trylock below
  // holds the mutex for a moment, which would read as "alive" (aliveHolder tells them apart).
  if (seg->closed.load(std::memory_order_acquire) != 0) return PeerState::Closed;
#if defined(__GLIBC__)
  // glibc keeps a robust mutex's holder's thread id in its futex word, and the kernel replaces it
  // with FUTEX_OWNER_DIED when that thread dies. Reading it answers "alive" without the trylock's
  // compare-and-swap, which takes the line for writing: every rank of a node probes every peer's
  // mutex several times a second.
  const auto word = static_cast<uint32_t>(__atomic_load_n(&seg->alive.__data.__lock, __ATOMIC_ACQUIRE));
  if ((word & FUTEX_TID_MASK) != 0 && (word & FUTEX_OWNER_DIED) == 0) {
    // Held: by the owner's thread, or for a moment by another rank's probe (then the owner let
    // it go or died, and this probe would otherwise read "alive" until that one lets it go).
    const auto holder = static_cast<uint32_t>(seg->aliveHolder.load(std::memory_order_acquire));
    if (holder == 0 || holder == (word & FUTEX_TID_MASK)) return PeerState::Alive;
    return seg->closed.load(std::memory_order_acquire) != 0 ? PeerState::Closed : PeerState::Died;
  }
#endif
  int rc = pthread_mutex_trylock(&seg->alive);
  if (rc == EBUSY) return PeerState::Alive;
  if (rc == EOWNERDEAD) {
    // Leave it consistent and released: the next probe then says Closed, which is also "gone".
    pthread_mutex_consistent(&seg->alive);
    pthread_mutex_unlock(&seg->alive);
    return PeerState::Died;
  }
  if (rc == 0) {
    pthread_mutex_unlock(&seg->alive);
    return seg->closed.load() != 0 ? PeerState::Closed : PeerState::Died;
  }
  return PeerState::Died;  // ENOTRECOVERABLE
}

}  // namespace shm
}  // namespace loom
