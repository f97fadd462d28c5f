"""libloom exports Loom's symbols and nothing else (src/loom.map).

Loaded into a process beside other libraries (a PyTorch process holds its own CUDA runtime and its
own C++ template instantiations), a shared library that exports what is not its own can capture
their calls, or have its own calls captured: the dynamic loader binds each name to the first
definition it finds. This reads libloom's dynamic symbol table (nm -D) and fails on any defined
symbol that is not the C API (loom*) or in namespace loom, naming it; and checks that the table
still holds the API (a map that hid too much would break every program linked to it).

    exports_test.py path/to/libloom.so
"""
import subprocess
import sys

OURS = ("loom", "typeinfo for loom::", "typeinfo name for loom::", "vtable for loom::", "VTT for loom::",
        "virtual thunk to loom::", "non-virtual thunk to loom::", "guard variable for loom::")
MUST = ("loomAllReduce", "loomGetLastError", "loom::Communicator::allReduce(", "typeinfo for loom::Error")


def main():
    out = subprocess.run(["nm", "-D", "--defined-only", "-C", sys.argv[1]], check=True, capture_output=True,
                         text=True).stdout
    names = [line.split(" ", 2)[2] for line in out.splitlines() if line.count(" ") >= 2]
    foreign = [n for n in names if not n.startswith(OURS)]
    missing = [m for m in MUST if not any(n.startswith(m) for n in names)]
    for n in foreign[:20]:
        print("exported, not Loom's: " + n)
    for m in missing:
        print("not exported: " + m)
    if foreign or missing:
        print("%d of %d exported symbols are not Loom's; %d of the API's missing" % (len(foreign), len(names),
                                                                                   len(missing)))
        return 1
    print("libloom exports %d symbols, all Loom's (the C API and namespace loom)" % len(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
