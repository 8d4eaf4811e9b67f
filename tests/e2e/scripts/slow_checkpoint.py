"""A healthy job whose rank 0 saves a checkpoint for ``--seconds`` outside any collective while
rank 1 waits in ``dist.barrier()``: busy, not hung. The save writes slowly (a slow file system:
I/O, next to no CPU), or with ``--compute`` spins the CPU (a big state dict), or with
``--subprocess`` waits for a child process that does the writing (a download tool)."""

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--seconds", type=float, required=True)
parser.add_argument("--compute", action="store_true", help="spin the CPU instead of writing")
parser.add_argument("--subprocess", action="store_true", help="a child process writes")
args = parser.parse_args()


_WRITER = """import os, sys, time
deadline, fd = time.monotonic() + float(sys.argv[1]), os.open(os.devnull, os.O_WRONLY)
while time.monotonic() < deadline:
    os.write(fd, bytes(1 << 20))
    time.sleep(0.05)
"""


def save_checkpoint(model: nn.Module) -> None:
    if args.subprocess:  # the rank itself only waits: its child does the I/O
        subprocess.run([sys.executable, "-c", _WRITER, str(args.seconds)], check=True)
        return
    deadline = time.monotonic() + args.seconds
    chunk = bytes(1 << 20)
    fd = os.open(os.devnull, os.O_WRONLY)
    while time.monotonic() < deadline:  # a slow file system, or a big state dict
        if args.compute:
            torch.mm(torch.randn(64, 64), torch.randn(64, 64))
        else:
            os.write(fd, chunk)  # ddpdoctor: saving
            time.sleep(0.05)
    os.close(fd)
    torch.save(model.state_dict(), "/dev/null")


dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(8, 8))
for step in range(3):
    model(torch.randn(4, 8)).sum().backward()
if rank == 0:
    save_checkpoint(model)
dist.barrier()  # ddpdoctor: barrier
dist.destroy_process_group()
