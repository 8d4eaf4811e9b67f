"""An IterableDataset that yields 3 batches on rank 0 and 2 on rank 1: rank 1 leaves the loop
and all-reduces its metrics while rank 0 all-reduces the gradients of its third batch."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Shard(IterableDataset):
    def __init__(self, rank: int) -> None:
        self.batches = 3 if rank == 0 else 2  # the bug: shards of unequal length

    def __iter__(self):
        for _ in range(self.batches):
            yield torch.randn(4, 16)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
total = torch.zeros(2)
for x in DataLoader(Shard(rank), batch_size=None):
    loss = model(x).pow(2).mean()
    loss.backward()  # ddpdoctor: backward
    total += torch.tensor([loss.item(), 1.0])
dist.all_reduce(total)  # ddpdoctor: metrics
dist.destroy_process_group()
