"""Backend "loom" on CUDA tensors: every operation against the references of test_collectives,
ProcessGroupNCCL's stream semantics (ordered after the caller's stream, wait() without blocking the
host, is_completed() once the device has run it), Futures that carry the device, one communicator
shared by a group's CPU and CUDA backends, and DDP with device_ids against Gloo.

Runs where PyTorch has CUDA, a GPU is present and loom_torch was built against PyTorch with CUDA
(the GPU machines); skips with one line elsewhere. Ranks share GPU 0 when there is one GPU.
"""
import os

# torch.cuda.is_available() must not initialise CUDA here: the ranks are forked from this process.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import harness  # noqa: E402
from test_collectives import OPS, reference, same, value  # noqa: E402


def _why_not():
    if int(torch.__version__.split(".")[0]) < 2:
        return "PyTorch %s: CUDA tensors need the 2.x backend" % torch.__version__
    if torch.version.cuda is None:
        return "PyTorch %s has no CUDA" % torch.__version__
    import loom_torch
    if not loom_torch._C.has_cuda:
        return "loom_torch was built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


WHY = _why_not()
pytestmark = pytest.mark.skipif(WHY is not None, reason=str(WHY))

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.uint8]
COUNTS = [0, 1, 7, 100003]


def device(rank):
    torch.cuda.set_device(rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def every_operation(rank, world):
    dev = device(rank)
    for dtype in DTYPES:
        for name, op in OPS.items():
            if name == "avg" and not dtype.is_floating_point:
                continue
            for n in COUNTS:
                t = value(rank, n, dtype, name).to(dev)
                dist.all_reduce(t, op=op)
                same(t.cpu(), reference(world, n, dtype, name), "all_reduce %s %s %d" % (dtype, name, n))
    n = 1021
    for root in range(world):
        t = value(rank, n, torch.float32).to(dev) if rank == root else torch.zeros(n, device=dev)
        dist.broadcast(t, root)
        assert torch.equal(t.cpu(), value(root, n, torch.float32)), "broadcast root %d" % root
        t = value(rank, n, torch.int32).to(dev)
        dist.reduce(t, root, op=dist.ReduceOp.SUM)
        if rank == root:
            assert torch.equal(t.cpu(), reference(world, n, torch.int32, "sum")), "reduce root %d" % root
    mine = value(rank, n, torch.bfloat16).to(dev)
    outs = [torch.empty(n, dtype=torch.bfloat16, device=dev) for _ in range(world)]
    dist.all_gather(outs, mine)
    for r in range(world):
        assert torch.equal(outs[r].cpu(), value(r, n, torch.bfloat16)), "all_gather block %d" % r
    flat = torch.empty(world * n, dtype=torch.bfloat16, device=dev)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat.cpu(), torch.cat([value(r, n, torch.bfloat16) for r in range(world)]))
    # reduce-scatter: block b of rank r's input is value(r, n, salt=b)
    ins = [value(rank, n, torch.float32, salt=b).to(dev) for b in range(world)]
    out = torch.empty(n, device=dev)
    dist.reduce_scatter(out, ins)
    assert torch.equal(out.cpu(), reference(world, n, torch.float32, "sum", salt=rank)), "reduce_scatter"
    out.zero_()
    dist.reduce_scatter_tensor(out, torch.cat(ins))
    assert torch.equal(out.cpu(), reference(world, n, torch.float32, "sum", salt=rank)), "reduce_scatter_tensor"
    # all-to-all, even and uneven: rank r sends (r + 1) * (d + 1) rows to rank d
    src = torch.arange(world * 4, dtype=torch.int64, device=dev) + 100 * rank
    dst = torch.empty_like(src)
    dist.all_to_all_single(dst, src)
    want = torch.cat([torch.arange(rank * 4, rank * 4 + 4) + 100 * r for r in range(world)])
    assert torch.equal(dst.cpu(), want), "all_to_all_single"
    send = [(rank + 1) * (d + 1) for d in range(world)]
    recv = [(r + 1) * (rank + 1) for r in range(world)]
    src = torch.full((sum(send),), rank, dtype=torch.int32, device=dev)
    dst = torch.empty(sum(recv), dtype=torch.int32, device=dev)
    dist.all_to_all_single(dst, src, recv, send)
    assert torch.equal(dst.cpu(), torch.cat([torch.full((recv[r],), r, dtype=torch.int32) for r in range(world)]))
    ins = [torch.full((d + 1,), 10 * rank + d, device=dev) for d in range(world)]
    outs = [torch.empty(rank + 1, device=dev) for _ in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        assert torch.equal(outs[r].cpu(), torch.full((rank + 1,), float(10 * r + rank))), "all_to_all from %d" % r
    # send/recv around the ring, in a batch so that neither side waits for the other
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(n, device=dev)
    ops = [dist.P2POp(dist.isend, value(rank, n, torch.float32).to(dev), right),
           dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(got.cpu(), value(left, n, torch.float32)), "send/recv ring"
    if world > 1:
        if rank == 0:
            dist.send(torch.full((5,), 7.0, device=dev), 1, tag=3)
        elif rank == 1:
            t = torch.empty(5, device=dev)
            dist.recv(t, 0, tag=3)
            assert torch.equal(t.cpu(), torch.full((5,), 7.0))
    # gather and scatter to and from the last rank
    root = world - 1
    gathered = [torch.empty(3, device=dev) for _ in range(world)] if rank == root else None
    dist.gather(torch.full((3,), float(rank), device=dev), gathered, dst=root)
    if rank == root:
        for r in range(world):
            assert torch.equal(gathered[r].cpu(), torch.full((3,), float(r)))
    part = torch.empty(3, device=dev)
    dist.scatter(part, [torch.full((3,), float(r * 2), device=dev) for r in range(world)] if rank == root else None,
                 src=root)
    assert torch.equal(part.cpu(), torch.full((3,), float(rank * 2)))
    # a non-contiguous tensor: every other column of a matrix
    base = torch.zeros(8, 6, device=dev)
    base[:, ::2] = float(rank + 1)
    view = base[:, ::2]
    dist.all_reduce(view)
    assert torch.equal(base[:, ::2].cpu(), torch.full((8, 3), world * (world + 1) / 2.0))
    assert torch.equal(base[:, 1::2].cpu(), torch.zeros(8, 3)), "a non-contiguous result spilled"
    dist.barrier()


@pytest.mark.parametrize("world", [2, 3])
def test_every_operation_on_cuda_tensors(world):
    harness.run(every_operation, world, deadline_s=240, timeout_s=120)


def stream_semantics(rank, world):
    dev = device(rank)
    n = 1 << 20
    x = torch.zeros(n, device=dev)
    dist.all_reduce(x)  # the first call connects and maps: leave it out of the timing
    torch.cuda.synchronize()
    # The input is written after a long kernel on the caller's stream: the all-reduce must wait for
    # it on the device, while the call and wait() return at once on the host.
    cycles = int(1e9)  # about 0.5 s at 2 GHz
    torch.cuda._sleep(cycles)
    x.fill_(rank + 1.0)
    import time
    t0 = time.perf_counter()
    work = dist.all_reduce(x, async_op=True)
    early = work.is_completed()
    work.wait()
    host = time.perf_counter() - t0
    y = x * 2  # on the caller's stream, after wait(): must see the sum
    assert not early, "is_completed() before the device ran the operation"
    assert host < 0.25, "the call and wait() held the host %.3f s (the stream had 0.5 s of work)" % host
    torch.cuda.synchronize()
    want = world * (world + 1) / 2.0
    assert torch.equal(y.cpu(), torch.full((n,), 2 * want)), "the all-reduce did not wait for the caller's stream"
    deadline = time.monotonic() + 10
    while not work.is_completed():
        assert time.monotonic() < deadline, "is_completed() still false 10 s after the device finished"
        time.sleep(0.001)
    assert work.is_success()
    # A side stream: the operation follows that stream's work, and synchronize() orders the next.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        z = torch.full((n,), float(rank), device=dev)
        work = dist.all_reduce(z, async_op=True)
        work.synchronize()
        z2 = z + 1
    torch.cuda.synchronize()
    assert torch.equal(z2.cpu(), torch.full((n,), world * (world - 1) / 2.0 + 1))
    # The Future: its value and a callback chained on it see the result on the device.
    f = torch.full((n,), 1.0, device=dev)
    fut = dist.all_reduce(f, async_op=True).get_future()
    doubled = fut.then(lambda done: done.value()[0] * 2).wait()
    assert torch.equal(doubled.cpu(), torch.full((n,), 2.0 * world))


def test_stream_semantics():
    harness.run(stream_semantics, 2, deadline_s=120, timeout_s=60)


def host_and_device_interleaved(rank, world):
    dev = device(rank)
    backend_cpu = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    backend_cuda = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
    # One communicator serves both: each call keeps its place among the other's.
    assert backend_cpu is not None and backend_cuda is not None
    for i in range(20):
        h = torch.full((17,), float(rank + i))
        d = torch.full((4099,), float(rank - i), device=dev)
        wh = dist.all_reduce(h, async_op=True)
        wd = dist.all_reduce(d, async_op=True)
        wh.wait()
        wd.wait()
        assert torch.equal(h, torch.full((17,), float(sum(r + i for r in range(world)))))
        assert torch.equal(d.cpu(), torch.full((4099,), float(sum(r - i for r in range(world)))))


def test_host_and_device_tensors_in_one_group():
    harness.run(host_and_device_interleaved, 2, deadline_s=120, timeout_s=60)


def ddp_params(rank, world, out_dir, backend_name):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    dev = device(rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 14 * 14, 10)).to(dev)
    group = dist.new_group(backend=backend_name) if backend_name != "loom" else None
    ddp = DDP(model, device_ids=[dev.index], process_group=group, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x = torch.randn(8, 3, 16, 16, generator=gen).to(dev)
        y = torch.randint(0, 10, (8,), generator=gen).to(dev)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    if rank == 0:
        torch.save([p.detach().cpu() for p in model.parameters()], os.path.join(out_dir, backend_name + ".pt"))


def test_ddp_with_device_ids_matches_gloo(tmp_path):
    for backend_name in ("loom", "gloo"):
        harness.run(ddp_params, 2, str(tmp_path), backend_name, deadline_s=180, timeout_s=90)
    loom = torch.load(str(tmp_path / "loom.pt"))
    gloo = torch.load(str(tmp_path / "gloo.pt"))
    for a, b in zip(loom, gloo):
        # Two ranks: every sum has one order, so the parameters agree to the bit.
        assert torch.equal(a, b)
