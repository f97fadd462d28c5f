#!/usr/bin/python3
"""torch.distributed.all_reduce on backend "loom" beside backend "gloo", in one run, as ratios.

For each world size, starts that many processes on this node; each joins three groups and, for
each message size (float32 CPU tensors, sum), times in turn, repeat after repeat:
  loom      dist.all_reduce on backend "loom" (default transports: shared memory on one node)
  loom-tcp  the same with LOOM_TRANSPORT=tcp (like for like with Gloo, which has TCP only)
  gloo      dist.all_reduce on backend "gloo"
  direct    Loom's own all-reduce on the same communicator as "loom", called without
            torch.distributed (loom_torch._C.all_reduce_direct): the backend's overhead is
            loom's time over direct's, minus one
Each time is the slowest rank's mean over a loop of calls; the table shows medians over the
repeats, busbw as nccl-tests computes it (2(n-1)/n x size / time), Loom's busbw over Gloo's
(for sizes <= 1 KiB: Gloo's time over Loom's, i.e. > 1 means Loom is faster) and the overhead.
With --ddp-steps, it then times a DistributedDataParallel training step of a small CNN on
MNIST-shaped data (batch 64 per rank) over each backend.

With --device cuda (PyTorch with CUDA, loom_torch built against it), the tensors are CUDA tensors
(rank r on GPU r mod the GPUs present; several ranks may share one), each loop ends with
torch.cuda.synchronize(), "direct" is left out, and where every rank has a GPU of its own (one rank
on a one-GPU machine) a column "nccl" times backend "nccl" on the same tensors; --ddp-model resnet18
times torchvision's ResNet-18 on synthetic 224x224 images (batch 32 per rank) instead of the CNN.

  /usr/bin/python3 bench/torch_allreduce.py [--ranks 2,4] [--sizes 8,1K,64K,1M,16M,64M]
      [--repeats 5] [--ddp-steps 30] [--device cpu|cuda] [--ddp-model cnn|resnet18] [--build build]
      [--json FILE]

It imports loom_torch from <build>/integrations/torch/lib (built with the project when
python3-torch and libtorch-dev are installed), else from the installed one.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_size(s):
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d%s" % (n // div, unit)
    return str(n)


def iterations(size):
    return max(5, min(2000, int(256e6 / max(size, 64 * 1024) / 4)) if size >= 64 * 1024 else 2000)


def rank_main(rank, world, args, init, out):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    import loom_torch

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    timeout = datetime.timedelta(seconds=300)
    dist.init_process_group("loom", init_method=init, rank=rank, world_size=world, timeout=timeout)
    loom = dist.distributed_c10d._get_default_group()
    os.environ["LOOM_TRANSPORT"] = "tcp"
    loom_tcp = dist.new_group(backend="loom", timeout=timeout)
    del os.environ["LOOM_TRANSPORT"]
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    nccl = None
    if cuda and world <= torch.cuda.device_count():
        nccl = dist.new_group(backend="nccl", timeout=timeout)
    direct_backend = loom._get_backend(torch.device("cpu")) if hasattr(loom, "_get_backend") else loom

    def slowest(seconds):
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        return t.item()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(fn, group, iters):
        fn()  # warm up
        sync()
        dist.barrier(group=gloo)
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        return slowest((time.perf_counter() - start) / iters)

    results = []
    for size in args.sizes:
        t = torch.ones(max(1, size // 4), device=device)
        iters = iterations(size)
        runs = {"loom": [], "loom-tcp": [], "gloo": []}
        if cuda:
            if nccl is not None:
                runs["nccl"] = []
        else:
            runs["direct"] = []
        for _ in range(args.repeats):
            runs["loom"].append(timed(lambda: dist.all_reduce(t, group=loom), loom, iters))
            runs["loom-tcp"].append(timed(lambda: dist.all_reduce(t, group=loom_tcp), loom_tcp, iters))
            runs["gloo"].append(timed(lambda: dist.all_reduce(t, group=gloo), gloo, iters))
            if "direct" in runs:
                runs["direct"].append(timed(lambda: loom_torch._C.all_reduce_direct(direct_backend, t), loom, iters))
            if "nccl" in runs:
                runs["nccl"].append(timed(lambda: dist.all_reduce(t, group=nccl), nccl, iters))
        results.append({"size": size, "iters": iters, **{k: statistics.median(v) for k, v in runs.items()}})

    ddp = {}
    if args.ddp_steps:
        import torch.nn as nn
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel as DDP

        class SmallCNN(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1, self.conv2 = nn.Conv2d(1, 32, 3), nn.Conv2d(32, 64, 3)
                self.fc1, self.fc2 = nn.Linear(64 * 12 * 12, 128), nn.Linear(128, 10)

            def forward(self, x):
                x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
                return self.fc2(F.relu(self.fc1(x.flatten(1))))

        torch.manual_seed(0)
        if args.ddp_model == "resnet18":
            import torchvision

            def make():
                return torchvision.models.resnet18(num_classes=10).to(device)

            x, y = torch.randn(32, 3, 224, 224, device=device), torch.randint(0, 10, (32,), device=device)
        else:
            def make():
                return SmallCNN().to(device)

            x, y = torch.randn(64, 1, 28, 28, device=device), torch.randint(0, 10, (64,), device=device)
        ids = [device.index] if cuda else None
        models = {name: DDP(make(), device_ids=ids, process_group=g) for name, g in (("loom", loom), ("gloo", gloo))}
        opts = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in models.items()}
        steps = {name: [] for name in models}
        for step in range(args.ddp_steps + 3):
            for name, m in models.items():  # interleaved, so that both see the same noise
                dist.barrier(group=gloo)
                start = time.perf_counter()
                opts[name].zero_grad()
                F.cross_entropy(m(x), y).backward()
                opts[name].step()
                sync()
                elapsed = slowest(time.perf_counter() - start)
                if step >= 3:
                    steps[name].append(elapsed)
        params = sum(p.numel() for p in models["loom"].parameters())
        ddp = {"params": params, **{name: statistics.median(v) for name, v in steps.items()}}
    if rank == 0:
        out.put({"ranks": world, "results": results, "ddp": ddp})
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def busbw(size, seconds, n):
    return size / seconds * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--sizes", default="8,1K,64K,1M,16M,64M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ddp-steps", type=int, default=30)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ddp-model", choices=("cnn", "resnet18"), default="cnn")
    parser.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "integrations", "torch", "lib"))
    import torch.multiprocessing as mp

    import loom_torch  # noqa: F401  (fails here, clearly, when the backend is not built)

    ctx = mp.get_context("fork")
    report = []
    for n in [int(r) for r in args.ranks.split(",")]:
        out = ctx.SimpleQueue()
        with tempfile.TemporaryDirectory() as tmp:
            init = "file://" + os.path.join(tmp, "store")
            procs = [ctx.Process(target=rank_main, args=(r, n, args, init, out)) for r in range(n)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(1800)
            if any(p.exitcode != 0 for p in procs):
                sys.exit("torch_allreduce: a rank failed (exit codes %s)" % [p.exitcode for p in procs])
        report.append(out.get())

    print("# torch.distributed.all_reduce, float32 sum, %s tensors; medians of %d repeats; time in us, busbw "
          "in GB/s" % (args.device.upper(), args.repeats))
    last = "direct" if args.device == "cpu" else "nccl"
    print("%5s %8s %10s %7s %10s %7s %10s %7s %10s %7s %10s %9s" % (
        "ranks", "size", "loom", "busbw", "loom-tcp", "busbw", "gloo", "busbw", last, "busbw", "loom/gloo",
        "overhead" if last == "direct" else "nccl/loom"))
    for run in report:
        n = run["ranks"]
        for r in run["results"]:
            s = r["size"]
            ratio = r["gloo"] / r["loom"] if s <= 1024 else busbw(s, r["loom"], n) / max(busbw(s, r["gloo"], n), 1e-12)
            other = r.get(last)
            extra = ("%10.1f %7.2f" % (other * 1e6, busbw(s, other, n))) if other else "%10s %7s" % ("-", "-")
            tail = ("%8.1f%%" % ((r["loom"] / other - 1) * 100) if last == "direct" else "%8.2fx" % (other / r["loom"])
                    ) if other else "%9s" % "-"
            print("%5d %8s %10.1f %7.2f %10.1f %7.2f %10.1f %7.2f %s %9.2fx %s" % (
                n, human(s), r["loom"] * 1e6, busbw(s, r["loom"], n), r["loom-tcp"] * 1e6, busbw(s, r["loom-tcp"], n),
                r["gloo"] * 1e6, busbw(s, r["gloo"], n), extra, ratio, tail))
    if any(run["ddp"] for run in report):
        what = ("ResNet-18, 224x224 (batch 32 per rank)" if args.ddp_model == "resnet18"
                else "small CNN (batch 64 per rank)")
        print("# DDP training step, %s, %s, medians; time in ms" % (what, args.device.upper()))
        print("%5s %10s %10s %10s %10s" % ("ranks", "params", "loom", "gloo", "gloo/loom"))
        for run in report:
            d = run["ddp"]
            print("%5d %10d %10.2f %10.2f %9.2fx" % (run["ranks"], d["params"], d["loom"] * 1e3, d["gloo"] * 1e3,
                                                  d["gloo"] / d["loom"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
