"""Finishes its work, then aborts during interpreter teardown, like gloo + DDP sometimes does.

An object left in ``__main__`` whose finaliser calls ``os.abort()`` fires when the interpreter
clears modules, after ``atexit`` handlers (ddpdoctor's exit record included) have run.
``--rank0-works SECONDS``: rank 0 still works that long after the last collective (a
checkpoint), so torchrun stops it when rank 1 aborts.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--rank0-works", type=float, default=0.0)
args = parser.parse_args()


class _AbortAtTeardown:
    def __del__(self) -> None:
        os.abort()


dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
if dist.get_rank() == 0 and args.rank0_works:
    deadline = time.monotonic() + args.rank0_works
    while time.monotonic() < deadline:
        time.sleep(0.05)  # ddpdoctor: checkpoint
print(f"rank {dist.get_rank()} finished")
if dist.get_rank() == 1:
    _bomb = _AbortAtTeardown()
