"""Seed 002: the "DDP step by step" tutorial loop, done right (healthy).

Reproduces seed 002 (tutorial: DistributedSampler + set_epoch, DDP, loss
logging with ``dist.reduce``, rank-0-only checkpoint) as a healthy run, the
baseline every diagnosis is compared against.  Every rank takes part in every
collective: the loss ``dist.reduce(loss, dst=0)`` each step, and the
``dist.barrier()`` after rank 0 writes its checkpoint (``torch.save`` into a
``tempfile.mkdtemp()`` directory, removed at the end).  The model has
BatchNorm (buffer broadcasts on every forward) and ~10.8k parameters with
``bucket_cap_mb=0.01``, so after DDP's bucket rebuild on iteration 2 each
backward issues three gradient all-reduces (float32[4420], [4160], [2240];
iteration 1 uses a single bucket of [10820]).

Run:
    ddpdoctor run examples/seed002_healthy.py [--epochs 2] [--steps 3]
    (plain: torchrun --nproc-per-node 2 examples/seed002_healthy.py)

Observed on gloo (torch 2.13 CPU, 2 ranks, defaults 2 epochs x 3 steps):
finishes in ~4 s; rank 0 prints one loss line per step; both ranks print
"rank N done"; exit 0.  Per step: broadcast float32[128] + int64[1] (BatchNorm
buffers), the gradient all-reduces, reduce float32[] (scalar loss);
after each epoch one barrier.

Expected diagnosis:
  verdict: clean
  finding: none
  cause: none
  ranks: none
  lines: none
"""
import argparse
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

BATCH = 8
IN_FEATURES = 32
HIDDEN = 64
CLASSES = 4


def make_model():
    # ~10.8k parameters: with bucket_cap_mb=0.01 (~10 KB) DDP needs several
    # gradient buckets, so every backward issues more than one all-reduce.
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN),
        torch.nn.BatchNorm1d(HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, CLASSES),
    )


def main():
    parser = argparse.ArgumentParser(description="healthy DDP tutorial loop (seed 002)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="training steps per epoch")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    n = args.steps * BATCH * world_size
    train_dataset = TensorDataset(torch.randn(n, IN_FEATURES), torch.randint(0, CLASSES, (n,)))
    train_sampler = DistributedSampler(train_dataset, shuffle=True, seed=0)
    train_loader = DataLoader(train_dataset, batch_size=BATCH, sampler=train_sampler, drop_last=True)

    model = DDP(make_model(), bucket_cap_mb=0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    ckpt_dir = tempfile.mkdtemp(prefix="ddpdoctor_seed002_") if rank == 0 else None

    iter_no = 0
    try:
        for epoch in range(args.epochs):
            train_loader.sampler.set_epoch(epoch)
            for data, label in train_loader:
                optimizer.zero_grad()
                prediction = model(data)  # ddpdoctor: train_forward
                loss = loss_fn(prediction, label)
                loss.backward()  # ddpdoctor: train_backward
                optimizer.step()
                iter_no += 1

                # Logging: every rank takes part in the reduce.
                log_loss = loss.clone().detach()
                dist.reduce(log_loss, dst=0)  # ddpdoctor: log_reduce
                if rank == 0:
                    print(f"epoch {epoch} iter {iter_no}: loss {(log_loss / world_size).item():.4f}", flush=True)

            # Checkpoint: only rank 0 writes, every rank waits at the barrier.
            if rank == 0:
                checkpoint_state = {
                    "iter_no": iter_no,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                }
                torch.save(checkpoint_state, os.path.join(ckpt_dir, f"ckpt_{epoch}.pt"))
            dist.barrier()  # ddpdoctor: ckpt_barrier
    finally:
        if ckpt_dir is not None:
            shutil.rmtree(ckpt_dir, ignore_errors=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
