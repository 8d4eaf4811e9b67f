"""DDP jobs whose gradient buckets are recorded once per backward (runtime/ddp_buckets.py: from
the third forward on), healthy or diverging well after that.

``--mode``:
  healthy      train ``--steps`` steps (several buckets, no BatchNorm)
  grad_penalty each step also takes the gradient of the output w.r.t. the input first
               (``torch.autograd.grad``: a backward through DDP's output that issues no bucket)
  no_sync      every other step accumulates its gradients under ``no_sync()`` (no bucket)
  comm_hook    registers DDP's default all-reduce comm hook at step 4
  join         enters ``join()`` at step 4 with one input more on rank 1
  extra_step   rank 1 runs one step more, while rank 0 goes on to a barrier
  dies         rank 1 dies inside its backward at step 6, after some of its buckets went out
  skip_layer   rank 1 leaves the last layer out of its forward at step 6
               (``find_unused_parameters=False``: DDP refuses rank 1's next forward)
"""

import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
            torch.nn.ReLU(), torch.nn.Linear(128, 64))
        self.head = torch.nn.Linear(64, 4)
        self.skip = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return h[:, :4] if self.skip else self.head(h)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="healthy")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    ddp = DDP(net, bucket_cap_mb=0.02)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)
    steps = args.steps + (1 if args.mode in ("extra_step", "join") and rank == 1 else 0)

    def step(i: int) -> None:
        x = torch.randn(8, 32, generator=gen, requires_grad=args.mode == "grad_penalty")
        if args.mode == "skip_layer" and rank == 1 and i == 6:
            net.skip = True
        accumulate = args.mode == "no_sync" and i % 2 == 1
        with ddp.no_sync() if accumulate else contextlib.nullcontext():
            out = ddp(x)
            if args.mode == "grad_penalty":
                (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
                loss = out.pow(2).mean() + g.pow(2).mean()
            else:
                loss = out.pow(2).mean()
            if args.mode == "dies" and rank == 1 and i == 6:
                # The first layer's gradient comes last: the later layers' buckets are out.
                net.body[0].weight.register_hook(lambda grad: os._exit(3))
            loss.backward()  # ddpdoctor: backward
        if not accumulate:
            opt.step()
            opt.zero_grad()

    for i in range(min(steps, 4) if args.mode in ("comm_hook", "join") else steps):
        step(i)
    if args.mode == "comm_hook":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        for i in range(4, steps):
            step(i)
    if args.mode == "join":
        with ddp.join():
            for i in range(4, steps):
                step(i)
    if args.mode == "extra_step" and rank == 0:
        dist.barrier()  # ddpdoctor: barrier
    # Whether ddpdoctor (when it runs the job) still records this model's buckets per backward.
    plans = getattr(sys.modules.get("ddpdoctor.runtime.ddp_buckets"), "_PLANS", {})
    print(f"rank {rank}: per backward: {type(plans.get(ddp)).__name__ == '_Plan'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
