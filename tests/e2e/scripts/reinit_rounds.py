"""One process per rank that makes and destroys its process group twice (a sweep over two
configurations, an evaluation job after training). ``--bad-round 2``: in the second round
rank 0 also all-reduces a metric the others never reduce.

Each round keys its rendezvous apart in torchrun's store (a PrefixStore): a group made again
under the same keys may read the last round's addresses (gloo then fails with "Connection
reset by peer", about 1 run in 5 under plain torchrun)."""

import argparse
import datetime
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--bad-round", type=int, default=0)
args = parser.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      is_master=False, timeout=datetime.timedelta(seconds=60))
for number in (1, 2):
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round-{number}", store),
                            rank=rank, world_size=world)
    for step in range(3):
        t = torch.ones(4)
        dist.all_reduce(t)  # ddpdoctor: step
    if args.bad_round == number and dist.get_rank() == 0:
        dist.all_reduce(torch.zeros(1))  # ddpdoctor: metric
    dist.barrier()  # ddpdoctor: barrier
    dist.destroy_process_group()
