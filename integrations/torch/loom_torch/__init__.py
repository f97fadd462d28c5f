"""Loom as a torch.distributed backend.

    import loom_torch                                   # registers the backend "loom"
    torch.distributed.init_process_group("loom")        # env://, tcp:// and file:// all work

Importing this module also fills in RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT from the launcher's own variables (Slurm's srun, Open MPI's mpirun, MPICH) when they are
not set already, so that an env:// script runs under srun or mpirun as it runs under torchrun.
"""
import os

import torch.distributed as dist

from . import _C

__all__ = ["launch", "setup_env", "BACKEND"]

BACKEND = "loom"


def _create_backend(store, rank, world_size, timeout):
    return _C.create_backend(store, rank, world_size, timeout)


def _default_loom_backend():
    """The default group's Loom backend, or None (no default group yet, or not Loom's)."""
    c10d = dist.distributed_c10d
    try:
        group = c10d._get_default_group()
        if hasattr(group, "_get_backend"):  # PyTorch 2.x: the ProcessGroup dispatches to backends
            import torch
            return group._get_backend(torch.device("cpu"))
        return group
    except (RuntimeError, ValueError, AttributeError):
        return None


def _create_backend_for_devices(options, backend_options=None):
    """torch.distributed's factory (extended form). PyTorch 2.x calls it once per device type the
    backend serves; the calls of one group share one Loom communicator (keyed by the group's
    name). A group of the default group (new_group), when the default group is Loom's, is made
    from its communicator by the group's members alone: no new rendezvous."""
    ranks = list(options.global_ranks_in_group)
    parent = _default_loom_backend() if ranks else None
    if parent is not None:
        return _C.create_group_backend(parent, options.store, options.group_rank, options.group_size,
                                       options.timeout, options.group_id, ranks)
    return _C.create_backend(options.store, options.group_rank, options.group_size, options.timeout,
                             options.group_id)


def launch():
    """What the launcher says about this process (a dict: rank, world_size, local_rank,
    local_world_size, master_addr, master_port, launcher, provenance). Raises RuntimeError
    when no launcher variable is set."""
    return _C.launch()


_ENV = (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"),
        ("LOCAL_WORLD_SIZE", "local_world_size"), ("MASTER_ADDR", "master_addr"), ("MASTER_PORT", "master_port"))


def setup_env(environ=os.environ):
    """Sets the variables init_process_group's env:// method reads from the launcher's own, leaving
    those already set alone. Returns the names it set (empty when there was no launcher)."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return []
    try:
        info = launch()
    except RuntimeError:
        return []  # no launcher: init_process_group's own arguments or errors apply
    set_now = []
    for name, key in _ENV:
        value = info[key]
        if name not in environ and value not in (-1, ""):
            environ[name] = str(value)
            set_now.append(name)
    if os.environ.get("LOOM_DEBUG", "").upper() in ("INFO", "TRACE"):
        print("loom_torch: from %s: %s" % (info["launcher"], ", ".join(
            "%s=%s" % (n, environ[n]) for n in set_now)), flush=True)
    return set_now


def _register():
    kwargs = {}
    creator = _create_backend
    try:
        import inspect
        parameters = inspect.signature(dist.Backend.register_backend).parameters
        if "extended_api" in parameters:  # the group's name and ranks reach the factory
            kwargs["extended_api"] = True
            creator = _create_backend_for_devices
        if "devices" in parameters:  # PyTorch 2.1+: CPU tensors, and CUDA tensors where built with CUDA
            kwargs["devices"] = ["cpu", "cuda"] if _C.has_cuda else ["cpu"]
    except (TypeError, ValueError):
        pass
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, creator, **kwargs)


def _allow_monitored_barrier():
    """torch.distributed.monitored_barrier refuses every backend but Gloo before it asks the group;
    Loom's groups implement it (rank 0 names the ranks that did not arrive, and where each is), so
    the check lets "loom" through as well. Other backends go to PyTorch's own function."""
    c10d = dist.distributed_c10d
    original = c10d.monitored_barrier
    if getattr(original, "_loom", False):
        return

    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or c10d.get_backend(group) != BACKEND:
            return original(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d.default_pg_timeout
        group_to_use = c10d._get_default_group() if group is None else group
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier.__doc__ = original.__doc__
    monitored_barrier._loom = True
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier


_register()
_allow_monitored_barrier()
setup_env()
