"""A script that never initialises a process group: nothing distributed is tested."""

import torch

if not torch.accelerator.is_available():
    print("no accelerator: nothing to do")
else:
    print("sum", torch.ones(3).sum().item())
