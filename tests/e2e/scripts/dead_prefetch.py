"""A data-prefetch thread dies on a corrupt record on rank 0 (``threading`` prints the error
and goes on); rank 0's main thread then waits forever in ``queue.get()`` while rank 1 waits in
DDP's gradient all-reduce. ddpdoctor stops it at its hang timeout as rank 0 blocked; or, with
``--gloo-timeout 8`` below ddpdoctor's, gloo's timeout fails rank 1 first and torchrun tears
rank 0 down with SIGTERM: the root is rank 0's blocked wait and its dead thread either way.
"""

import argparse
import datetime
import queue
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def producer(q, rank):
    for i in range(100):
        if rank == 0 and i == 3:
            raise ValueError("corrupt record 3 in shard-00017")  # ddpdoctor: thread_dies
        q.put(torch.randn(4, 8))


parser = argparse.ArgumentParser()
parser.add_argument("--gloo-timeout", type=float, default=1800)
args = parser.parse_args()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.gloo_timeout))
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
q = queue.Queue(maxsize=2)
threading.Thread(target=producer, args=(q, rank), name="prefetch", daemon=True).start()
for step in range(10):
    x = q.get()  # ddpdoctor: blocked
    model(x).sum().backward()  # ddpdoctor: backward
dist.destroy_process_group()
