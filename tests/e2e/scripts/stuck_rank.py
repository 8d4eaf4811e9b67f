"""Rank 0 waits forever on a lock nobody releases, outside any collective; rank 1 waits in
``dist.barrier()``: rank 0 is stuck in user code."""

import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(2))
lock = threading.Lock()
lock.acquire()
if rank == 0:
    lock.acquire()  # ddpdoctor: stuck
dist.barrier()  # ddpdoctor: barrier
dist.destroy_process_group()
