"""A NaN check makes rank 1 skip its loss all-reduce at step 3: its next gradient all-reduce
meets rank 0's loss all-reduce."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    loss = model(torch.randn(4, 16)).pow(2).mean()
    loss.backward()  # ddpdoctor: backward
    opt.step()
    opt.zero_grad()
    if rank == 1 and step == 3:
        loss = loss * float("nan")  # a bad batch on one rank
    if torch.isnan(loss):
        continue  # the bug: a rank-local skip of a collective
    dist.all_reduce(loss.detach())  # ddpdoctor: loss_all_reduce
dist.destroy_process_group()
