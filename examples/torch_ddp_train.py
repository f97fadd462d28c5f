"""A PyTorch DistributedDataParallel training script on Loom: an ordinary DDP script in which
three lines name Loom (marked "Loom:"); with backend "gloo" it is the script you already have.

A small CNN learns a synthetic, MNIST-shaped classification task (made from a fixed seed, so that
every run is the same). Each rank trains on its shard (DistributedSampler); DDP averages the
gradients across ranks during backward; rank 0 alone prints the loss and, after a barrier, saves
the checkpoint; every rank prints a checksum of its weights, which must be identical.

    torchrun --nproc_per_node 2 examples/torch_ddp_train.py --epochs 3
    srun -n 4 /usr/bin/python3 examples/torch_ddp_train.py
    mpirun -np 4 /usr/bin/python3 examples/torch_ddp_train.py --backend gloo   # the same, on Gloo
"""
import argparse
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import loom_torch  # noqa: F401  Loom: registers the backend; reads rank and world size from srun/mpirun


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc = nn.Linear(16 * 5 * 5, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def synthetic_dataset(n=2048):
    """Ten classes, each a fixed random 28x28 pattern plus noise: learnable in a few epochs."""
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(10, 1, 28, 28, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = patterns[labels] + 3.0 * torch.randn(n, 1, 28, 28, generator=g)
    return TensorDataset(images, labels)


def say(text):
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="loom")  # Loom: was "gloo"
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--checkpoint", default="/tmp/torch_ddp_train.pt")
    args = parser.parse_args()

    dist.init_process_group(args.backend)  # env:// (torchrun, or loom_torch from srun/mpirun)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DDP(SmallCNN())
    data = synthetic_dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle per epoch, the same on every rank
        total, batches = torch.zeros(1), 0
        for images, labels in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()  # DDP all-reduces the gradient buckets as they become ready
            opt.step()
            total += loss.detach()
            batches += 1
        dist.all_reduce(total)  # the mean loss over every rank's batches
        if rank == 0:
            say(f"epoch {epoch}: loss {total.item() / (batches * world):.4f}")

    dist.barrier()  # every rank has finished its last step before rank 0 writes
    if rank == 0:
        torch.save(model.module.state_dict(), args.checkpoint)
        say(f"rank 0 saved {args.checkpoint}")
    checksum = sum(p.double().sum().item() for p in model.module.parameters())
    say(f"rank {rank}: weights checksum {checksum:.10f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
