"""A DDP job run *without* ddpdoctor, with PyTorch's flight recorder on
(``TORCH_FR_BUFFER_SIZE``): when a collective fails or times out, each rank dumps its flight
recorder into ``$FR_DIR`` (``nccl_trace_rank_<N>``, pickle; ``--json``: ``fr_rank_<N>.json``).

``--case rank0_reduce``: rank 0 alone reduces the loss, then both meet at a barrier.
``--case uneven``: seed 001 case 5 -- rank 1 has one more batch, then a barrier.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=["rank0_reduce", "uneven"], required=True)
parser.add_argument("--json", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()


def dump() -> None:
    c10d = torch._C._distributed_c10d
    folder = os.environ["FR_DIR"]
    if args.json:
        data = c10d._dump_fr_trace_json(includeCollectives=True)
        name = f"fr_rank_{rank}.json"
    else:
        data = c10d._dump_fr_trace(includeCollectives=True, includeStackTraces=True)
        name = f"nccl_trace_rank_{rank}"
    with open(os.path.join(folder, name), "wb") as fh:
        fh.write(data if isinstance(data, bytes) else data.encode())


model = DDP(nn.Linear(1, 1))
try:
    if args.case == "rank0_reduce":
        for step in range(3):
            loss = model(torch.ones(1)).sum()  # ddpdoctor: forward
            loss.backward()
            if rank == 0:
                dist.reduce(loss.detach(), dst=0)  # ddpdoctor: reduce
        dist.barrier()  # ddpdoctor: final_barrier
    else:
        for _ in range(5 + rank):  # the bug: rank 1 has one more batch
            model(torch.ones(1)).sum().backward()  # ddpdoctor: uneven_backward
        dist.barrier()  # ddpdoctor: uneven_barrier
except RuntimeError:
    dump()
    sys.exit(1)
