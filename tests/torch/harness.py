"""Runs a test body on N real processes with a real torch.distributed process group, with a deadline.

Each rank imports loom_torch, joins the default group with the backend asked for (init method
file:// or env://), runs `body(rank, world_size, *args)` and leaves. A rank that raises fails the
test with its traceback; ranks still running at the deadline are killed and fail it too (no hang).
"""
import datetime
import faulthandler
import os
import socket
import sys
import tempfile
import time
import traceback

import torch.multiprocessing as mp

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, body, args, backend, init, timeout_s, deadline_s, errors):
    # a rank still running near the deadline prints where every thread is, before it is killed
    faulthandler.dump_traceback_later(max(1, deadline_s - 3), exit=False)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import loom_torch  # noqa: F401

    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        body(rank, world_size, *args)
        keep_gloo_groups(dist)
        dist.destroy_process_group()
    except BaseException:  # noqa: B902 - reported to the parent, whatever it is
        errors.put((rank, traceback.format_exc()))
        sys.stderr.flush()
        os._exit(1)


# PyTorch 2.x before 2.8 destroys a Gloo group with the GIL held while it joins Gloo's worker
# threads, and a worker still holding the last reference to a tensor with a Python object waits for
# the GIL there: destroying a Gloo group hangs now and then (pytorch/pytorch#154976). On those
# versions the ranks keep their Gloo groups alive instead (a rank ends with os._exit, as every
# multiprocessing child does, so they are never destroyed); Loom's groups are destroyed for real.
_KEPT_GLOO_GROUPS = []


def _gloo_destroy_hangs():
    import torch
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return (2, 0) <= (major, minor) < (2, 8)


def keep_gloo_groups(dist, groups=None):
    """Before destroy_process_group(): keeps `groups` (default: every group) that are Gloo's alive."""
    if not _gloo_destroy_hangs():
        return
    c10d = dist.distributed_c10d
    for group in (list(c10d._world.pg_map) if groups is None else groups):
        if group is not c10d.GroupMember.NON_GROUP_MEMBER and dist.get_backend(group) == "gloo":
            _KEPT_GLOO_GROUPS.append(group)


def run(body, world_size, *args, backend="loom", init="file", deadline_s=120, timeout_s=60):
    """Runs body on world_size processes (forked); raises AssertionError naming failed ranks."""
    ctx = mp.get_context("fork")
    errors = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        if init == "file":
            init_method = "file://" + os.path.join(tmp, "store")
        else:
            init_method = "tcp://127.0.0.1:%d" % free_port()
        procs = [ctx.Process(target=_rank_main,
                             args=(r, world_size, body, args, backend, init_method, timeout_s, deadline_s, errors))
                 for r in range(world_size)]
        for p in procs:
            p.start()
        end = time.monotonic() + deadline_s
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        failures = []
        while not errors.empty():
            failures.append(errors.get())
        failures.sort()
        message = "".join("--- rank %d ---\n%s" % f for f in failures)
        if hung:
            message += "ranks %s still running after %d s (killed)\n" % (hung, deadline_s)
        bad = [r for r, p in enumerate(procs) if p.exitcode not in (0, None) and r not in [f[0] for f in failures]]
        if bad and not hung:
            message += "ranks %s exited with %s\n" % (bad, [procs[r].exitcode for r in bad])
        assert not message, message
