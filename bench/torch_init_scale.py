#!/usr/bin/env python3
"""One rank of a PyTorch job at scale, for bench/scale's PyTorch rows: the time to
init_process_group(--backend) ("gloo": its full mesh; "loom": Loom's backend, loom_torch on
PYTHONPATH), a first 1-element all-reduce, and --groups new_group calls that cut the job into
groups as init_scale's split does (every rank calls every new_group, as torch.distributed requires;
with Gloo each group's members form its mesh, with Loom they make a group of the default group's
communicator).

  torch_init_scale.py RANK WORLD_SIZE PORT READY_DIR [--groups G] [--backend gloo|loom]

Importing torch takes seconds and the ranks finish it at different times: each rank marks
READY_DIR/<rank> once it has, and the clock starts once every mark is there, so that the figures
are the backend's, not the imports'. Rank 0 prints "torch processes N init_ms first_ms split_ms links
fds ok" (the slowest rank's times; links and descriptors: the most any rank holds after the first
all-reduce: N - 1 links for Gloo's mesh, Loom's own count for Loom), or "torch processes N failed
<why>".
"""
import argparse
import datetime
import os
import sys
import time


def open_descriptors():
    return len(os.listdir("/proc/self/fd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rank", type=int)
    ap.add_argument("size", type=int)
    ap.add_argument("port", type=int)
    ap.add_argument("ready")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--backend", default="gloo", choices=["gloo", "loom"])
    a = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        if a.backend == "loom":
            import loom_torch
    except ImportError as e:
        print(f"torch processes {a.size} failed no torch: {e}", flush=True)
        return 1
    open(os.path.join(a.ready, str(a.rank)), "w").close()
    while len(os.listdir(a.ready)) < a.size:
        time.sleep(0.001)
    fds0 = open_descriptors()
    t0 = time.perf_counter()
    try:
        dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.size,
                                timeout=datetime.timedelta(seconds=600))
        init = time.perf_counter() - t0
        one = torch.ones(1)
        dist.barrier()
        t1 = time.perf_counter()
        dist.all_reduce(one)
        first = time.perf_counter() - t1
        fds = open_descriptors() - fds0
        links = a.size - 1
        if a.backend == "loom":
            links = loom_torch._C.link_count(loom_torch._default_loom_backend())
        dist.barrier()
        t2 = time.perf_counter()
        per = max(1, a.size // max(1, a.groups))
        groups = [dist.new_group(list(range(g, min(g + per, a.size)))) for g in range(0, a.size, per)]
        split = time.perf_counter() - t2
        dist.barrier()
        figures = torch.tensor([init * 1e3, first * 1e3, split * 1e3, links, fds], dtype=torch.float64)
        dist.all_reduce(figures, op=dist.ReduceOp.MAX)
        del groups
        if a.rank == 0:
            i, f, s, links, d = figures.tolist()
            print(f"torch processes {a.size} {i:.1f} {f:.2f} {s:.1f} {links:.0f} {d:.1f} ok", flush=True)
        dist.destroy_process_group()
    except Exception as e:  # a timeout, descriptors or memory running out: reported, not raised
        print(f"torch processes {a.size} failed rank {a.rank}: {str(e).splitlines()[0][:200]}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
