#!/usr/bin/env python3
"""The first checks of a GPU run (tools/gpu-run check, step torch): what stands between a PyTorch
process with CUDA and a Loom group, each told apart in seconds, so that the cause of a crash at
group creation is known even if nothing else runs.

    gpu-triage.py LIB_DIR   (the folder that holds loom_torch, built against the machine's PyTorch)

  1. the pybind11 ABI of the extension and of PyTorch's own module (they must share one);
  2. which of libloom's calls the dynamic loader binds outside libloom and the system's C and C++
     libraries (LD_DEBUG=bindings: a definition of another library capturing Loom's calls);
  3. a 2-rank group on CPU tensors, ranks forked from a process that imported torch, under
     faulthandler with LOOM_DEBUG=INFO: as is, without the cuda_ipc transport, with no GPU visible,
     and without the memory hooks; each variant's exit status says which one crashes.
"""
import os
import re
import subprocess
import sys
import tempfile

LIB = os.path.abspath(sys.argv[1])
ENV = dict(os.environ, PYTHONPATH=LIB + os.pathsep + os.environ.get("PYTHONPATH", ""))

TWO_RANKS = r'''
import datetime, faulthandler, multiprocessing as mp, socket, sys
import torch, torch.distributed as d
import loom_torch
faulthandler.enable()

def rank(r, port):
    faulthandler.enable()
    d.init_process_group("loom", init_method="tcp://127.0.0.1:%d" % port, rank=r, world_size=2,
                         timeout=datetime.timedelta(seconds=20))
    t = torch.ones(4) * (r + 1)
    d.all_reduce(t)
    print("rank %d: all_reduce gave %s over %s" % (r, t.tolist(), d.get_backend()), flush=True)
    d.destroy_process_group()

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
ps = [mp.get_context("fork").Process(target=rank, args=(r, port)) for r in range(2)]
for p in ps: p.start()
for p in ps: p.join(40)
codes = [p.exitcode for p in ps]
print("exit codes:", codes, "(negative: killed by that signal)")
sys.exit(0 if codes == [0, 0] else 1)
'''


def run(title, cmd, env=None, timeout=60):
    print("== " + title, flush=True)
    try:
        r = subprocess.run(cmd, env=env or ENV, capture_output=True, text=True, timeout=timeout)
        out = (r.stdout + r.stderr).strip().splitlines()
        print("\n".join(out[-40:]))
        print("-> exit %d" % r.returncode, flush=True)
        return r
    except subprocess.TimeoutExpired:
        print("-> did not finish in %d s" % timeout, flush=True)
        return None


def pybind_abi():
    print("== 1. pybind11 ABI (internals id) of the extension and of PyTorch", flush=True)
    torch_lib = subprocess.run([sys.executable, "-c", "import os, torch; print(os.path.dirname(torch.__file__))"],
                               capture_output=True, text=True).stdout.strip()
    ext = [os.path.join(LIB, "loom_torch", f) for f in os.listdir(os.path.join(LIB, "loom_torch")) if
           f.startswith("_C") and f.endswith(".so")]
    for f in ext + [os.path.join(torch_lib, "lib", "libtorch_python.so"), os.path.join(torch_lib, "_C.so")]:
        if not os.path.exists(f):
            continue
        ids = sorted(set(re.findall(rb"__pybind11_internals_v[A-Za-z0-9_]*", open(f, "rb").read())))
        print("%s: %s" % (f, b" ".join(ids).decode() or "(none)"))


def bindings():
    print("== 2. libloom's calls bound outside libloom (LD_DEBUG=bindings on import torch, loom_torch)", flush=True)
    with tempfile.TemporaryDirectory() as d:
        env = dict(ENV, LD_DEBUG="bindings", LD_DEBUG_OUTPUT=os.path.join(d, "b"))
        subprocess.run([sys.executable, "-c", "import torch, loom_torch"], env=env, timeout=120)
        outside = {}
        system = re.compile(r"/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so")
        for name in os.listdir(d):
            for line in open(os.path.join(d, name), errors="replace"):
                m = re.search(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \S+ symbol `([^']+)'", line)
                if m and "libloom.so" in m.group(1) and "libloom.so" not in m.group(2) and not system.search(
                        m.group(2)):
                    outside.setdefault(m.group(2), set()).add(m.group(3))
        for lib, syms in sorted(outside.items()):
            print("%s: %d symbols, e.g. %s" % (lib, len(syms), ", ".join(sorted(syms)[:8])))
        if not outside:
            print("none: libloom's calls bind to itself and the system's C and C++ libraries only")


def groups():
    base = dict(ENV, LOOM_DEBUG="INFO")
    for title, extra in (("as is", {}), ("LOOM_TRANSPORT=^cuda_ipc", {"LOOM_TRANSPORT": "^cuda_ipc"}),
                         ("CUDA_VISIBLE_DEVICES= (no GPU visible)", {"CUDA_VISIBLE_DEVICES": ""}),
                         ("LOOM_MEMORY_HOOKS=0", {"LOOM_MEMORY_HOOKS": "0"})):
        run("3. a 2-rank CPU group, ranks forked after import torch: " + title,
            [sys.executable, "-X", "faulthandler", "-c", TWO_RANKS], env=dict(base, **extra))


if __name__ == "__main__":
    pybind_abi()
    bindings()
    groups()
