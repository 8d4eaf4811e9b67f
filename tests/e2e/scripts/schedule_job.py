"""A small DDP job whose collective schedule can be changed from the command line.

``--extra-allreduce``: one more all_reduce in the training loop (a metric). ``--hidden N``:
another model width, hence another gradient-bucket layout.
"""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--extra-allreduce", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 2))
    ddp = DDP(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        loss = ddp(torch.randn(8, 16, generator=gen)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if args.extra_allreduce:
            metric = loss.detach().clone()
            dist.all_reduce(metric)  # the change under test
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
