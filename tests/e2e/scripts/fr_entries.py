"""A short DDP job that writes, per rank, how many entries PyTorch's flight recorder holds at
its end and what ``TORCH_FR_BUFFER_SIZE`` was, as JSON into ``$FR_DIR/rank-N.json``."""

import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 2))
for _ in range(3):
    model(torch.randn(4, 8)).sum().backward()
dist.barrier()
entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json()).get("entries", [])
out = os.path.join(os.environ["FR_DIR"], f"rank-{dist.get_rank()}.json")
with open(out, "w") as fh:
    json.dump({"entries": len(entries), "size": os.environ.get("TORCH_FR_BUFFER_SIZE")}, fh)
dist.destroy_process_group()
