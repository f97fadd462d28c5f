"""The memory hooks outlive a dlclose of the library that installed them.

Once the hooks are in, libc's munmap jumps into libloom's code, so libloom must stay loaded even
when the program that loaded it (a Python extension, ctypes) closes it. This loads libloom.so the
way a Python program does, installs the hooks, closes the library, then makes libc unmap memory:
had the library gone, that would crash. (glibc also keeps a library with GNU-unique symbols, which
libloom's C++ has today; the hooks' own pin keeps this true without them.) Usage: memory_hooks_unload_test.py path/to/libloom.so
"""
import ctypes
import mmap
import os
import sys


def main():
    path = os.path.abspath(sys.argv[1])
    lib = ctypes.CDLL(path)
    get = lib._ZN4loom13MemoryMonitor3getEv  # loom::MemoryMonitor::get()
    get.restype = ctypes.c_void_p
    if not get():
        print("memory hooks not installed here; nothing to check")
        return 0
    handle = lib._handle
    del lib, get
    # dlclose until the reference count would reach zero (ctypes opened it once).
    ctypes.CDLL(None).dlclose.argtypes = [ctypes.c_void_p]
    ctypes.CDLL(None).dlclose(ctypes.c_void_p(handle))
    # The library must still be mapped (the hooks pinned it) ...
    with open("/proc/self/maps") as maps:
        mapped = maps.read()
    assert os.path.realpath(path) in mapped, "libloom was unloaded while libc still jumps into it"
    # ... and libc's unmapping goes through the hooks without harm.
    for _ in range(20):
        m = mmap.mmap(-1, 8 << 20)
        m[0] = 1
        m.close()
        block = bytearray(64 << 20)  # malloc's own mapping, unmapped by free()
        del block
    print("libc unmapped memory through the hooks after dlclose: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
