"""PyTorch's DDP tutorial shape: each demo is its own ``mp.spawn`` round that makes and
destroys the process group (a basic step, then a checkpoint saved by rank 0 and loaded by all).

``--bad-round 2``: in the second round rank 0 also all-reduces its loss (a divergence).
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def demo_basic(rank, world_size, port, bad):
    setup(rank, world_size, port)
    model = DDP(nn.Linear(10, 5))
    loss = nn.functional.mse_loss(model(torch.randn(20, 10)), torch.randn(20, 5))
    loss.backward()  # ddpdoctor: basic_backward
    dist.destroy_process_group()


def demo_checkpoint(rank, world_size, port, bad):
    setup(rank, world_size, port)
    model = DDP(nn.Linear(10, 5))
    path = os.path.join(tempfile.gettempdir(), f"ddpdoctor-tutorial-{port}.pt")
    if rank == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()  # ddpdoctor: checkpoint_barrier
    model.load_state_dict(torch.load(path))
    loss = nn.functional.mse_loss(model(torch.randn(20, 10)), torch.randn(20, 5))
    if bad and rank == 0:
        dist.all_reduce(loss.detach())  # ddpdoctor: rank0_all_reduce
    loss.backward()  # ddpdoctor: checkpoint_backward
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad-round", type=int, default=0)
    args = parser.parse_args()
    for number, demo in enumerate((demo_basic, demo_checkpoint), start=1):
        port = 20000 + (os.getpid() * 2 + number) % 20000
        mp.spawn(demo, args=(2, port, args.bad_round == number), nprocs=2, join=True)
