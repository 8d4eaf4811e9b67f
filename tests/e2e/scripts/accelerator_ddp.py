"""pytorch/examples style (distributed/ddp, minGPT-ddp): the device comes from torch.accelerator
and the backend from the device; exits early without an accelerator."""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

if not torch.accelerator.is_available():
    print("this example needs an accelerator")
    sys.exit(0)
local_rank = int(os.environ["LOCAL_RANK"])
acc = torch.accelerator.current_accelerator()
torch.accelerator.set_device_index(local_rank)
device = torch.device(f"{acc}:{local_rank}")
dist.init_process_group(dist.get_default_backend_for_device(acc))
model = DDP(nn.Linear(10, 5).to(device), device_ids=[local_rank])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    opt.zero_grad()
    model(torch.randn(20, 10).to(device)).sum().backward()  # ddpdoctor: backward
    opt.step()
dist.destroy_process_group()
