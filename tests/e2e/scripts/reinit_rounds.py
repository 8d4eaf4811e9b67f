"""One process per rank that makes and destroys its process group twice (a sweep over two
configurations, an evaluation job after training). ``--bad-round 2``: in the second round
rank 0 also all-reduces a metric the others never reduce."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--bad-round", type=int, default=0)
args = parser.parse_args()

for number in (1, 2):
    dist.init_process_group("gloo")
    for step in range(3):
        t = torch.ones(4)
        dist.all_reduce(t)  # ddpdoctor: step
    if args.bad_round == number and dist.get_rank() == 0:
        dist.all_reduce(torch.zeros(1))  # ddpdoctor: metric
    dist.barrier()  # ddpdoctor: barrier
    dist.destroy_process_group()
