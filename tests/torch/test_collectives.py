"""Every torch.distributed operation on backend "loom", on real processes, checked against
references computed here with plain torch arithmetic in float64/int64 (exact for integers and for
the small-integer float inputs; one rounding for averages).

World sizes 1, 2, 3 (not a power of two), 4 and 8; every dtype PyTorch and Loom share with every
op; counts 0, 1, 7, 31 (prime) and 100003 (large prime); async forms with futures;
non-contiguous tensors; uneven all-to-all.
"""
import pytest
import torch
import torch.distributed as dist

import harness

REDUCE_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                 torch.float64, torch.bool]
MOVE_DTYPES = REDUCE_DTYPES + [torch.int16, torch.complex64]
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
COUNTS = [0, 1, 7, 31, 100003]


def value(rank, n, dtype, op="sum", salt=0):
    """Rank `rank`'s input: small integers, so that every reduction order gives the same bits."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i + rank + salt) % 3 == 0)
    if op == "product":
        v = 1 + (i + rank + salt) % 2  # products stay below 2^8 up to 8 ranks
    else:
        v = ((rank + 1) * (i % 5 + 1) + salt) % 7 + 1  # sums of 8 ranks stay below 64
    if dtype == torch.complex64:
        return torch.complex(v.float(), -v.float())
    return v.to(dtype)


def reference(world, n, dtype, op, salt=0):
    stack = torch.stack([value(r, n, dtype, op, salt).to(torch.float64) for r in range(world)])
    if dtype == torch.bool:
        red = {"sum": stack.amax, "max": stack.amax, "product": stack.amin, "min": stack.amin}[op]
        return red(0).to(torch.bool) if n else torch.zeros(0, dtype=torch.bool)
    if op == "sum":
        out = stack.sum(0)
    elif op == "product":
        out = stack.prod(0)
    elif op == "min":
        out = stack.amin(0) if n else stack.sum(0)
    elif op == "max":
        out = stack.amax(0) if n else stack.sum(0)
    else:
        out = stack.sum(0) / world
    return out.to(dtype)


def same(got, want, what):
    if got.dtype in FLOATS and not torch.equal(got, want):
        # averages: one division, rounded once; allow one unit in the last place of the type
        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6, torch.float64: 1e-12}[got.dtype]
        assert torch.allclose(got.double(), want.double(), rtol=tol, atol=0), what
        return
    assert torch.equal(got, want), "%s: got %s want %s" % (what, got[:8].tolist(), want[:8].tolist())


def check_all_reduce(rank, world):
    for dtype in REDUCE_DTYPES:
        for name, op in OPS.items():
            if name == "avg" and dtype not in FLOATS:
                continue  # averages are for floating point (as in NCCL)
            for n in COUNTS:
                t = value(rank, n, dtype, name)
                dist.all_reduce(t, op=op)
                same(t, reference(world, n, dtype, name), "all_reduce %s %s n=%d" % (dtype, name, n))


def check_async_and_futures(rank, world):
    ts = [value(rank, 1000 + k, torch.float32, salt=k) for k in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    fut = works[-1].get_future().then(lambda f: f.value()[0] * 2)
    for w in works:
        w.wait()
        assert w.is_completed() and w.is_success()
    for k, t in enumerate(ts):
        same(t, reference(world, 1000 + k, torch.float32, "sum", salt=k), "async all_reduce %d" % k)
    same(fut.wait(), reference(world, 1005, torch.float32, "sum", salt=5) * 2, "future chained on all_reduce")
    # a future waited on with no one calling wait() on the Work completes from Loom's own threads
    t = value(rank, 4097, torch.float64)
    got = dist.all_reduce(t, async_op=True).get_future().wait()
    same(got[0], reference(world, 4097, torch.float64, "sum"), "future of all_reduce")


def check_coalesced(rank, world):
    for dtype in (torch.float32, torch.int64):
        ts = [value(rank, n, dtype, salt=n) for n in (1, 0, 7, 31, 1000)]
        dist.all_reduce_coalesced(ts, op=dist.ReduceOp.SUM)
        for n, t in zip((1, 0, 7, 31, 1000), ts):
            same(t, reference(world, n, dtype, "sum", salt=n), "all_reduce_coalesced %s n=%d" % (dtype, n))


def check_broadcast_and_reduce(rank, world):
    for root in range(world):
        for dtype in MOVE_DTYPES:
            for n in (0, 1, 31, 100003):
                t = value(rank, n, dtype, salt=root) if rank == root else torch.zeros(n, dtype=dtype)
                dist.broadcast(t, src=root)
                same(t, value(root, n, dtype, salt=root), "broadcast %s n=%d root %d" % (dtype, n, root))
        for dtype in (torch.int32, torch.float32, torch.bfloat16):
            for name in ("sum", "max"):
                for n in (1, 31, 100003):
                    t = value(rank, n, dtype, name)
                    dist.reduce(t, dst=root, op=OPS[name])
                    if rank == root:
                        same(t, reference(world, n, dtype, name), "reduce %s %s root %d" % (dtype, name, root))


def check_gathers(rank, world):
    all_gather_base = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    reduce_scatter_base = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    for dtype in MOVE_DTYPES:
        for n in (0, 1, 31, 10007):
            outs = [torch.full((n,), 9, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, value(rank, n, dtype))
            for r in range(world):
                same(outs[r], value(r, n, dtype), "all_gather %s n=%d from %d" % (dtype, n, r))
            flat = torch.empty(world * n, dtype=dtype)
            all_gather_base(flat, value(rank, n, dtype))
            same(flat, torch.cat([value(r, n, dtype) for r in range(world)]), "all_gather_base %s n=%d" % (dtype, n))
    for dtype in (torch.int64, torch.float32, torch.float16):
        for name in ("sum", "min", "max"):
            for n in (0, 1, 31, 10007):
                ins = [value(rank, n, dtype, name, salt=p) for p in range(world)]
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, ins, op=OPS[name])
                same(out, reference(world, n, dtype, name, salt=rank), "reduce_scatter %s %s n=%d" % (dtype, name, n))
                out = torch.empty(n, dtype=dtype)
                reduce_scatter_base(out, torch.cat(ins), op=OPS[name])
                same(out, reference(world, n, dtype, name, salt=rank), "reduce_scatter_base %s n=%d" % (dtype, n))


def check_gather_scatter(rank, world):
    for root in range(world):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.complex64):
            for n in (0, 1, 31, 10007):
                outs = [torch.zeros(n, dtype=dtype) for _ in range(world)] if rank == root else None
                dist.gather(value(rank, n, dtype, salt=root), gather_list=outs, dst=root)
                if rank == root:
                    for r in range(world):
                        same(outs[r], value(r, n, dtype, salt=root), "gather %s n=%d from %d" % (dtype, n, r))
                ins = [value(root, n, dtype, salt=p) for p in range(world)] if rank == root else None
                out = torch.zeros(n, dtype=dtype)
                dist.scatter(out, scatter_list=ins, src=root)
                same(out, value(root, n, dtype, salt=rank), "scatter %s n=%d root %d" % (dtype, n, root))


def block(src, dst, rows, cols, dtype):
    """What rank src sends rank dst in the all-to-all tests."""
    return (torch.arange(rows * cols).reshape(rows, cols) + 1000 * src + 100 * dst).to(dtype)


def check_all_to_all(rank, world):
    for dtype in (torch.float32, torch.int8, torch.complex64):
        # equal splits
        inp = torch.cat([block(rank, p, 2, 3, dtype) for p in range(world)])
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        same(out, torch.cat([block(p, rank, 2, 3, dtype) for p in range(world)]), "all_to_all_single %s" % dtype)
        # uneven splits: rank r sends (r + p) % 3 rows to rank p (some empty)
        rows = lambda s, d: (s + d) % 3  # noqa: E731
        inp = torch.cat([block(rank, p, rows(rank, p), 3, dtype) for p in range(world)])
        out = torch.empty(sum(rows(p, rank) for p in range(world)), 3, dtype=dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=[rows(p, rank) for p in range(world)],
                               input_split_sizes=[rows(rank, p) for p in range(world)])
        same(out, torch.cat([block(p, rank, rows(p, rank), 3, dtype) for p in range(world)]),
             "all_to_all_single uneven %s" % dtype)
        # the list form, uneven
        outs = [torch.empty(rows(p, rank), 3, dtype=dtype) for p in range(world)]
        dist.all_to_all(outs, [block(rank, p, rows(rank, p), 3, dtype) for p in range(world)])
        for p in range(world):
            same(outs[p], block(p, rank, rows(p, rank), 3, dtype), "all_to_all list from %d" % p)


def check_non_contiguous(rank, world):
    base = value(rank, 12 * 5, torch.float32).reshape(12, 5)
    t = base.t()  # a transposed view: not contiguous
    assert not t.is_contiguous()
    dist.all_reduce(t)
    same(base, reference(world, 60, torch.float32, "sum").reshape(12, 5), "all_reduce of a non-contiguous view")
    m = torch.zeros(6, 8)
    col = m[:, 3]  # strided
    if rank == 0:
        col.copy_(torch.arange(6.0))
    dist.broadcast(col, src=0)
    same(m[:, 3], torch.arange(6.0), "broadcast into a strided column")
    assert m[:, 2].eq(0).all() and m[:, 4].eq(0).all(), "broadcast wrote outside the view"
    if world > 1:
        r = torch.zeros(4, 4)
        if rank == 0:
            dist.send(torch.arange(4.0) + 10, dst=1)
        elif rank == 1:
            dist.recv(r[:, 1], src=0)
            same(r[:, 1], torch.arange(4.0) + 10, "recv into a strided column")
            assert r[:, 0].eq(0).all()


def check_point_to_point(rank, world):
    if world == 1:
        return
    right, left = (rank + 1) % world, (rank - 1) % world
    for n, dtype in ((10, torch.float32), (0, torch.int64), (1 << 20, torch.float64), (7, torch.int16)):
        for tag in (0, 7):
            out = value(rank, n, dtype, salt=tag)
            got = torch.zeros(n, dtype=dtype)
            works = [dist.isend(out, right, tag=tag), dist.irecv(got, left, tag=tag)]
            for w in works:
                w.wait()
            same(got, value(left, n, dtype, salt=tag), "ring send/recv %s n=%d tag %d" % (dtype, n, tag))
    # batch_isend_irecv, as pipeline-parallel code uses it
    got = torch.zeros(100)
    ops = [dist.P2POp(dist.isend, torch.full((100,), float(rank)), right),
           dist.P2POp(dist.irecv, got, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(got, torch.full((100,), float(left)), "batch_isend_irecv")


def body_full(rank, world):
    check_all_reduce(rank, world)
    check_async_and_futures(rank, world)
    check_coalesced(rank, world)
    check_broadcast_and_reduce(rank, world)
    check_gathers(rank, world)
    check_gather_scatter(rank, world)
    check_all_to_all(rank, world)
    check_non_contiguous(rank, world)
    check_point_to_point(rank, world)
    dist.barrier()


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_operation(world):
    harness.run(body_full, world, deadline_s=400)


def body_eight(rank, world):
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for name in ("sum", "max", "product"):
            for n in (0, 1, 31, 100003):
                t = value(rank, n, dtype, name)
                dist.all_reduce(t, op=OPS[name])
                same(t, reference(world, n, dtype, name), "all_reduce %s %s n=%d" % (dtype, name, n))
    check_gathers(rank, world)
    check_all_to_all(rank, world)
    check_point_to_point(rank, world)
    dist.barrier()


def test_eight_ranks():
    harness.run(body_eight, 8, deadline_s=400)


def body_gather_links(rank, world):
    import loom_torch
    backend = loom_torch._default_loom_backend()
    before = loom_torch._C.link_count(backend)
    root = 3
    outs = [torch.zeros(5, dtype=torch.int64) for _ in range(world)] if rank == root else None
    dist.gather(torch.full((5,), rank, dtype=torch.int64), gather_list=outs, dst=root)
    if rank == root:
        for r in range(world):
            same(outs[r], torch.full((5,), r, dtype=torch.int64), "gather from %d" % r)
    out = torch.zeros(5, dtype=torch.int64)
    ins = [torch.full((5,), 10 * r, dtype=torch.int64) for r in range(world)] if rank == root else None
    dist.scatter(out, scatter_list=ins, src=root)
    same(out, torch.full((5,), 10 * rank, dtype=torch.int64), "scatter to %d" % rank)
    # Loom's gather and scatter: the root linked its peers, every other rank the root alone.
    links = loom_torch._C.link_count(backend)
    assert links - before <= (world - 1 if rank == root else 1), (rank, before, links)
    assert links <= (world - 1 if rank == root else 1 + before), (rank, before, links)
    assert links >= 1, (rank, before, links)


def test_gather_and_scatter_link_the_root_to_its_peers_only():
    # 12 ranks: links are made on first use (above 8 ranks).
    harness.run(body_gather_links, 12, deadline_s=300)


def body_env_init(rank, world):
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [world] * 3
    import loom_torch
    # The link the all-reduce went over (two ranks: linked at init).
    assert loom_torch._C.link_count(loom_torch._default_loom_backend()) == world - 1


def test_tcp_init_method():
    harness.run(body_env_init, 2, init="tcp")
