"""Seed 003: one rank raises in the middle of training (process isolation).

Reproduces seed 003 ("Advanced Error Handling in PyTorch DDP", step 1: rank 1
raises ``ValueError("Simulated error in process 1")``).  Here the error is
raised inside a real DDP training loop: rank 1 raises after 2 training steps,
rank 0 goes on to its third step and blocks in the gradient all-reduce that
rank 1 will never issue.  Cause id: ``rank_crashed``.  The useful answer is
the crashing rank's own exception and line, not the survivors' symptom.

Run:
    ddpdoctor run examples/seed003_crash.py
    (plain: torchrun --nproc-per-node 2 examples/seed003_crash.py)

Observed on gloo (torch 2.13 CPU, 2 ranks, ~3-4 s): both ranks print steps 0
and 1; rank 1 exits 1 with ``ValueError: Simulated error in process 1``
(marker raise_error); rank 0, blocked in ``loss.backward()`` of step 2
(marker train_backward), fails with ``RuntimeError:
[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer`` (4 of 4
runs) while torchrun SIGTERMs it (torchrun's summary: rank 1 exitcode 1 as
root cause, rank 0 exitcode -15); torchrun exits 1.  On NCCL the survivors hang until the
watchdog timeout.

Expected diagnosis:
  verdict: crashed
  finding: rank_crashed
  cause: rank_crashed
  ranks: 1
  lines: raise_error
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 5
CRASH_RANK = 1
CRASH_AFTER = 2  # training steps completed before the crash


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(STEPS, 4, 8)
    target = torch.randn(STEPS, 4, 1)

    for step in range(STEPS):
        if rank == CRASH_RANK and step == CRASH_AFTER:
            raise ValueError(f"Simulated error in process {rank}")  # ddpdoctor: raise_error
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[step]), target[step])
        loss.backward()  # ddpdoctor: train_backward
        optimizer.step()
        print(f"Process {rank}: step {step} loss {loss.item():.4f}", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
