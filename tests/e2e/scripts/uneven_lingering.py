"""Seed 001's uneven inputs as NCCL shows them: rank 1 has one more batch than rank 0. Rank 0
ends its loop and its script, but a non-daemon thread it started (a checkpoint uploader) keeps
its process alive, so rank 1 waits for good in its extra backward's gradient all-reduce."""

import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
uploaded = threading.Event()
threading.Thread(target=uploaded.wait, name="uploader").start()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [torch.randn(4, 8) for _ in range(5 + rank)]  # the bug: rank 1 has one more
for x in batches:
    loss = model(x).sum()
    loss.backward()  # ddpdoctor: backward
    opt.step()
print(f"rank {rank} done", flush=True)  # ddpdoctor: done
