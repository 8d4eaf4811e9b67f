"""Rank 1 fails on its first torchrun attempt (a flaky data shard) and, restarted, on the
second attempt at another line (its checkpoint is not there): run with ``--max-restarts 1``."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
model = DDP(torch.nn.Linear(8, 2))
for step in range(2):
    model(torch.randn(4, 8)).sum().backward()
if rank == 1 and attempt == 0:
    raise OSError("shard-00003 unreadable")  # ddpdoctor: first_failure
if rank == 1:
    raise FileNotFoundError("checkpoint step-2.pt")  # ddpdoctor: second_failure
dist.barrier()
dist.destroy_process_group()
