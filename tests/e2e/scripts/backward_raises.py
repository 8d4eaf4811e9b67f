"""Rank 1 raises inside ``loss.backward()`` in iteration 3 (a custom autograd function)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Checked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bad):
        ctx.bad = bad
        return x

    @staticmethod
    def backward(ctx, grad):
        if ctx.bad:
            raise ValueError("non-finite gradient")  # ddpdoctor: raise
        return grad, None


dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(8, 8))
for step in range(1, 6):
    out = Checked.apply(model(torch.randn(4, 8)), rank == 1 and step == 3)
    out.sum().backward()  # ddpdoctor: backward
dist.destroy_process_group()
