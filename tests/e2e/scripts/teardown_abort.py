"""Finishes its work, then aborts during interpreter teardown, like gloo + DDP sometimes does.

Rank 1's process aborts once the interpreter has shut down, after the ``atexit`` handlers
(ddpdoctor's exit record included) have run (``abort_at_exit.py``).
``--rank0-works SECONDS``: rank 0 still works that long after the last collective (a
checkpoint), so torchrun stops it when rank 1 aborts.
"""

import argparse
import time

import torch
import torch.distributed as dist
from abort_at_exit import abort_after_shutdown

parser = argparse.ArgumentParser()
parser.add_argument("--rank0-works", type=float, default=0.0)
args = parser.parse_args()

dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
if dist.get_rank() == 0 and args.rank0_works:
    deadline = time.monotonic() + args.rank0_works
    while time.monotonic() < deadline:
        time.sleep(0.05)  # ddpdoctor: checkpoint
print(f"rank {dist.get_rank()} finished")
if dist.get_rank() == 1:
    abort_after_shutdown()
