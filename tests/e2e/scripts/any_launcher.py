"""A DDP job that takes its rank from whichever launcher started it: torchrun's RANK /
WORLD_SIZE / LOCAL_RANK, or Slurm's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID (as
``srun python train.py`` gives them).

``--uneven``: the last rank has one more batch (a divergence the diagnosis must find).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--uneven", action="store_true")
args = parser.parse_args()
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 3 + (1 if args.uneven and rank == world - 1 else 0)
for step in range(steps):
    loss = model(torch.randn(4, 8)).sum()
    loss.backward()  # ddpdoctor: backward
    opt.step()
    opt.zero_grad()
print(f"rank {rank} of {world} done", flush=True)
dist.destroy_process_group()
