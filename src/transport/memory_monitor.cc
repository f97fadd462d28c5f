// The hooks, the redirection of libc's entries to them, and the ring they note changes in.
#include "transport/memory_monitor.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/format.hpp"
#include "core/logging.hpp"
#include "core/param.hpp"

namespace loom {
namespace {

LOOM_PARAM_INT(memoryHooks, "LOOM_MEMORY_HOOKS", 1,
               "1: watch libc's munmap/mmap/mremap/madvise/brk so that registered memory can be cached "
               "safely (transports that register memory); 0: register memory for each use only");

#if defined(__SANITIZE_THREAD__)
#define LOOM_UNWATCHED __attribute__((no_sanitize("thread")))
#else
#define LOOM_UNWATCHED
#endif

// ---- The ring -------------------------------------------------------------------------------

constexpr uint64_t kSlots = 4096;  // a power of two

// One noted change, written like a seqlock: `seq` is 0 while a writer fills it, then its number
// + 1. Plain words under the __atomic builtins, and the code that touches them is kept out of
// ThreadSanitizer's instrumentation (LOOM_UNWATCHED): the hooks also run where a sanitizer's
// per-thread state is gone (glibc drops an exiting thread's stack with madvise).
struct Slot {
  uint64_t seq;
  uintptr_t begin;
  uintptr_t end;
};

Slot gSlots[kSlots];
uint64_t gHead = 0;

// Set before any hook is installed, so that the hooks read a plain word (no static guard).
uintptr_t gPage = 4096;

// ---- The hooks ------------------------------------------------------------------------------
// Each notes the range first, then makes the system call, so that no cache can find the old
// registration once the call has returned and the addresses can be handed out again.

void** gCurbrkVar = nullptr;  // glibc's __curbrk, which brk() keeps

extern "C" LOOM_UNWATCHED int loomHookMunmap(void* addr, size_t len) {
  MemoryMonitor::note(reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(addr) + len);
  return static_cast<int>(syscall(SYS_munmap, addr, len));
}

extern "C" LOOM_UNWATCHED void* loomHookMmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  // MAP_FIXED replaces whatever was mapped there; MAP_FIXED_NOREPLACE fails instead.
  if ((flags & MAP_FIXED) != 0) {
    MemoryMonitor::note(reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(addr) + len);
  }
  return reinterpret_cast<void*>(syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
}

extern "C" LOOM_UNWATCHED void* loomHookMremap(void* old, size_t oldLen, size_t newLen, int flags, void* newAddr) {
  MemoryMonitor::note(reinterpret_cast<uintptr_t>(old), reinterpret_cast<uintptr_t>(old) + oldLen);
  if ((flags & MREMAP_FIXED) != 0) {
    MemoryMonitor::note(reinterpret_cast<uintptr_t>(newAddr), reinterpret_cast<uintptr_t>(newAddr) + newLen);
  }
  return reinterpret_cast<void*>(syscall(SYS_mremap, old, oldLen, newLen, flags, newAddr));
}

extern "C" LOOM_UNWATCHED int loomHookMadvise(void* addr, size_t len, int advice) {
  // The advice that drops pages (later faults map new ones); the others keep them.
  if (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE || advice == 24 /* DONTNEED_LOCKED */) {
    MemoryMonitor::note(reinterpret_cast<uintptr_t>(addr), reinterpret_cast<uintptr_t>(addr) + len);
  }
  return static_cast<int>(syscall(SYS_madvise, addr, len, advice));
}

extern "C" LOOM_UNWATCHED int loomHookBrk(void* addr) {
  const auto old = reinterpret_cast<uintptr_t>(*gCurbrkVar);
  const auto want = reinterpret_cast<uintptr_t>(addr);
  if (want < old) MemoryMonitor::note(want, old);  // the heap shrinks: its top pages go
  const auto got = static_cast<uintptr_t>(syscall(SYS_brk, addr));
  *gCurbrkVar = reinterpret_cast<void*>(got);
  if (got < want) {
    errno = ENOMEM;
    return -1;
  }
  return 0;
}

// ---- Redirecting libc's entries -------------------------------------------------------------

// `movabs $hook, %r11; jmp *%r11`: 13 bytes. r11 is free at a function's entry (the system call
// clobbers it anyway), and the original code is never run again, so nothing needs relocating.
constexpr size_t kJumpBytes = 13;

// A function entry known to be safe to overwrite: its first kJumpBytes are straight-line code
// that nothing branches into. 0x100 in `bytes` matches any byte.
struct Entry {
  const char* what;
  std::array<uint16_t, 18> bytes;
  size_t length;
};

constexpr uint16_t A = 0x100;  // any byte
const Entry kEntries[] = {
    // glibc's system-call template: mov $nr,%eax; syscall; cmp $-4095,%rax; jae error
    {"syscall template", {0xb8, A, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x3d, A, 0xf0, 0xff, 0xff}, 13},
    // glibc 2.36 mmap: mov %ecx,%r10d; test $0xfff,%r9d; jne (forward, past 13 bytes); mov $9,%eax
    {"glibc 2.36 mmap", {0x41, 0x89, 0xca, 0x41, 0xf7, 0xc1, 0xff, 0x0f, 0x00, 0x00, 0x75, A, 0xb8}, 13},
    // glibc 2.36 mremap: sub $N,%rsp; mov %r8,N(%rsp); mov %fs:0x28,%rax (the stack protector)
    {"glibc 2.36 mremap",
     {0x48, 0x83, 0xec, A, 0x4c, 0x89, 0x44, 0x24, A, 0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00},
     18},
    // glibc 2.36 brk: mov $12,%eax; syscall; mov __curbrk@GOT(%rip),%rdx
    {"glibc 2.36 brk", {0xb8, 0x0c, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x8b, 0x15, A, A, A, A}, 14},
};
constexpr uint8_t kEndbr64[4] = {0xf3, 0x0f, 0x1e, 0xfa};

// Where to write the jump in `fn`, or nullptr when its entry is none of the known ones.
uint8_t* patchPoint(void* fn) {
  auto* p = static_cast<uint8_t*>(fn);
  if (std::memcmp(p, kEndbr64, sizeof kEndbr64) == 0) p += sizeof kEndbr64;  // keep the landing pad
  for (const Entry& e : kEntries) {
    bool match = true;
    for (size_t i = 0; i < e.length && match; ++i) match = e.bytes[i] == A || e.bytes[i] == p[i];
    // The mmap form's forward branch must land past the jump.
    if (match && e.bytes[10] == 0x75 && static_cast<int8_t>(p[11]) < static_cast<int>(kJumpBytes) - 12) match = false;
    if (match) return p;
  }
  return nullptr;
}

std::string hexBytes(const void* fn) {
  std::string out;
  const auto* p = static_cast<const uint8_t*>(fn);
  for (size_t i = 0; i < 16; ++i) out += strFormat("%s%02x", i == 0 ? "" : " ", p[i]);
  return out;
}

bool writeCode(uint8_t* at, const uint8_t* code, size_t n) {
  const uintptr_t page = gPage;
  const uintptr_t first = reinterpret_cast<uintptr_t>(at) & ~(page - 1);
  const uintptr_t last = (reinterpret_cast<uintptr_t>(at) + n - 1) & ~(page - 1);
  const size_t span = last - first + page;
  auto* base = reinterpret_cast<void*>(first);
  if (mprotect(base, span, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return false;
  std::memcpy(at, code, n);
  __builtin___clear_cache(reinterpret_cast<char*>(at), reinterpret_cast<char*>(at + n));
  return mprotect(base, span, PROT_READ | PROT_EXEC) == 0;
}

std::string gReason;
MemoryMonitor gMonitor;
MemoryMonitor* gInstalled = nullptr;

// Installs every hook or none; returns "" or why not.
std::string install() {
#if !defined(__x86_64__) || !defined(__linux__)
  return "memory hooks are written for x86-64 Linux only";
#else
  if (memoryHooks() == 0) return "LOOM_MEMORY_HOOKS=0";
  gPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  // libc will jump into this object's code from now on: it must never be unloaded (a Python
  // extension's library may be dlclose'd). The main program never is.
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&loomHookMunmap), &self) == 0 || self.dli_fname == nullptr)
    return "cannot find the object the hooks are in";
  char exe[4096] = {0};
  char obj[4096] = {0};
  const bool inMain = realpath("/proc/self/exe", exe) != nullptr && realpath(self.dli_fname, obj) != nullptr &&
                      std::strcmp(exe, obj) == 0;
  if (!inMain && dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == nullptr)
    return strFormat("cannot keep %s loaded for good", self.dli_fname);
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  if (libc == nullptr) return "libc.so.6 is not loaded";
  gCurbrkVar = static_cast<void**>(dlsym(libc, "__curbrk"));
  if (gCurbrkVar == nullptr) return "libc has no __curbrk";
  struct Target {
    const char* name;
    void* hook;
    uint8_t* at = nullptr;
    uint8_t saved[kJumpBytes] = {};
  };
  Target targets[] = {{"munmap", reinterpret_cast<void*>(&loomHookMunmap)},
                      {"mmap", reinterpret_cast<void*>(&loomHookMmap)},
                      {"mremap", reinterpret_cast<void*>(&loomHookMremap)},
                      {"madvise", reinterpret_cast<void*>(&loomHookMadvise)},
                      {"brk", reinterpret_cast<void*>(&loomHookBrk)}};
  for (Target& t : targets) {  // check them all before changing any
    void* fn = dlsym(libc, t.name);
    if (fn == nullptr) return strFormat("libc has no %s", t.name);
    t.at = patchPoint(fn);
    if (t.at == nullptr) return strFormat("libc's %s starts with unknown code (%s)", t.name, hexBytes(fn).c_str());
  }
  size_t done = 0;
  for (Target& t : targets) {
    uint8_t jump[kJumpBytes] = {0x49, 0xbb};  // movabs $imm64, %r11
    const auto target = reinterpret_cast<uint64_t>(t.hook);
    std::memcpy(jump + 2, &target, sizeof target);
    jump[10] = 0x41;  // jmp *%r11
    jump[11] = 0xff;
    jump[12] = 0xe3;
    std::memcpy(t.saved, t.at, kJumpBytes);
    if (!writeCode(t.at, jump, kJumpBytes)) {
      const int err = errno;
      for (size_t i = 0; i < done; ++i) writeCode(targets[i].at, targets[i].saved, kJumpBytes);
      return strFormat("cannot write libc's code (mprotect: %s)", std::strerror(err));
    }
    ++done;
  }
  return "";
#endif
}

}  // namespace

MemoryMonitor* MemoryMonitor::get() {
  static std::once_flag once;
  std::call_once(once, [] {
    gReason = install();
    if (gReason.empty()) {
      gInstalled = &gMonitor;
      LOOM_INFO("memory hooks installed: registered memory is cached and dropped when unmapped");
    } else {
      LOOM_INFO("memory hooks not installed (%s): registered memory is not cached past its use", gReason.c_str());
    }
  });
  return gInstalled;
}

std::string MemoryMonitor::reason() {
  get();
  return gReason;
}

LOOM_UNWATCHED uint64_t MemoryMonitor::published() const { return __atomic_load_n(&gHead, __ATOMIC_ACQUIRE); }

LOOM_UNWATCHED void MemoryMonitor::note(uintptr_t begin, uintptr_t end) noexcept {
  const uintptr_t page = gPage;
  begin &= ~(page - 1);
  end = (end + page - 1) & ~(page - 1);
  const uint64_t n = __atomic_fetch_add(&gHead, 1, __ATOMIC_ACQ_REL);
  Slot& s = gSlots[n & (kSlots - 1)];
  // A reader that sees either new field (acquire) then sees seq no longer its old value.
  __atomic_store_n(&s.seq, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&s.begin, begin, __ATOMIC_RELEASE);
  __atomic_store_n(&s.end, end, __ATOMIC_RELEASE);
  __atomic_store_n(&s.seq, n + 1, __ATOMIC_RELEASE);
}

LOOM_UNWATCHED bool MemoryMonitor::drain(uint64_t* cursor, FunctionRef<void(uintptr_t, uintptr_t)> changed) const {
  const uint64_t head = __atomic_load_n(&gHead, __ATOMIC_ACQUIRE);
  if (head - *cursor > kSlots) {
    *cursor = head;
    return false;
  }
  for (uint64_t n = *cursor; n < head; ++n) {
    const Slot& s = gSlots[n & (kSlots - 1)];
    for (;;) {
      const uint64_t before = __atomic_load_n(&s.seq, __ATOMIC_ACQUIRE);
      if (before > n + 1) {  // overwritten: the ring went round past this reader
        *cursor = head;
        return false;
      }
      if (before == n + 1) {
        const uintptr_t b = __atomic_load_n(&s.begin, __ATOMIC_ACQUIRE);
        const uintptr_t e = __atomic_load_n(&s.end, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&s.seq, __ATOMIC_RELAXED) == n + 1) {
          changed(b, e);
          break;
        }
        continue;
      }
      std::this_thread::yield();  // its writer is between taking the number and publishing
    }
  }
  *cursor = head;
  return true;
}

}  // namespace loom
