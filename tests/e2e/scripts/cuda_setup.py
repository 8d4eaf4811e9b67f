"""Seed 000's set-up, as written for GPUs: ``torch.cuda.set_device(local_rank)`` then NCCL."""

import os

import torch
import torch.distributed as dist

local_rank = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(local_rank)  # ddpdoctor: set_device
device = torch.device("cuda", local_rank)
dist.init_process_group(backend="nccl", init_method="env://")
dist.all_reduce(torch.ones(1, device=device))
dist.destroy_process_group()
