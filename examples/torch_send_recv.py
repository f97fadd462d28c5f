"""The toy send/recv example in PyTorch form, on Loom: rank 0 sends ten ones, rank 1 receives them.

Run it the way you run any torch.distributed script; `import loom_torch` registers the backend
"loom" and reads rank and world size from whichever launcher started the job:

    torchrun --nproc_per_node 2 examples/torch_send_recv.py
    srun -n 2 /usr/bin/python3 examples/torch_send_recv.py
    mpirun -np 2 /usr/bin/python3 examples/torch_send_recv.py
    /usr/bin/python3 examples/torch_send_recv.py --spawn 2     # torch.multiprocessing.spawn
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import loom_torch  # noqa: F401  (registers the "loom" backend; fills RANK etc. from srun/mpirun)


def say(text):
    sys.stdout.write(text + "\n")  # one write per line: ranks share the terminal
    sys.stdout.flush()


def main(rank=None, world_size=None):
    # env:// reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (set by torchrun, or by
    # loom_torch from srun's or mpirun's variables); spawn passes rank and world size instead.
    dist.init_process_group("loom", rank=rank if rank is not None else -1,
                            world_size=world_size if world_size is not None else -1)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    say(f"rank {rank} of {world_size}: joined through backend {dist.get_backend()}")

    tensor = torch.zeros(10)
    if rank == 0:
        tensor += 1
        dist.send(tensor, dst=1)  # returns once the message is on its way
        say(f"rank 0 sent {tensor.tolist()}")
    elif rank == 1:
        dist.recv(tensor, src=0)  # blocks until the ten ones arrived
        say(f"rank 1 received {tensor.tolist()}")
        assert tensor.eq(1).all(), tensor

    dist.barrier()  # everyone is done before anyone leaves
    dist.destroy_process_group()


def spawned(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    main(rank, world_size)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spawn", type=int, metavar="N", help="start N ranks here with torch.multiprocessing.spawn")
    args = parser.parse_args()
    if args.spawn:
        mp.spawn(spawned, args=(args.spawn,), nprocs=args.spawn)
    else:
        main()
