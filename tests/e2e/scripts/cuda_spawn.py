"""A CUDA-only DDP script started with mp.spawn (one process per GPU): exercises CPU mode.

Every CUDA idiom ddpdoctor --cpu maps appears once: torch.cuda.device_count() for the world
size, set_device, current_device, ``with torch.cuda.device(i)``, init_process_group with
nccl and a CUDA device_id, .cuda() on modules and tensors, factory functions with a CUDA
device, DDP(device_ids=..., output_device=...), pin_memory, torch.cuda.synchronize(),
torch.load with a dict map_location. ``--out FILE``: rank 0 writes a JSON summary there.
"""
import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def worker(rank, world_size, out, steps):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.cuda.set_device(rank)
    assert torch.cuda.current_device() == rank
    dist.init_process_group("nccl", rank=rank, world_size=world_size,
                            device_id=torch.device(f"cuda:{rank}"))
    device = torch.device("cuda", rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).cuda()
    ddp = DDP(model, device_ids=[rank], output_device=rank)
    data = TensorDataset(torch.randn(32, 8), torch.randn(32, 2))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data), pin_memory=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    done = 0
    for x, y in loader:
        if done == steps:
            break
        with torch.cuda.device(rank):
            x, y = x.cuda(non_blocking=True), y.to(device, non_blocking=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        done += 1
    count = torch.ones(1, device=f"cuda:{rank}")
    dist.all_reduce(count)
    path = os.path.join(tempfile.gettempdir(), f"ddpdoctor_cuda_spawn_{os.getpid()}.pt")
    torch.save(model.state_dict(), path)
    state = torch.load(path, map_location={"cuda:0": f"cuda:{rank}"})
    os.unlink(path)
    model.load_state_dict(state)
    if rank == 0 and out:
        with open(out, "w") as fh:
            json.dump({"world_size": world_size, "count": count.item(), "steps": done,
                       "cuda_available": torch.cuda.is_available(),
                       "device": str(next(model.parameters()).device),
                       "backend": dist.get_backend()}, fh)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    world_size = torch.cuda.device_count()
    mp.spawn(worker, args=(world_size, args.out, args.steps), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
