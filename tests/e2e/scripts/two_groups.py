"""A healthy job of 4 ranks with a second gloo group per half, as pipelines and tensor-parallel
set-ups make them: DDP over the world, an all_reduce within each half every step."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
halves = [dist.new_group(list(range(0, world // 2))),
          dist.new_group(list(range(world // 2, world)))]
mine = halves[0] if rank < world // 2 else halves[1]
model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(6):
    loss = model(torch.randn(16, 32)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    stat = loss.detach().clone()
    dist.all_reduce(stat, group=mine)
dist.barrier()
dist.destroy_process_group()
