"""Reproducible mode through torch.distributed (docs/reproducibility.md): with LOOM_REPRODUCIBLE=1 in
the ranks' environment, all_reduce, reduce and reduce_scatter_tensor of floats return the canonical
tree over rank order, computed here with plain torch arithmetic ((x0 + x1) + (x2 + x3) for 4 ranks,
half precision widened to float32 and rounded once), bit for bit, whatever algorithm LOOM_ALGO
forces and over TCP or shared memory; the data spreads over 2^-20 .. 2^20, where other orders give
other bits.
"""
import pytest
import torch
import torch.distributed as dist

import harness

COUNT = 70001


def inputs(world, dtype, op):
    """Every rank's input, the same on every rank (seeded per rank), as `dtype`."""
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(1000 + r)
        mant = torch.rand(COUNT, generator=g, dtype=torch.float64) + 1.0
        sign = torch.randint(0, 2, (COUNT,), generator=g) * 2 - 1
        if op == "product":
            v = mant * sign * 0.75
        else:
            span = 6 if dtype == torch.float16 else 20
            v = torch.ldexp(mant * sign, torch.randint(-span, span + 1, (COUNT,), generator=g))
        out.append(v.to(dtype))
    return out


def canonical(xs, op):
    """The canonical tree over rank order, in float32 for the half types, in the type otherwise."""
    acc = [x.float() if x.dtype in (torch.float16, torch.bfloat16) else x.clone() for x in xs]

    def tree(lo, k):
        if k == 1:
            return acc[lo]
        p = 1
        while p * 2 < k:
            p *= 2
        a, b = tree(lo, p), tree(lo + p, k - p)
        return a * b if op == "product" else a + b

    v = tree(0, len(acc))
    if op == "avg":
        v = v / len(acc)
    return v.to(xs[0].dtype)


OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT}


def same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def body_reproducible(rank, world):
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        for name, op in OPS.items():
            xs = inputs(world, dtype, name)
            want = canonical(xs, name)
            t = xs[rank].clone()
            dist.all_reduce(t, op=op)
            assert same_bits(t, want), f"all_reduce {dtype} {name}"
            t = xs[rank].clone()
            dist.reduce(t, dst=world - 1, op=op)
            if rank == world - 1:
                assert same_bits(t, want), f"reduce {dtype} {name}"
            block = COUNT // world
            out = torch.empty(block, dtype=dtype)
            dist.reduce_scatter_tensor(out, xs[rank][:block * world].clone(), op=op)
            assert same_bits(out, want[rank * block:(rank + 1) * block]), f"reduce_scatter {dtype} {name}"


@pytest.mark.parametrize("links,algo", [("shm", ""), ("tcp", "ring"), ("tcp", "rd"), ("tcp", "dbtree")])
def test_reproducible_mode_gives_the_canonical_tree(monkeypatch, links, algo):
    monkeypatch.setenv("LOOM_REPRODUCIBLE", "1")
    monkeypatch.setenv("LOOM_ALGO", algo)
    if links == "tcp":
        monkeypatch.setenv("LOOM_TRANSPORT", "tcp")
    else:
        monkeypatch.delenv("LOOM_TRANSPORT", raising=False)
    harness.run(body_reproducible, 4)


def body_default_differs(rank, world, results):
    xs = inputs(world, torch.float32, "sum")
    t = xs[rank].clone()
    dist.all_reduce(t)
    if rank == 0:
        with open(results, "a") as f:
            f.write("%d\n" % (0 if same_bits(t, canonical(xs, "sum")) else 1))


def test_without_the_mode_the_ring_gives_other_bits(monkeypatch, tmp_path):
    # The data tells orders apart: the ring's order is not the canonical tree's.
    monkeypatch.delenv("LOOM_REPRODUCIBLE", raising=False)
    monkeypatch.setenv("LOOM_ALGO", "ring")
    monkeypatch.setenv("LOOM_TRANSPORT", "tcp")
    results = str(tmp_path / "differs")
    harness.run(body_default_differs, 4, results)
    with open(results) as f:
        assert f.read().strip() == "1"
