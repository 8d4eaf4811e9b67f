"""Gradient accumulation with ``no_sync()``: rank 1 accumulates over 3 micro-batches, rank 0
over 2, and every micro-batch's loss is all-reduced for logging. At the second micro-batch
rank 0 broadcasts the DDP buffers (a synchronising forward) while rank 1 all-reduces its loss:
gloo aborts the receiving rank ("Received data size doesn't match expected size")."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.Linear(32, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
accumulate = 2 if rank == 0 else 3  # the bug: a per-rank accumulation count
for step in range(12):
    x = torch.randn(8, 16)
    if (step + 1) % accumulate != 0:
        with model.no_sync():
            loss = model(x).sum()
            loss.backward()
    else:
        loss = model(x).sum()
        loss.backward()  # ddpdoctor: sync_backward
        opt.step()
        opt.zero_grad()
    dist.all_reduce(loss.detach())  # ddpdoctor: log_loss
dist.destroy_process_group()
