"""A DeepSpeed engine (ZeRO stage 0, SGD) trained on the CPU over gloo, launched with the
``deepspeed`` launcher. ``--uneven``: the last rank runs one step more than the others."""

import argparse

import deepspeed
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=0)  # what the deepspeed launcher passes
parser.add_argument("--uneven", action="store_true")
args = parser.parse_args()
deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
    "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 0}})
steps = 4 if args.uneven and rank == world - 1 else 3
for step in range(steps):
    loss = engine(torch.randn(4, 8)).sum()
    engine.backward(loss)  # ddpdoctor: backward
    engine.step()
print(f"rank {rank} done", flush=True)
