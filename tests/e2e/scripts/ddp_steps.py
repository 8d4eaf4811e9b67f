"""A small healthy DDP job with several gradient buckets, BatchNorm buffers and extra groups.

Used by the recorder tests. ``--out FILE``: rank 0 saves the final parameters there.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out")
    parser.add_argument("--find-unused", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(model, bucket_cap_mb=0.01, find_unused_parameters=args.find_unused)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(8, 32, generator=gen)
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    side = dist.new_group([0, 1])
    dist.barrier(group=side)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": rank})
    if args.out and rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
