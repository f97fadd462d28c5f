"""The toy send/recv example (examples/torch_send_recv.py) on backend "loom", started every way
users start torch.distributed jobs: torch.multiprocessing.spawn, the real torchrun, mpirun and
srun (a real single-node Slurm, tools/slurm-local), and the variables srun and mpirun set, given
by hand. The script never computes a rank: loom_torch reads the launcher's variables.
"""
import os
import shutil
import subprocess
import sys

import pytest

import harness

EXAMPLE = os.path.join(harness.REPO, "examples", "torch_send_recv.py")
PYTHON = "/usr/bin/python3"


def env():
    e = dict(os.environ)
    for k in list(e):  # whatever launched this test must not leak into the ranks
        if k.startswith(("SLURM_", "OMPI_", "PMIX_", "PMI_")) or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                      "MASTER_ADDR", "MASTER_PORT"):
            del e[k]
    e["OMP_NUM_THREADS"] = "1"
    return e


def check(out, ranks=2):
    for r in range(ranks):
        assert "rank %d of %d: joined through backend loom" % (r, ranks) in out, out
    assert "rank 1 received [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]" in out, out


def run(cmd, extra=None, timeout=120):
    e = env()
    e.update(extra or {})
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert p.returncode == 0, "%s exited with %d:\n%s" % (" ".join(cmd), p.returncode, p.stdout)
    return p.stdout


def test_multiprocessing_spawn():
    check(run([PYTHON, EXAMPLE, "--spawn", "2"], {"MASTER_PORT": str(harness.free_port())}))


def torchrun(nproc):
    """torchrun's command line for `nproc` local ranks, before the script."""
    # Debian's torchrun needs --redirects/--tee on Python 3.11 (see ../shared/MACHINE-NOTES.md)
    return [PYTHON, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
            str(harness.free_port()), "--redirects", "2", "--tee", "1"]


def test_torchrun():
    check(run(torchrun(2) + [EXAMPLE]))


def start_ranks(n, variables):
    procs = []
    for r in range(n):
        e = env()
        e.update(variables(r))
        procs.append(subprocess.Popen([PYTHON, EXAMPLE], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    out = ""
    for p in procs:
        try:
            text, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        out += text
        assert p.returncode == 0, out
    return out


def test_srun_variables():
    job = str(200000 + os.getpid())
    check(start_ranks(2, lambda r: {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r),
                                    "SLURM_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
                                    "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_JOB_ID": job,
                                    "SLURM_STEP_ID": "0"}))


def test_mpirun_variables():
    port = str(harness.free_port())
    check(start_ranks(2, lambda r: {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                                    "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                                    "MASTER_PORT": port}))


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_mpirun():
    out = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH",
               "-x", "OMP_NUM_THREADS", PYTHON, EXAMPLE])
    check(out)


def test_srun():
    if os.environ.get("LOOM_TORCH2_ENV"):
        pytest.skip("inside tools/torch2-env: Slurm's daemons belong to the host, whose suite runs srun (the launcher "
                    "detection is the same code on both PyTorch versions, and srun's variables are tested here)")
    if os.geteuid() != 0:
        pytest.skip("tools/slurm-local starts Slurm's daemons, which needs root")
    setup = subprocess.run([os.path.join(harness.REPO, "tools", "slurm-local"), "start"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=240)
    if setup.returncode != 0:
        pytest.skip("could not start a local Slurm (tools/slurm-local start): " + setup.stdout)
    check(run(["srun", "-n", "2", "--export=ALL", PYTHON, EXAMPLE], timeout=180))


DDP_EXAMPLE = os.path.join(harness.REPO, "examples", "torch_ddp_train.py")


def ddp_run(launcher, backend, tmp_path):
    ck = str(tmp_path / ("%s.pt" % backend))
    args = [DDP_EXAMPLE, "--epochs", "2", "--backend", backend, "--checkpoint", ck]
    if launcher == "torchrun":
        out = run(torchrun(2) + args)
    else:
        out = run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH",
                   "-x", "OMP_NUM_THREADS", PYTHON] + args)
    losses = [float(line.split("loss ")[1]) for line in out.splitlines() if "epoch " in line and "loss " in line]
    assert len(losses) == 2 and losses[1] < losses[0], out
    sums = [line.split("checksum ")[1] for line in out.splitlines() if "weights checksum" in line]
    assert len(sums) == 2 and sums[0] == sums[1], "the ranks' weights differ:\n" + out
    assert os.path.exists(ck) and "rank 0 saved" in out and "rank 1 saved" not in out, out
    return float(sums[0])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_ddp_example_on_loom_matches_gloo(tmp_path):
    loom = ddp_run("torchrun", "loom", tmp_path)
    gloo = ddp_run("mpirun", "gloo", tmp_path)
    assert abs(loom - gloo) <= 1e-6 * max(1.0, abs(gloo)), (loom, gloo)
