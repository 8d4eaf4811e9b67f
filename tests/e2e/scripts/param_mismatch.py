"""The model differs between ranks: rank 1 builds a wider layer, and DDP's construction check
fails ("params[0] ... appears not to match")."""

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
width = 8 if dist.get_rank() == 0 else 9  # the bug: a rank-dependent layer size
model = DDP(nn.Linear(4, width))  # ddpdoctor: ddp_init
dist.destroy_process_group()
