"""Rank 1 raises in its training loop; a non-daemon thread it started (a metrics uploader)
keeps its process alive, so rank 0 waits in the gradient all-reduce for good, as on NCCL."""

import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

stop = threading.Event()


def upload_metrics():
    while not stop.is_set():
        time.sleep(0.2)


dist.init_process_group("gloo")
rank = dist.get_rank()
threading.Thread(target=upload_metrics, name="metrics").start()
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    loss = model(torch.randn(4, 8)).sum()
    if rank == 1 and step == 3:
        raise ValueError(f"bad batch at step {step}")  # ddpdoctor: raise
    loss.backward()  # ddpdoctor: backward
    opt.step()
