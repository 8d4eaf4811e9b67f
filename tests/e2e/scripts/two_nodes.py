"""A job for two ``ddpdoctor run --nnodes 2`` processes on one machine (any ranks per node).

``--mode healthy``: a few DDP steps. ``--mode mismatch``: then rank 0 (node 0) enters a
barrier while every other rank runs another training step. ``--mode busy``: then the last rank
(on node 1) saves a checkpoint for ``--seconds``, writing slowly, while the others wait in a
barrier (busy, not hung). ``--mode teardown_abort``: healthy, but the last rank's process aborts
(SIGABRT) once Python has shut down, after its script finished (gloo's teardown abort).
``--mode extra_reduce``: then the last rank alone all-reduces a scalar while the others run
another training step: gloo fails the mismatched all-reduce, and the ranks of the other node
only lose their peers (issue 53).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from abort_at_exit import abort_after_shutdown, wait_until_ended

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["healthy", "mismatch", "busy", "teardown_abort",
                                       "extra_reduce"],
                    required=True)
parser.add_argument("--seconds", type=float, default=6.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(16, 16))
for step in range(3):
    model(torch.randn(4, 16)).sum().backward()  # ddpdoctor: step
if args.mode == "mismatch":
    if rank == 0:
        dist.barrier()  # ddpdoctor: barrier
    else:
        model(torch.randn(4, 16)).sum().backward()  # ddpdoctor: extra_step
elif args.mode == "extra_reduce":
    if rank == dist.get_world_size() - 1:
        dist.all_reduce(torch.ones(1))  # ddpdoctor: extra_reduce
    model(torch.randn(4, 16)).sum().backward()  # ddpdoctor: next_step
elif args.mode == "busy":
    if rank == dist.get_world_size() - 1:
        deadline, fd = time.monotonic() + args.seconds, os.open(os.devnull, os.O_WRONLY)
        while time.monotonic() < deadline:
            os.write(fd, bytes(1 << 20))  # ddpdoctor: checkpoint
            time.sleep(0.05)
        os.close(fd)
    dist.barrier()
elif args.mode == "teardown_abort":
    pids: list = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())  # every node runs on this machine
last = rank == dist.get_world_size() - 1
dist.destroy_process_group()
if args.mode == "teardown_abort" and last:
    # The other ranks end first (torchrun stops the survivors of a failed rank).
    wait_until_ended([pid for pid in pids if pid != os.getpid()])
    abort_after_shutdown()
