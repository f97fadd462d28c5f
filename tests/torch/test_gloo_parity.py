"""What a script written for Gloo does, run unchanged on Loom: each test runs the same body on
backend "gloo" and on backend "loom" (same inputs), and checks both against the same expectations,
exceptions included, on 2, 3 and 4 ranks.
"""
import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import harness

BACKENDS = ["gloo", "loom"]
TORCH_MAJOR = int(torch.__version__.split(".")[0])
WORLDS = [2, 3, 4]


def body_recv_any_source(rank, world):
    # Every other rank sends rank 0 two tensors on tag 0 (its rank, then its rank * 10); rank 0
    # receives them all with dist.recv / dist.irecv without src, in whatever order they come.
    n = 1000
    if rank != 0:
        dist.send(torch.full((n,), float(rank)), 0)
        dist.send(torch.full((n,), float(rank * 10)), 0)
    else:
        got = {}
        for k in range(2 * (world - 1)):
            t = torch.empty(n)
            if k % 2 == 0:
                src = dist.recv(t)  # returns the sender
            else:
                work = dist.irecv(t)
                work.wait()
                src = work._source_rank()
            assert 1 <= src < world, src
            assert torch.all(t == t[0]), "a message mixed from several senders"
            got.setdefault(src, []).append(t[0].item())
        # each sender's two messages, in the order it sent them
        assert got == {r: [float(r), float(r * 10)] for r in range(1, world)}, got
    dist.barrier()
    # A receive from any source mixed with one named for the sender, on another tag.
    if rank == 1:
        for v in (1.0, 2.0):
            dist.send(torch.full((4,), v), 0, tag=7)
    elif rank == 0:
        a = torch.zeros(4)
        b = torch.zeros(4)
        wa = dist.irecv(a, tag=7)
        wb = dist.irecv(b, src=1, tag=7)
        wa.wait()
        wb.wait()
        assert wa._source_rank() == 1
        assert sorted([a[0].item(), b[0].item()]) == [1.0, 2.0]
    dist.barrier()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", WORLDS)
def test_recv_from_any_source(backend, world):
    harness.run(body_recv_any_source, world, backend=backend)


def body_recv_any_source_errors(rank, world):
    # The source rank of a send's Work is asked for: both backends refuse.
    if rank == 1:
        work = dist.isend(torch.ones(3), 0)
        with pytest.raises(RuntimeError):
            work._source_rank()
        work.wait()
    elif rank == 0:
        t = torch.empty(3)
        assert dist.recv(t) == 1
    dist.barrier()


@pytest.mark.parametrize("backend", BACKENDS)
def test_recv_from_any_source_errors(backend):
    harness.run(body_recv_any_source_errors, 2, backend=backend)


def body_all_gather_coalesced(rank, world):
    # (torch.distributed wants one dtype in the list)
    inputs = [torch.full((2, 3), float(rank)), torch.arange(5.0) + rank * 100, torch.tensor(rank * 0.5),
              torch.zeros(0)]
    outputs = [[torch.empty_like(t) for t in inputs] for _ in range(world)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(world):
        assert torch.equal(outputs[r][0], torch.full((2, 3), float(r))), (r, outputs[r][0])
        assert torch.equal(outputs[r][1], torch.arange(5.0) + r * 100), (r, outputs[r][1])
        assert outputs[r][2].item() == r * 0.5
        assert outputs[r][3].numel() == 0
    # Output lists that do not match the inputs: refused on every rank, with RuntimeError.
    wrong = [[torch.empty(3) for _ in inputs] for _ in range(world)]
    with pytest.raises(RuntimeError):
        dist.all_gather_coalesced(wrong, inputs)
    with pytest.raises(RuntimeError):
        dist.all_gather_coalesced(outputs[:-1], inputs)
    dist.barrier()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", WORLDS)
def test_all_gather_coalesced(backend, world):
    harness.run(body_all_gather_coalesced, world, backend=backend)


def body_monitored_barrier(rank, world):
    for wait_all in (False, True):
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=20), wait_all_ranks=wait_all)
    dist.barrier()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", WORLDS)
def test_monitored_barrier(backend, world):
    harness.run(body_monitored_barrier, world, backend=backend)


def body_monitored_barrier_missing(rank, world, wait_all):
    # Every rank but 0 and 1 stays away; rank 0 names them with RuntimeError.
    path = os.path.join(os.environ["LOOM_TEST_TMP"], "spoken")
    if rank >= 2:
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=wait_all)
        raise AssertionError("rank %d passed a barrier ranks never came to" % rank)
    except RuntimeError as e:
        if rank == 0:
            missing = list(range(2, world))
            if wait_all and len(missing) > 1:
                want = "Ranks %s failed to pass monitoredBarrier" % ", ".join(map(str, missing))
            else:
                want = "Rank 2 failed to pass monitoredBarrier"
            assert want in str(e), str(e)
            open(path, "w").close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wait_all", [False, True])
def test_monitored_barrier_names_missing_ranks(backend, wait_all, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_TEST_TMP", str(tmp_path))
    harness.run(body_monitored_barrier_missing, 4, wait_all, backend=backend, deadline_s=60)


def body_sequence_numbers(rank, world):
    pg = dist.distributed_c10d._get_default_group()
    if TORCH_MAJOR >= 2:
        # PyTorch 2.x's ProcessGroup answers only for its built-in backends; the backend answers for itself
        pg = pg._get_backend(torch.device("cpu"))
    t = torch.ones(4)
    seen = []
    for _ in range(3):
        before = pg._get_sequence_number_for_group()
        dist.all_reduce(t)
        dist.broadcast(t, 0)
        seen.append(pg._get_sequence_number_for_group() - before)
    assert seen == [2, 2, 2], seen
    mine = torch.tensor([pg._get_sequence_number_for_group()], dtype=torch.float64)
    every = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, mine)
    assert all(torch.equal(e, every[0]) for e in every), every


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequence_numbers(backend):
    harness.run(body_sequence_numbers, 3, backend=backend)


def body_object_collectives(rank, world):
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "name": "r%d" % rank, "list": list(range(rank))})
    assert objs == [{"rank": r, "name": "r%d" % r, "list": list(range(r))} for r in range(world)], objs
    box = [("from root", 42), None] if rank == 0 else [None, None]
    dist.broadcast_object_list(box, src=0)
    assert box == [("from root", 42), None], box
    gathered = [None] * world if rank == 1 else None
    dist.gather_object(rank * 3, gathered, dst=1)
    if rank == 1:
        assert gathered == [r * 3 for r in range(world)], gathered
    out = [None]
    dist.scatter_object_list(out, ["for %d" % r for r in range(world)] if rank == 0 else None, src=0)
    assert out == ["for %d" % rank], out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", WORLDS)
def test_object_collectives(backend, world):
    harness.run(body_object_collectives, world, backend=backend)


def body_subgroups(rank, world):
    # Overlapping groups, ranks given in any order, created in the same order on every rank.
    evens = dist.new_group([r for r in range(world) if r % 2 == 0][::-1])
    lasts = dist.new_group([world - 1, world - 2])
    everyone = dist.new_group(list(range(world))[::-1])
    t = torch.tensor([float(rank + 1)])
    if rank % 2 == 0:
        dist.all_reduce(t, group=evens)
        assert t.item() == sum(r + 1 for r in range(world) if r % 2 == 0), t
    t = torch.tensor([float(rank + 1)])
    if rank >= world - 2:
        dist.all_reduce(t, group=lasts)
        assert t.item() == (world - 1) + world, t
        b = torch.tensor([float(rank)])
        dist.broadcast(b, src=world - 1, group=lasts)  # src is a global rank
        assert b.item() == world - 1
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=everyone)
    assert t.item() == world * (world + 1) / 2
    assert dist.get_rank(everyone) == rank  # PyTorch orders a group's ranks
    for g in (evens, lasts, everyone):
        if dist.get_rank(g) >= 0:
            dist.barrier(group=g)
    harness.keep_gloo_groups(dist, [lasts])
    dist.destroy_process_group(lasts)
    dist.barrier()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", WORLDS)
def test_subgroups(backend, world):
    harness.run(body_subgroups, world, backend=backend)


def _save_replicated(rank, world, params, out_dir):
    """Checks that every replica holds the same parameters; rank 0 saves them for the comparison."""
    every = [torch.zeros_like(params) for _ in range(world)]
    dist.all_gather(every, params)
    assert all(torch.equal(e, every[0]) for e in every), "replicas differ"
    if rank == 0:
        torch.save(params, os.path.join(out_dir, "params.pt"))


def _compare_training(tmp_path, body, *args, rtol, atol):
    """Trains with `body` on 3 ranks on Gloo, then on Loom, and compares the parameters."""
    results = {}
    for backend in BACKENDS:
        out = tmp_path / backend
        out.mkdir()
        harness.run(body, 3, *args, str(out), backend=backend)
        results[backend] = torch.load(str(out / "params.pt"))
    assert torch.allclose(results["loom"], results["gloo"], rtol=rtol, atol=atol), \
        (results["loom"] - results["gloo"]).abs().max()


def _ddp_run(rank, world, steps=4, **ddp_kwargs):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    net = torch.nn.ModuleDict({"model": model})
    if ddp_kwargs.get("find_unused_parameters"):
        net["unused"] = torch.nn.Linear(4, 4)  # never in the graph: find_unused_parameters copes

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net["model"](x)

    hook = ddp_kwargs.pop("hook", None)
    ddp = DDP(Wrapper(), **ddp_kwargs)
    if hook is not None:
        hook(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(5, 8, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])


DDP_VARIANTS = {
    "find_unused": dict(find_unused_parameters=True),
    "static_graph": dict(static_graph=True),
    "bucket_view": dict(gradient_as_bucket_view=True, bucket_cap_mb=0.0005),
}


def body_ddp_variant(rank, world, variant, out_dir):
    params = _ddp_run(rank, world, **dict(DDP_VARIANTS[variant]))
    _save_replicated(rank, world, params, out_dir)


@pytest.mark.parametrize("variant", sorted(DDP_VARIANTS))
def test_ddp_variants_match_gloo(variant, tmp_path):
    _compare_training(tmp_path, body_ddp_variant, variant, rtol=1e-5, atol=1e-6)


def _register_hook(name):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    def apply(ddp):
        if name == "allreduce":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif name == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif name == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                start_powerSGD_iter=2, random_seed=0)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return apply


def body_ddp_hook(rank, world, name, out_dir):
    params = _ddp_run(rank, world, hook=_register_hook(name))
    _save_replicated(rank, world, params, out_dir)


# bf16_compress_hook: PyTorch refuses it on every backend, Gloo's as well, without CUDA 11+ and NCCL
# 2.10+ in its build (1.13: on every backend but NCCL's).
BF16_HOOK = TORCH_MAJOR >= 2 and torch.cuda.is_available() and torch.cuda.nccl.version() >= (2, 10)


@pytest.mark.parametrize("name", ["allreduce", "fp16", "powersgd"] + (["bf16"] if BF16_HOOK else []))
def test_ddp_comm_hooks_match_gloo(name, tmp_path):
    _compare_training(tmp_path, body_ddp_hook, name, rtol=1e-4, atol=1e-5)


def body_ddp_join(rank, world, out_dir):
    # Uneven inputs: rank r has 3 + r batches; join() shadows the collectives of those that ran out.
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(7 + rank)
    with Join([model]):
        for _ in range(3 + rank):
            loss = model(torch.randn(4, 6, generator=g)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    _save_replicated(rank, world, params, out_dir)


def test_ddp_join_matches_gloo(tmp_path):
    _compare_training(tmp_path, body_ddp_join, rtol=1e-5, atol=1e-6)


def body_work_wait_timeout(rank, world):
    # A receive nobody sends: work.wait(timeout) raises RuntimeError on both backends.
    if rank == 0:
        t = torch.zeros(2)
        work = dist.irecv(t, src=1, tag=99)
        with pytest.raises(RuntimeError):
            work.wait(datetime.timedelta(milliseconds=300))
    # Rank 1 stays until rank 0 is done: Gloo's full-mesh connect can return on one rank while the
    # other is still in its handshake, and a rank that exits at once then fails the other's init.
    # (Through the store: Loom, like NCCL, takes a timed-out wait as the end of the communicator.)
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("wait_timeout_done", "1")
    else:
        store.wait(["wait_timeout_done"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_work_wait_with_a_timeout(backend):
    harness.run(body_work_wait_timeout, 2, backend=backend)


def body_profiler(rank, world):
    from torch.profiler import ProfilerActivity, profile
    t = torch.ones(16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
    names = {e.name for e in prof.events()}
    backend = dist.get_backend()
    assert any("all_reduce" in n for n in names), sorted(names)
    assert any("broadcast" in n for n in names), sorted(names)
    assert any(backend in n for n in names), (backend, sorted(names))


@pytest.mark.parametrize("backend", BACKENDS)
def test_profiler_records_collectives(backend):
    harness.run(body_profiler, 2, backend=backend)


def _sparse_input(rank, world, dtype, dense_cols):
    # Rank r holds entries at rows r, r+1, ..., some shared with other ranks; the last rank none.
    n = 0 if rank == world - 1 else 3 + rank
    rows = torch.tensor([(rank + k) % 7 for k in range(n)], dtype=torch.int64)
    cols = torch.tensor([(2 * k + rank) % 5 for k in range(n)], dtype=torch.int64)
    if dense_cols == 0:
        indices = torch.stack([rows, cols])
        values = torch.arange(1, n + 1, dtype=dtype) * (rank + 1)
        size = (7, 5)
    else:
        indices = rows.unsqueeze(0)
        values = (torch.arange(n * dense_cols, dtype=dtype).reshape(n, dense_cols) + 1) * (rank + 1)
        size = (7, dense_cols)
    # uncoalesced on purpose: a repeated index
    return torch.sparse_coo_tensor(torch.cat([indices, indices[:, :1]], 1) if n else indices,
                                   torch.cat([values, values[:1]]) if n else values, size)


def body_sparse_all_reduce(rank, world):
    for dtype in (torch.float32, torch.float64, torch.int64):
        for dense_cols in (0, 3):
            t = _sparse_input(rank, world, dtype, dense_cols)
            expected = sum(_sparse_input(r, world, dtype, dense_cols).to_dense() for r in range(world))
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            assert t.is_sparse
            assert torch.equal(t.to_dense(), expected), (dtype, dense_cols, t.to_dense(), expected)
            result = work.result()[0]
            assert torch.equal(result.to_dense(), expected)
    # shapes that differ between ranks: RuntimeError on every rank
    bad = torch.sparse_coo_tensor(torch.zeros(2, 1, dtype=torch.int64), torch.ones(1), (4, 4 + rank))
    if world > 1:
        with pytest.raises(RuntimeError):
            dist.all_reduce(bad)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", WORLDS)
def test_sparse_all_reduce(backend, world):
    harness.run(body_sparse_all_reduce, world, backend=backend)


def body_ddp_sparse_embedding(rank, world, out_dir):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(50, 8, sparse=True)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, ids):
            return self.head(self.embedding(ids).mean(1))

    model = DDP(Model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(30 + rank)
    for _ in range(5):
        ids = torch.randint(0, 50, (6, 4), generator=g)
        loss = model(ids).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    _save_replicated(rank, world, params, out_dir)


def test_ddp_sparse_embedding_matches_gloo(tmp_path):
    _compare_training(tmp_path, body_ddp_sparse_embedding, rtol=1e-5, atol=1e-6)


def _coalesced(async_ops, calls):
    """Makes each of `calls` inside one dist._coalescing_manager, then waits for them."""
    with dist._coalescing_manager(async_ops=async_ops) as cm:
        for call in calls:
            call()
    if async_ops:
        cm.wait()


def body_coalescing_manager(rank, world, async_ops):
    # PyTorch 2.x's fast path: all-reduces, all_gather_into_tensor and reduce_scatter_tensor called
    # inside the manager go to the backend as one coalesced call each.
    total = world * (world + 1) // 2
    sizes = [1, 7, 31]
    ts = [torch.full((n,), float(rank + 1 + i)) for i, n in enumerate(sizes)]
    _coalesced(async_ops, [lambda t=t: dist.all_reduce(t) for t in ts])
    for i, (t, n) in enumerate(zip(ts, sizes)):
        assert torch.equal(t, torch.full((n,), float(total + world * i))), (i, t)

    ins = [torch.arange(n, dtype=torch.float32) + 100 * rank for n in sizes]
    outs = [torch.empty(n * world) for n in sizes]
    _coalesced(async_ops, [lambda o=o, i=i: dist.all_gather_into_tensor(o, i) for o, i in zip(outs, ins)])
    for o, n in zip(outs, sizes):
        assert torch.equal(o, torch.cat([torch.arange(n, dtype=torch.float32) + 100 * r for r in range(world)])), o

    ins = [torch.arange(n * world, dtype=torch.float32) * (rank + 1) for n in sizes]
    outs = [torch.empty(n) for n in sizes]
    _coalesced(async_ops, [lambda o=o, i=i: dist.reduce_scatter_tensor(o, i) for o, i in zip(outs, ins)])
    for o, n in zip(outs, sizes):
        assert torch.equal(o, torch.arange(n * world, dtype=torch.float32).narrow(0, rank * n, n) * total), o


@pytest.mark.skipif(TORCH_MAJOR < 2, reason="dist._coalescing_manager's fast path is PyTorch 2.x's")
@pytest.mark.parametrize("async_ops", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 3])
def test_coalescing_manager(backend, world, async_ops):
    harness.run(body_coalescing_manager, world, async_ops, backend=backend)


def body_coalesced_point_to_point(rank, world):
    # Sends and receives inside the manager with a device: posted as one Loom group at its end
    # (what batch_isend_irecv does for CUDA tensors, and on CPU tensors where PyTorch asks the
    # backend's supports_coalescing); each call's own Work completes with the group.
    right, left = (rank + 1) % world, (rank - 1) % world
    base = torch.zeros(6, 4)
    got = base[:, ::2]  # not contiguous: received into a copy, copied back
    any_source = torch.empty(3)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        works = [dist.isend(torch.full((6, 2), float(rank)), right), dist.irecv(got, left),
                 dist.isend(torch.full((3,), 10.0 + rank), right, tag=5), dist.irecv(any_source, tag=5)]
    cm.wait()
    for w in works:
        w.wait()
    assert torch.equal(base[:, ::2], torch.full((6, 2), float(left))), base
    assert torch.equal(base[:, 1::2], torch.zeros(6, 2)), base
    assert torch.equal(any_source, torch.full((3,), 10.0 + left)), any_source


# Loom only: Gloo has no startCoalescing.
@pytest.mark.skipif(TORCH_MAJOR < 2, reason="dist._coalescing_manager is PyTorch 2.x's")
@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_point_to_point(world):
    harness.run(body_coalesced_point_to_point, world)


def body_collectives_timing(rank, world):
    pg = dist.distributed_c10d._get_default_group()
    pg._enable_collectives_timing()
    works = [dist.all_reduce(torch.ones(1 << 16), async_op=True), dist.broadcast(torch.ones(8), 0, async_op=True)]
    for w in works:
        w.wait()
        assert 0.0 <= w._get_duration() < 60000.0, w._get_duration()


# Loom only: Gloo (2.6) takes _enable_collectives_timing() but its Works then answer _get_duration()
# with "This Backend doesn't support getDuration".
@pytest.mark.skipif(TORCH_MAJOR < 2, reason="ProcessGroup._enable_collectives_timing is PyTorch 2.x's")
def test_collectives_timing():
    harness.run(body_collectives_timing, 2)


def body_new_subgroups(rank, world):
    # Equal subgroups of two consecutive ranks each, as model-parallel code builds them.
    group, groups = dist.new_subgroups(group_size=2)
    assert len(groups) == world // 2
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=group)
    first = rank - rank % 2
    assert t.item() == first + first + 1, t
    dist.barrier()


@pytest.mark.skipif(TORCH_MAJOR < 2, reason="PyTorch 1.13's new_subgroups refuses to run without CUDA, on every backend")
@pytest.mark.parametrize("backend", BACKENDS)
def test_new_subgroups(backend):
    harness.run(body_new_subgroups, 4, backend=backend)
