"""All-reduces in a slow loop (about 10 s in all): a target to SIGKILL mid-run."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(1000):
    t = torch.ones(4)
    dist.all_reduce(t)
    time.sleep(0.01)
dist.destroy_process_group()
