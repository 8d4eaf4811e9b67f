"""Each rank saves a 'best model' on its own validation loss and synchronises with
``dist.monitored_barrier()`` inside the save helper. ``--diverge``: rank 0's loss improves and
rank 1's does not, so rank 0 alone enters the barrier while rank 1 goes on training (a
rank-local decision); without it both improve at the same steps (healthy)."""

import argparse
import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def save_best(model, loss):
    torch.save(model.state_dict(), "/dev/null")
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))  # ddpdoctor: monitored


parser = argparse.ArgumentParser()
parser.add_argument("--diverge", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
VAL = {0: [5.0, 4.0, 3.0, 9.0], 1: [5.0, 6.0, 7.0, 8.0] if args.diverge else [5.0, 4.0, 3.0, 9.0]}
best = float("inf")
for step in range(4):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()  # ddpdoctor: backward
    val = VAL[rank][step]
    if val < best:
        best = val
        if step >= 2:
            save_best(model, best)
dist.destroy_process_group()
