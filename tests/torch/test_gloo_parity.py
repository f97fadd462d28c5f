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
