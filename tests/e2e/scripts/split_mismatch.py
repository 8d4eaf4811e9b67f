"""Amounts per peer that disagree, one op family per --case, after a healthy first round.

all_to_all: rank 1 allocates a larger output tensor for rank 0 than rank 0 sends.
scatter: the root's scatter list holds 6 elements for rank 1, which expects 4.
gather: the root's gather list holds 6 elements for rank 1, which sends 4.
"""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--case", choices=["all_to_all", "scatter", "gather"], required=True)
case = parser.parse_args().case
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for step in range(2):
    wrong = step == 1
    dist.all_reduce(torch.ones(2))
    if case == "all_to_all":
        outputs = [torch.empty(6 if (wrong and rank == 1 and src == 0) else 4)
                   for src in range(world)]
        dist.all_to_all(outputs, [torch.ones(4) for _ in range(world)])  # mismatch here
    elif case == "scatter":
        chunks = [torch.ones(6 if (wrong and dst == 1) else 4) for dst in range(world)]
        dist.scatter(torch.empty(4), chunks if rank == 0 else None, src=0)  # mismatch here
    else:
        chunks = [torch.empty(6 if (wrong and src == 1) else 4) for src in range(world)]
        dist.gather(torch.ones(4), chunks if rank == 0 else None, dst=0)  # mismatch here
dist.destroy_process_group()
