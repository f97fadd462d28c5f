"""Wrong use and failures on backend "loom": clear errors, never a hang or corrupted data.

Ranks calling different collectives, a rank that never calls, a rank that dies; bad tensors,
dtypes, ops, ranks and split sizes; and a clean exit right after a send.
"""
import os
import time

import torch
import torch.distributed as dist

import harness


def raises(fn, *needles):
    try:
        fn()
    except Exception as e:  # noqa: B902 - RuntimeError, TypeError or ValueError, as torch maps them
        text = str(e)
        for n in needles:
            assert n in text, "expected %r in the error, got: %s" % (n, text)
        return text
    raise AssertionError("no error raised; expected one mentioning %s" % (needles,))


def body_mismatch(rank, world):
    t = torch.ones(100)
    start = time.monotonic()
    if rank == 0:
        text = raises(lambda: dist.all_reduce(t), "broadcast", "all_reduce")
    else:
        text = raises(lambda: dist.broadcast(t, src=0), "broadcast", "all_reduce")
    assert time.monotonic() - start < 10, "the mismatch was found only at the deadline: " + text


def test_mismatched_collectives_fail_every_rank_clearly():
    harness.run(body_mismatch, 2, timeout_s=30, deadline_s=60)


def body_missing_rank(rank, world):
    if rank == 1:
        time.sleep(6)  # never calls the collective (and stays alive past rank 0's deadline)
        return
    t = torch.ones(10)
    raises(lambda: dist.all_reduce(t), "timed out", "rank 1")


def test_a_rank_that_never_calls_is_named_at_the_deadline():
    harness.run(body_missing_rank, 2, timeout_s=3, deadline_s=60)


def body_dead_peer(rank, world):
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    if rank == 1:
        os._exit(0)  # dies without a word
    start = time.monotonic()
    raises(lambda: [dist.all_reduce(t) for _ in range(100)], "rank 1")
    assert time.monotonic() - start < 20


def test_a_dead_peer_is_named():
    harness.run(body_dead_peer, 2, timeout_s=60, deadline_s=30)


def body_bad_input(rank, world):
    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(8)
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), "cannot reduce", "Short")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND), "not supported")
    raises(lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG), "AVG of bool")
    raises(lambda: pg.send([t], 7, 0).wait(), "destination rank 7 is out of range")
    raises(lambda: pg.recv([t], -1, 0).wait(), "source rank -1 is out of range")
    raises(lambda: pg.send([t], 1 - rank, -3).wait(), "tag -3 is negative")
    raises(lambda: pg.allreduce([t, t]).wait(), "one tensor per call")
    raises(lambda: dist.all_gather([torch.ones(8)], t), "output tensors")
    raises(lambda: dist.all_gather([torch.ones(8), torch.ones(9)], t), "elements")
    raises(lambda: dist.all_to_all_single(torch.empty(4, 2), torch.empty(4, 2), [1, 1], [3, 3]), "add up to")
    raises(lambda: dist.all_to_all_single(torch.empty(3), torch.empty(3)), "divisible")
    raises(lambda: dist.all_reduce_coalesced([torch.ones(2), torch.ones(2, dtype=torch.float64)]), "dtypes")
    # none of these reached the other ranks: the group still works
    dist.all_reduce(t)
    assert t.eq(world).all()
    # a receive whose tensor is larger than the message fails (the sizes of a send and its recv match)
    if rank == 0:
        dist.send(torch.ones(4), dst=1)
    else:
        raises(lambda: dist.recv(torch.zeros(6), src=0), "expected 24 bytes")


def test_bad_input_gets_a_clear_error():
    harness.run(body_bad_input, 2)


def body_exit_after_send(rank, world):
    if rank == 0:
        dist.send(torch.arange(10.0), dst=1)
        dist.send(torch.full((1 << 20,), 3.0), dst=1)  # 4 MiB: past the eager sizes
        return  # leaves at once: destroy_process_group, process exit
    time.sleep(1.5)  # rank 0 is gone by now
    a, b = torch.zeros(10), torch.zeros(1 << 20)
    dist.recv(a, src=0)
    dist.recv(b, src=0)
    assert a.equal(torch.arange(10.0)) and b.eq(3.0).all()


def test_a_rank_that_leaves_after_its_last_send_breaks_nothing():
    harness.run(body_exit_after_send, 2)


def test_a_libloom_built_from_other_headers_is_refused_at_import(tmp_path):
    """The extension records the digest of Loom's headers it was compiled against and refuses, at
    import, a libloom built from others (a layout the two disagree on would crash at a first call):
    here a copy of the library whose recorded digest is changed, found first on the library path."""
    import ctypes
    import subprocess
    import sys

    import loom_torch

    assert loom_torch._C.loom_build_id
    with open("/proc/self/maps") as maps:  # the libloom the extension loaded
        so = next(line.split()[-1] for line in maps if "/libloom.so" in line)
    lib = ctypes.CDLL(so)
    lib.loomGetHeadersDigest.restype = ctypes.c_char_p
    digest = lib.loomGetHeadersDigest()
    data = open(so, "rb").read()
    assert data.count(digest) == 1, "the digest %s is not once in %s" % (digest, so)
    (tmp_path / "libloom.so.0").write_bytes(data.replace(digest, b"0123456789abcdef"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", "import torch, loom_torch"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0, "imported against a libloom of other headers"
    assert "ImportError" in run.stderr and "reinstall or rebuild loom_torch" in run.stderr, run.stderr
    assert str(tmp_path) in run.stderr and "headers 0123456789abcdef" in run.stderr, run.stderr
    # The library as built imports.
    ok = subprocess.run([sys.executable, "-c", "import torch, loom_torch"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
