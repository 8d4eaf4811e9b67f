"""Tensor parallelism as pytorch/examples' tensor_parallel_example.py sets it up: the script
never calls init_process_group; init_device_mesh starts the default group."""

import os

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
for step in range(3):
    torch.manual_seed(step)
    model(torch.rand(3, 4)).sum().backward()  # RowwiseParallel: one all-reduce per forward
torch.distributed.destroy_process_group()
