#include "transport/shm/segment.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <map>
#include <mutex>
#include <string>

#include "core/format.hpp"
#include "core/futex.hpp"
#include "core/status.hpp"

namespace loom {
namespace shm {
namespace {

constexpr size_t kPage = 4096;

size_t roundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }
size_t headerBytes() { return roundUp(sizeof(SegmentHeader), kPage); }
size_t controlBytes(int slots) { return roundUp(sizeof(RingControl) * static_cast<size_t>(slots), kPage); }

}  // namespace

SegmentTestHooks& segmentTestHooks() {
  static SegmentTestHooks hooks;
  return hooks;
}

namespace {

// Ranks that are threads of one process map each segment once between them: otherwise N ranks of
// one process would hold N * N mappings, and vm.max_map_count (65,530 by default) ends a job of
// 256 ranks as threads at init. Keyed by the segment's name, unique per communicator and rank.
struct Mapping {
  void* base;
  size_t bytes;
  int holders;
};
std::mutex mappingsMu;
std::map<std::string, Mapping>& mappings() {
  static auto* m = new std::map<std::string, Mapping>();  // never destroyed: segments may outlive statics
  return *m;
}

/// This process's mapping of `name` if it has one, now held once more, and its size; else null.
void* holdShared(const std::string& name, size_t* bytes) {
  std::lock_guard<std::mutex> lock(mappingsMu);
  auto it = mappings().find(name);
  if (it == mappings().end()) return nullptr;
  ++it->second.holders;
  *bytes = it->second.bytes;
  return it->second.base;
}

/// Offers a new mapping of `name` to the process's other ranks; false if one is there already.
bool share(const std::string& name, void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(mappingsMu);
  return mappings().emplace(name, Mapping{base, bytes, 1}).second;
}

void release(const std::string& name, void* base, size_t bytes, bool shared) {
  if (base == nullptr) return;
  if (shared) {
    std::lock_guard<std::mutex> lock(mappingsMu);
    auto it = mappings().find(name);
    if (it != mappings().end() && it->second.base == base) {
      if (--it->second.holders > 0) return;
      mappings().erase(it);
    }
  }
  munmap(base, bytes);
}

}  // namespace

Segment::~Segment() {
  unlink();
  release(name_, base_, bytes_, shared_);
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unlink();
    release(name_, base_, bytes_, shared_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    name_ = std::move(o.name_);
    owned_ = o.owned_;
    shared_ = o.shared_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.owned_ = false;
    o.shared_ = false;
  }
  return *this;
}

std::string Segment::nameFor(const Nonce& commId, int rank) {
  std::string name = "/loom-" + hexOf(commId.data(), 8) + "-" + std::to_string(rank);
  if (segmentTestHooks().rename) name = segmentTestHooks().rename(name);
  return name;
}

size_t Segment::sizeFor(int slots, size_t ringBytes, size_t directBytes) {
  return headerBytes() + controlBytes(slots) + static_cast<size_t>(slots) * ringBytes + directBytes;
}

uint8_t* Segment::direct() const {
  const auto* h = header();
  return static_cast<uint8_t*>(base_) + headerBytes() + controlBytes(static_cast<int>(h->slots)) +
         static_cast<size_t>(h->slots) * static_cast<size_t>(h->ringBytes);
}

RingControl* Segment::ring(int slot) const {
  return reinterpret_cast<RingControl*>(static_cast<uint8_t*>(base_) + headerBytes()) + slot;
}

uint8_t* Segment::ringData(int slot) const {
  const auto* h = header();
  return static_cast<uint8_t*>(base_) + headerBytes() + controlBytes(static_cast<int>(h->slots)) +
         static_cast<size_t>(slot) * static_cast<size_t>(h->ringBytes);
}

Segment Segment::create(const std::string& name, int owner, int slots, size_t ringBytes, size_t directBytes,
                        const Nonce& commId, bool backRings) {
  const size_t bytes = sizeFor(slots, ringBytes, directBytes);
  const std::string path = "/dev/shm" + name;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    if (e == EEXIST) {
      LOOM_THROW(ErrorCode::System, owner,
                 strFormat("shared-memory segment %s already exists: another job, or a killed one, holds that name "
                           "(remove the file if no job uses it; LOOM_TRANSPORT=^shm avoids shared memory)",
                           path.c_str()));
    }
    LOOM_THROW(ErrorCode::System, owner,
               strFormat("cannot create shared-memory segment %s: %s", path.c_str(), errnoText(e).c_str()));
  }
  Segment seg;
  seg.name_ = name;
  seg.owned_ = true;
  // From here on the destructor unlinks the name if anything throws.
  // Otherwise the file at its full size, only its header and ring controls backed.
  const size_t ringsAt = headerBytes() + controlBytes(slots);
  int rc = 0;
  if (backRings) {
    rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } else if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    rc = errno;
  } else {
    rc = posix_fallocate(fd, 0, static_cast<off_t>(ringsAt));
  }
  if (rc != 0) {
    close(fd);
    if (rc == ENOSPC) {
      LOOM_THROW(ErrorCode::System, owner,
                 strFormat("no room in /dev/shm for shared-memory segment %s of %zu bytes (%d rings of %zu bytes, "
                           "direct area of %zu): free space there (df /dev/shm), lower LOOM_SHM_RING_BYTES or "
                           "LOOM_SHM_DIRECT_BYTES, or set LOOM_TRANSPORT=^shm",
                           path.c_str(), bytes, slots, ringBytes, directBytes));
    }
    LOOM_THROW(
        ErrorCode::System, owner,
        strFormat("cannot size shared-memory segment %s to %zu bytes: %s", path.c_str(), bytes, errnoText(rc).c_str()));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (p == MAP_FAILED) {
    LOOM_THROW(ErrorCode::System, owner,
               strFormat("cannot map shared-memory segment %s: %s", path.c_str(), errnoText(e).c_str()));
  }
  seg.base_ = p;
  seg.bytes_ = bytes;
  seg.shared_ = share(name, p, bytes);

  // fallocate zeroed the pages (and a hole reads as zeros): every atomic starts at 0.
  auto* h = seg.header();
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->slots = static_cast<uint32_t>(slots);
  h->totalBytes = bytes;
  h->ringBytes = ringBytes;
  h->directBytes = directBytes;
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
  if (segmentTestHooks().afterCreate) segmentTestHooks().afterCreate(h);
  return seg;
}

void Segment::markReady() { header()->ready.store(1, std::memory_order_release); }

bool Segment::tryAttach(const std::string& name, int self, int owner, const Nonce& commId, Segment* out) {
  const std::string path = "/dev/shm" + name;
  Segment seg;
  seg.name_ = name;
  size_t bytes = 0;
  if (void* mine = holdShared(name, &bytes)) {
    // Ranks that are threads of this process: the owner (or a peer) mapped it already.
    seg.base_ = mine;
    seg.bytes_ = bytes;
    seg.shared_ = true;
    if (seg.header()->ready.load(std::memory_order_acquire) == 0) return false;  // released by ~Segment
    validate(seg, self, owner, commId);
    *out = std::move(seg);
    return true;
  }
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return false;  // not created yet
    LOOM_THROW_PEER(ErrorCode::System, self, owner,
                    strFormat("cannot open rank %d's shared-memory segment %s: %s (is /dev/shm shared between the "
                              "ranks, i.e. the same IPC namespace and mount? LOOM_HOST_ID / LOOM_TRANSPORT=^shm)",
                              owner, path.c_str(), errnoText(e).c_str()));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < headerBytes()) {
    close(fd);
    return false;  // created, not sized yet (its owner's fallocate sets the size once done)
  }
  bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  if (p == MAP_FAILED) {
    close(fd);
    LOOM_THROW_PEER(
        ErrorCode::System, self, owner,
        strFormat("cannot map rank %d's shared-memory segment %s: %s", owner, path.c_str(), errnoText(e).c_str()));
  }
  seg.base_ = p;
  seg.bytes_ = bytes;
  const auto* h = seg.header();
  if (h->ready.load(std::memory_order_acquire) == 0) {
    close(fd);
    // A segment of another layout version never says ready where this one looks: its magic and
    // version, once both written, say so at once (a version of 0 is one still being written).
    if (h->magic == kSegmentMagic && h->version != 0 && h->version != kSegmentVersion)
      validate(seg, self, owner, commId);
    return false;  // unmapped by ~Segment
  }
  // A size that disagrees with the header: a segment still growing (the size was read before the
  // owner's fallocate ended) maps again at its full size; one that stays so is not the owner's.
  if (h->totalBytes != bytes && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return false;
  }
  close(fd);
  seg.shared_ = share(name, p, bytes);
  validate(seg, self, owner, commId);
  *out = std::move(seg);
  return true;
}

void Segment::markAttached(int slot) { setSlotBit(header()->attached, slot); }

bool Segment::attachedBy(int slot) const { return slotBit(header()->attached, slot); }

void Segment::validate(const Segment& seg, int self, int owner, const Nonce& commId) {
  const size_t bytes = seg.bytes_;
  const std::string path = "/dev/shm" + seg.name_;
  const auto* h = seg.header();
  std::string why;
  if (h->magic != kSegmentMagic) {
    why = "it is not a Loom segment (bad magic)";
  } else if (h->version != kSegmentVersion) {
    why = strFormat("its layout version is %u, this build speaks %u (different Loom versions in one job?)", h->version,
                    kSegmentVersion);
  } else if (h->totalBytes != bytes || h->slots == 0 || h->slots > kMaxSlots || h->ringBytes == 0 ||
             sizeFor(static_cast<int>(h->slots), static_cast<size_t>(h->ringBytes),
                     static_cast<size_t>(h->directBytes)) != bytes) {
    why = strFormat("its header describes %llu bytes (%u rings of %llu), not the %zu bytes of its file",
                    static_cast<unsigned long long>(h->totalBytes), h->slots,
                    static_cast<unsigned long long>(h->ringBytes), bytes);
  } else if (h->owner != static_cast<uint32_t>(owner) || std::memcmp(h->commId, commId.data(), 16) != 0) {
    why = strFormat("it belongs to rank %u of another communicator (a name collision with another job?)", h->owner);
  }
  if (!why.empty()) {
    LOOM_THROW_PEER(ErrorCode::InvalidUsage, self, owner,
                    strFormat("rank %d's shared-memory segment %s is unusable: %s", owner, path.c_str(), why.c_str()));
  }
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
                            ringBytes(), owner, name_.c_str(), noRoomText(e).c_str()));
}

void Segment::backDirect(size_t from, size_t to) const {
  const int e = populate(direct() + from, to - from);
  if (e == 0) return;
  const auto owner = static_cast<int>(header()->owner);
  LOOM_THROW(ErrorCode::System, owner,
             strFormat("cannot back this rank's shared-memory direct area (bytes %zu to %zu of %zu, segment "
                       "/dev/shm%s): %s (a full /dev/shm? free space there (df /dev/shm), lower "
                       "LOOM_SHM_DIRECT_BYTES, or set LOOM_TRANSPORT=^shm)",
                       from, to, directBytes(), name_.c_str(), noRoomText(e).c_str()));
}

void Segment::requestLink(int slot) const {
  SegmentHeader* h = header();
  setSlotBit(h->linkedBy, slot);
  h->linkRequests.fetch_add(1, std::memory_order_seq_cst);
  h->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h->sleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&h->doorbell);
}

void Segment::unlink() noexcept {
  if (!owned_) return;
  owned_ = false;
  shm_unlink(name_.c_str());
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
