"""A training loop under the compiler, as the DDP and FSDP2 notes write it.

``--mode ddp``: ``torch.compile(DDP(model))`` (DDPOptimizer's bucketed graphs);
``--mode autograd``: the same with compiled autograd and DDP's Python reducer;
``--mode fsdp2``: ``fully_shard`` on each layer and the model, run eagerly;
``--mode dtensor``: tensor parallelism with DTensor (``parallelize_module`` on a 1-D device
mesh: column-wise then row-wise, one all-reduce per forward), run eagerly.
``--uneven``: the last rank runs one step more than the others (a divergence).
Prints a checksum of the weights after every step, to compare with plain torchrun.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["ddp", "autograd", "fsdp2", "dtensor"], required=True)
parser.add_argument("--uneven", action="store_true")
args = parser.parse_args()

if args.mode == "autograd":
    import torch._dynamo

    torch._dynamo.config.optimize_ddp = "python_reducer"
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
if args.mode == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    step_model = fully_shard(model)
elif args.mode == "dtensor":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    step_model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
else:
    step_model = torch.compile(DDP(model), backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
steps = 3 + (1 if args.uneven and rank == world - 1 else 0)
for step in range(steps):
    torch.manual_seed(100 + step)
    x = torch.randn(8, 16)
    if args.mode == "autograd":
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
            loss = step_model(x).sum()
            loss.backward()  # ddpdoctor: backward_ca
    else:
        loss = step_model(x).sum()  # ddpdoctor: forward
        loss.backward()  # ddpdoctor: backward
    opt.step()
    opt.zero_grad()
    total = sum(p.detach().full_tensor().sum().item() if hasattr(p, "full_tensor")
                else p.detach().sum().item() for p in model.parameters())
    print(f"rank {rank} step {step} weights {total:.6f}", flush=True)
dist.destroy_process_group()
