"""Seed 002 pitfall: the logging ``dist.reduce`` runs on rank 0 only.

From seed 002's troubleshooting note ("Program Hangs: ensure all ranks
participate in collective operations like reduce"): the tutorial's loss
logging is moved inside ``if rank == 0:``, so only rank 0 calls
``dist.reduce(loss, dst=0)``.  Rank 1 never issues the reduce and goes on to
its next training step.  Cause id: ``rank_conditional_collective``.  Fix: call
the reduce on every rank and keep only the print under ``if rank == 0``.

Run:
    ddpdoctor run examples/rank0_only_reduce.py
    (plain: torchrun --nproc-per-node 2 examples/rank0_only_reduce.py)

Collectives (torch 2.13, gloo): seq 1-4 match (DDP init, step 0's gradient
all-reduce float32[161]).  seq 5: rank 0's reduce float32[] (scalar, dst 0)
meets rank 1's DDP bucket-rebuild broadcast int32[5] (first forward of step 1):
an op mismatch at the first divergent position, caused by a reduce that rank
1 never issues.

Observed on gloo (torch 2.13 CPU, 2 ranks): hangs after ~2 s and never
finishes (killed after 40 s; gloo's default timeout is 30 min), no error
message.  Stacks: rank 0 in ``dist.reduce`` (marker rank0_reduce), rank 1 in
the DDP forward of step 1 (``_pre_forward`` -> ``_rebuild_buckets``), the line
after train_backward's step.  On NCCL: hang.

Expected diagnosis:
  verdict: diverged
  finding: op_mismatch
  cause: rank_conditional_collective
  ranks: 0,1
  lines: rank0_reduce
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 4


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(STEPS, 4, 8) + rank
    target = torch.randn(STEPS, 4, 1)

    for step in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[step]), target[step])
        loss.backward()  # ddpdoctor: train_backward
        optimizer.step()

        # BUG: only the logging rank enters the reduce; every rank must call it.
        if rank == 0:
            log_loss = loss.clone().detach()
            dist.reduce(log_loss, dst=0)  # ddpdoctor: rank0_reduce
            print(f"step {step}: mean loss {(log_loss / world_size).item():.4f}", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
