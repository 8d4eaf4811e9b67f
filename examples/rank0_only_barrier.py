"""A checkpoint barrier inside ``if rank == 0:`` (rank-conditional collective).

Related to seed 002's checkpointing section ("only save checkpoints on rank
0"): the ``dist.barrier()`` meant to make every rank wait for the checkpoint
is put inside the rank-0 branch, so rank 1 never calls it and goes on to the
next epoch's training step.  Cause id: ``rank_conditional_collective``.  Fix:
move the barrier out of the ``if rank == 0:`` block.

Run:
    ddpdoctor run examples/rank0_only_barrier.py
    (plain: torchrun --nproc-per-node 2 examples/rank0_only_barrier.py)

Collectives (torch 2.13, gloo): seq 1-8 match (DDP init, 3 steps of epoch 0,
bucket-rebuild broadcasts).  seq 9: rank 0's barrier meets rank 1's gradient
all-reduce float32[161] (first step of epoch 1): an op mismatch at the first
divergent position, caused by a barrier that rank 1 never issues.

Observed on gloo (torch 2.13 CPU, 2 ranks): hangs after ~2 s and never
finishes (killed after 40 s), no error message.  Stacks: rank 0 in
``dist.barrier()`` (marker rank0_barrier), rank 1 in ``loss.backward()``
(marker train_backward) of epoch 1.  On NCCL: hang.

Expected diagnosis:
  verdict: diverged
  finding: op_mismatch
  cause: rank_conditional_collective
  ranks: 0,1
  lines: rank0_barrier
"""
import io

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

EPOCHS = 2
STEPS = 3


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(EPOCHS, STEPS, 4, 8) + rank
    target = torch.randn(EPOCHS, STEPS, 4, 1)
    for epoch in range(EPOCHS):
        for step in range(STEPS):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data[epoch, step]), target[epoch, step])
            loss.backward()  # ddpdoctor: train_backward
            optimizer.step()

        if rank == 0:
            # A real script saves to a file; here to memory, so that the hung job, stopped
            # without running any cleanup, leaves nothing behind.
            torch.save(model.module.state_dict(), io.BytesIO())
            # BUG: the barrier is inside the rank-0 branch, so only rank 0 waits.
            dist.barrier()  # ddpdoctor: rank0_barrier
            print(f"epoch {epoch}: checkpoint saved", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
