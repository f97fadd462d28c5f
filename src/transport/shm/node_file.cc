#include "transport/shm/node_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "core/format.hpp"
#include "core/futex.hpp"
#include "core/status.hpp"

namespace loom {
namespace shm {
namespace {

size_t nodeHeaderBytes() { return roundUpToPage(sizeof(NodeHeader)); }
/// The node header and the ranks' arena words: what the leader backs at creation.
size_t prefixBytes(int ranks) {
  return nodeHeaderBytes() + roundUpToPage(sizeof(ArenaWords) * static_cast<size_t>(ranks));
}
size_t segmentBytes(const NodeLayout& l) {
  return roundUpToPage(Segment::sizeFor(l.ranks - 1, l.ringBytes, l.directBytes));
}

// Ranks that are threads of one process map their node's file once between them. Keyed by the
// file's name, unique per communicator and node.
struct Mapping {
  void* base;
  size_t bytes;
  int holders;
};
std::mutex mappingsMu;
std::map<std::string, Mapping>& mappings() {
  static auto* m = new std::map<std::string, Mapping>();  // never destroyed: files may outlive statics
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

SegmentTestHooks& segmentTestHooks() {
  static SegmentTestHooks hooks;
  return hooks;
}

NodeFile::~NodeFile() {
  unlink();
  closeDescriptor();
  release(name_, base_, bytes_, shared_);
}

NodeFile& NodeFile::operator=(NodeFile&& o) noexcept {
  if (this != &o) {
    unlink();
    closeDescriptor();
    release(name_, base_, bytes_, shared_);
    base_ = o.base_;
    bytes_ = o.bytes_;
    fd_ = o.fd_;
    name_ = std::move(o.name_);
    owned_ = o.owned_;
    shared_ = o.shared_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.fd_ = -1;
    o.owned_ = false;
    o.shared_ = false;
  }
  return *this;
}

std::string NodeFile::nameFor(const Nonce& commId, int leader) {
  std::string name = "/loom-" + hexOf(commId.data(), 8) + "-" + std::to_string(leader);
  if (segmentTestHooks().rename) name = segmentTestHooks().rename(name);
  return name;
}

size_t NodeFile::sizeFor(const NodeLayout& layout) {
  return prefixBytes(layout.ranks) + static_cast<size_t>(layout.ranks) * segmentBytes(layout);
}

NodeFile NodeFile::create(const std::string& name, int leader, const NodeLayout& layout, const Nonce& commId) {
  const size_t bytes = sizeFor(layout);
  const std::string path = "/dev/shm" + name;
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    if (e == EEXIST) {
      LOOM_THROW(ErrorCode::System, leader,
                 strFormat("shared-memory segment %s already exists: another job, or a killed one, holds that name "
                           "(remove the file if no job uses it; LOOM_TRANSPORT=^shm avoids shared memory)",
                           path.c_str()));
    }
    LOOM_THROW(ErrorCode::System, leader,
               strFormat("cannot create shared-memory segment %s: %s", path.c_str(), errnoText(e).c_str()));
  }
  NodeFile f;
  f.name_ = name;
  f.owned_ = true;  // from here on the destructor unlinks the name if anything throws
  f.fd_ = fd;
  // The file at its full size, a hole but for the node header: each rank backs its own segment.
  int rc = ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : 0;
  if (rc == 0) rc = posix_fallocate(fd, 0, static_cast<off_t>(prefixBytes(layout.ranks)));
  if (rc != 0) {
    LOOM_THROW(ErrorCode::System, leader,
               strFormat("cannot size shared-memory segment %s to %zu bytes (%d ranks' segments): %s", path.c_str(),
                         bytes, layout.ranks, errnoText(rc).c_str()));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    LOOM_THROW(ErrorCode::System, leader,
               strFormat("cannot map shared-memory segment %s: %s", path.c_str(), errnoText(e).c_str()));
  }
  f.base_ = p;
  f.bytes_ = bytes;
  NodeHeader* h = f.header();
  h->magic = kNodeMagic;
  h->version = kSegmentVersion;
  h->ranks = static_cast<uint32_t>(layout.ranks);
  h->leader = static_cast<uint32_t>(leader);
  h->segmentBytes = segmentBytes(layout);
  h->ringBytes = layout.ringBytes;
  h->directBytes = layout.directBytes;
  h->totalBytes = bytes;
  std::memcpy(h->commId, commId.data(), 16);
  if (segmentTestHooks().afterNodeCreate) segmentTestHooks().afterNodeCreate(h);
  h->ready.store(1, std::memory_order_release);
  // Offered to this process's other ranks once written: they read it without a look at `ready`.
  f.shared_ = share(name, p, bytes);
  return f;
}

bool NodeFile::tryOpen(const std::string& name, int self, int leader, int ranks, const Nonce& commId, NodeFile* out) {
  const std::string path = "/dev/shm" + name;
  NodeFile f;
  f.name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return false;  // not created yet
    LOOM_THROW_PEER(ErrorCode::System, self, leader,
                    strFormat("cannot open the shared-memory segment %s of rank %d's node: %s (is /dev/shm shared "
                              "between the ranks, i.e. the same IPC namespace and mount? LOOM_HOST_ID / "
                              "LOOM_TRANSPORT=^shm)",
                              path.c_str(), leader, errnoText(e).c_str()));
  }
  f.fd_ = fd;  // closed by ~NodeFile if this returns false or throws
  size_t bytes = 0;
  if (void* mine = holdShared(name, &bytes)) {
    // Ranks that are threads of this process: one of them mapped it already.
    f.base_ = mine;
    f.bytes_ = bytes;
    f.shared_ = true;
  } else {
    struct stat st {};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < nodeHeaderBytes()) return false;  // not sized yet
    bytes = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      LOOM_THROW_PEER(ErrorCode::System, self, leader,
                      strFormat("cannot map the shared-memory segment %s of rank %d's node: %s", path.c_str(), leader,
                                errnoText(e).c_str()));
    }
    f.base_ = p;
    f.bytes_ = bytes;
  }
  const NodeHeader* h = f.header();
  if (h->ready.load(std::memory_order_acquire) == 0) {
    // A file of another layout version never says ready where this one looks: its magic and
    // version, once both written, say so at once (a version of 0 is one still being written).
    if (h->magic == kNodeMagic && h->version != 0 && h->version != kSegmentVersion)
      validate(f, self, leader, ranks, commId);
    return false;  // unmapped by ~NodeFile
  }
  if (!f.shared_) f.shared_ = share(name, f.base_, f.bytes_);
  validate(f, self, leader, ranks, commId);
  *out = std::move(f);
  return true;
}

void NodeFile::validate(const NodeFile& f, int self, int leader, int ranks, const Nonce& commId) {
  const size_t bytes = f.bytes_;
  const auto* h = f.header();
  std::string why;
  NodeLayout l;
  l.ranks = static_cast<int>(h->ranks);
  l.ringBytes = static_cast<size_t>(h->ringBytes);
  l.directBytes = static_cast<size_t>(h->directBytes);
  if (h->magic != kNodeMagic) {
    why = "it is not a Loom segment (bad magic)";
  } else if (h->version != kSegmentVersion) {
    why = strFormat("its layout version is %u, this build speaks %u (different Loom versions in one job?)", h->version,
                    kSegmentVersion);
  } else if (h->leader != static_cast<uint32_t>(leader) || std::memcmp(h->commId, commId.data(), 16) != 0) {
    why = strFormat("it belongs to rank %u of another communicator (a name collision with another job?)", h->leader);
  } else if (h->ranks != static_cast<uint32_t>(ranks)) {
    why = strFormat(
        "it was made for %u ranks on the node, this rank counts %d (ranks disagree on which share a node: "
        "LOOM_HOST_ID?)",
        h->ranks, ranks);
  } else if (h->totalBytes != bytes || l.ringBytes == 0 || h->segmentBytes != segmentBytes(l) || sizeFor(l) != bytes) {
    why = strFormat("its header describes %llu bytes (%u segments of %llu), not the %zu bytes of its file",
                    static_cast<unsigned long long>(h->totalBytes), h->ranks,
                    static_cast<unsigned long long>(h->segmentBytes), bytes);
  }
  if (!why.empty()) {
    LOOM_THROW_PEER(ErrorCode::InvalidUsage, self, leader,
                    strFormat("the shared-memory segment /dev/shm%s of rank %d's node is unusable: %s", f.name_.c_str(),
                              leader, why.c_str()));
  }
}

NodeLayout NodeFile::layout() const {
  NodeLayout l;
  l.ranks = static_cast<int>(header()->ranks);
  l.ringBytes = static_cast<size_t>(header()->ringBytes);
  l.directBytes = static_cast<size_t>(header()->directBytes);
  return l;
}

void NodeFile::back(int index, int owner, bool whole) const {
  const NodeLayout l = layout();
  const size_t at = prefixBytes(l.ranks) + static_cast<size_t>(index) * header()->segmentBytes;
  const size_t bytes =
      whole ? Segment::sizeFor(l.ranks - 1, l.ringBytes, l.directBytes) : Segment::controlBytes(l.ranks - 1);
  const int rc = posix_fallocate(fd_, static_cast<off_t>(at), static_cast<off_t>(bytes));
  if (rc == 0) return;
  if (rc == ENOSPC) {
    LOOM_THROW(ErrorCode::System, owner,
               strFormat("no room in /dev/shm for shared-memory segment /dev/shm%s: rank %d's part of %zu bytes (%d "
                         "rings of %zu bytes, direct area of %zu): free space there (df /dev/shm), lower "
                         "LOOM_SHM_RING_BYTES or LOOM_SHM_DIRECT_BYTES, or set LOOM_TRANSPORT=^shm",
                         name_.c_str(), owner, bytes, l.ranks - 1, l.ringBytes, l.directBytes));
  }
  LOOM_THROW(ErrorCode::System, owner,
             strFormat("cannot back rank %d's part of shared-memory segment /dev/shm%s (%zu bytes): %s", owner,
                       name_.c_str(), bytes, errnoText(rc).c_str()));
}

Segment NodeFile::segment(int index) const {
  const NodeLayout l = layout();
  auto* at = static_cast<uint8_t*>(base_) + prefixBytes(l.ranks) + static_cast<size_t>(index) * header()->segmentBytes;
  return Segment(at, name_, l.ranks - 1, l.ringBytes, l.directBytes);
}

ArenaWords* NodeFile::arenaWords(int index) const {
  return reinterpret_cast<ArenaWords*>(static_cast<uint8_t*>(base_) + nodeHeaderBytes()) + index;
}

void NodeFile::markJoined(int index) {
  NodeHeader* h = header();
  setSlotBit(h->joined, index);
  if (h->joinedCount.fetch_add(1, std::memory_order_acq_rel) + 1 == h->ranks) futexWakeAll(&h->joinedCount);
}

bool NodeFile::joined(int index) const { return slotBit(header()->joined, index); }

bool NodeFile::allJoined() const { return header()->joinedCount.load(std::memory_order_acquire) == header()->ranks; }

void NodeFile::waitForJoins(std::chrono::steady_clock::time_point until) const {
  NodeHeader* h = header();
  const uint32_t seen = h->joinedCount.load(std::memory_order_acquire);
  if (seen == h->ranks) return;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  if (left.count() > 0) futexWait(&h->joinedCount, seen, static_cast<int>(left.count()));
}

void NodeFile::unlink() noexcept {
  if (!owned_) return;
  owned_ = false;
  shm_unlink(name_.c_str());
}

void NodeFile::closeDescriptor() noexcept {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace shm
}  // namespace loom
