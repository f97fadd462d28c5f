"""DistributedDataParallel on backend "loom", checked against backend "gloo" in the same processes.

Each rank trains the same model three ways from one seed, on its shard of the same synthetic
data: DDP over Loom (the default group), DDP over Gloo (a second group), and a manual loop that
calls dist.all_reduce(p.grad) then divides by the world size. After every step the parameters of
the three agree within float tolerance (the reduction orders differ), and every rank holds
bitwise the same parameters (compared through Gloo, independently of Loom).
"""
import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import harness


class SmallCNN(nn.Module):
    """MNIST-shaped input (1x28x28), ten classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.fc1 = nn.Linear(16 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make(kind):
    torch.manual_seed(1234)
    if kind == "linear":
        model = nn.Linear(16, 1)
        x = torch.randn(256, 16)
        y = x @ torch.linspace(-1, 1, 16).unsqueeze(1) + 0.5 + 0.01 * torch.randn(256, 1)
        return model, x, y, F.mse_loss
    model = SmallCNN()
    x = torch.randn(128, 1, 28, 28)
    y = torch.randint(0, 10, (128,))
    return model, x, y, F.cross_entropy


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(vec, group, what):
    gathered = [torch.empty_like(vec) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, vec, group=group)
    for r, g in enumerate(gathered):
        assert torch.equal(g, vec), "%s: rank %d's parameters differ from rank %d's" % (what, r, dist.get_rank())


def body_train(rank, world, kind, bucket_cap_mb, as_view):
    gloo = dist.new_group(backend="gloo")
    model, x, y, loss_fn = make(kind)
    # every replica starts from rank 0's parameters (DDP broadcasts them): perturb the others'
    if rank != 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * rank)
    manual = copy.deepcopy(model)
    loom_ddp = DDP(copy.deepcopy(model), bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=as_view)
    gloo_ddp = DDP(copy.deepcopy(model), process_group=gloo, bucket_cap_mb=bucket_cap_mb)
    with torch.no_grad():  # the manual loop starts where DDP does: from rank 0's parameters
        for p in manual.parameters():
            dist.broadcast(p, src=0)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (loom_ddp, gloo_ddp, manual)]
    shard = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
    batches = 4
    step = 0
    for epoch in range(2):
        for b in range(batches):
            n = (shard.stop - shard.start) // batches
            xb = x[shard][b * n:(b + 1) * n]
            yb = y[shard][b * n:(b + 1) * n]
            for m, opt in zip((loom_ddp, gloo_ddp, manual), opts):
                opt.zero_grad()
                loss_fn(m(xb), yb).backward()
            for p in manual.parameters():  # the simplest loop's gradient averaging
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                p.grad /= world
            for opt in opts:
                opt.step()
            step += 1
            a, g, m = flat(loom_ddp.module), flat(gloo_ddp.module), flat(manual)
            assert torch.allclose(a, g, rtol=1e-5, atol=1e-6), \
                "step %d: loom and gloo differ by %g" % (step, (a - g).abs().max())
            assert torch.allclose(a, m, rtol=1e-5, atol=1e-6), \
                "step %d: DDP and the manual all_reduce loop differ by %g" % (step, (a - m).abs().max())
            same_on_every_rank(a, gloo, "step %d (loom DDP)" % step)
            same_on_every_rank(m, gloo, "step %d (manual loop)" % step)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["linear", "cnn"])
def test_ddp_matches_gloo(kind, world):
    harness.run(body_train, world, kind, 25, False, deadline_s=300)


def test_ddp_small_buckets_as_bucket_views():
    # many buckets in flight during backward, gradients living in the buckets
    harness.run(body_train, 2, "cnn", 0.01, True, deadline_s=300)


def body_no_sync(rank, world):
    model, x, y, loss_fn = make("linear")
    ddp = DDP(model)
    ref = copy.deepcopy(model)
    xs = x[rank * 64:(rank + 1) * 64]
    ys = y[rank * 64:(rank + 1) * 64]
    with ddp.no_sync():  # gradient accumulation: no communication for the first micro-batch
        loss_fn(ddp(xs[:32]), ys[:32]).backward()
    loss_fn(ddp(xs[32:]), ys[32:]).backward()  # the last micro-batch synchronises
    loss_fn(ref(xs[:32]), ys[:32]).backward()
    loss_fn(ref(xs[32:]), ys[32:]).backward()
    for p, q in zip(ddp.module.parameters(), ref.parameters()):
        dist.all_reduce(q.grad)
        q.grad /= world
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-6)


def test_no_sync_accumulates():
    harness.run(body_no_sync, 2)


def body_checkpoint(rank, world, path):
    model, x, y, loss_fn = make("linear")
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss_fn(ddp(x[rank::world]), y[rank::world]).backward()
        opt.step()
    dist.barrier()  # every rank finished the step before rank 0 writes
    if rank == 0:
        torch.save(ddp.module.state_dict(), path)
    dist.barrier()  # and the file is complete before anyone reads it
    state = torch.load(path)
    for k, v in ddp.module.state_dict().items():
        assert torch.equal(state[k], v), "rank %d: checkpoint differs at %s" % (rank, k)


def test_checkpoint_on_rank_zero_after_barrier(tmp_path):
    path = str(tmp_path / "model.pt")
    harness.run(body_checkpoint, 3, path)
    assert os.path.exists(path)
