"""Seed 000: only rank 0 evaluates through the DDP wrapper, without ``no_grad``.

Same set-up as ``seed000_eval_nograd.py`` (seed 000, CanTechLab: BatchNorm
model, DDP with the default ``broadcast_buffers=True``, only rank 0 evaluates
after each epoch through ``model(x)``), but the evaluation forgets
``torch.no_grad()``.  With grad enabled every eval forward takes DDP's training
path: it broadcasts the BatchNorm buffers each time (not just once) and arms
the reducer for a backward that never comes.
Cause id: ``rank_conditional_ddp_forward``.  Fix: evaluate with
``model.module`` under ``torch.no_grad()`` (or evaluate on every rank).

Run:
    ddpdoctor run examples/seed000_eval_grad.py
    (plain: torchrun --nproc-per-node 2 examples/seed000_eval_grad.py)

Collectives (torch 2.13, gloo, from the flight recorder): seq 1-15 match.
seq 16-17: rank 0's first eval broadcast (float32[32], int64[1]) is matched by
rank 1's next training buffer broadcast - same op and shapes, different call
sites (the root: evaluate() vs the training loop).  seq 18: rank 0's second
eval broadcast float32[32] meets rank 1's gradient all-reduce float32[210]
(the first op/shape mismatch, a consequence of the root).

Observed on gloo (torch 2.13 CPU, 2 ranks): the job hangs after ~3 s and
never finishes (killed after 40 s; gloo's default timeout is 30 min).  Stacks
of the hung ranks: rank 0 in ``_sync_buffers`` -> ``_distributed_broadcast_coalesced``
under the eval forward (marker eval_forward, second eval batch); rank 1 in
``loss.backward()`` (marker train_backward), first step of epoch 1.  No error
message from either rank.  On NCCL the job hangs at epoch 2 (the seed).

Expected diagnosis:
  verdict: diverged
  finding: callsite_divergence
  cause: rank_conditional_ddp_forward
  ranks: 0,1
  lines: eval_forward,train_forward
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EPOCHS = 2
STEPS_PER_EPOCH = 3
BATCH = 4
EVAL_BATCHES = 2


def make_model():
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.BatchNorm1d(16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 2),
    )


def evaluate(model, loader):
    model.eval()
    correct = total = 0
    # BUG: no torch.no_grad() here, so every eval forward goes through DDP's
    # training path (buffer broadcast each time, reducer armed for a backward).
    for i, (x, y) in enumerate(loader):
        if i == EVAL_BATCHES:
            break
        out = model(x)  # ddpdoctor: eval_forward
        correct += (out.argmax(1) == y).sum().item()
        total += y.numel()
    model.train()
    return correct / max(total, 1)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)

    n_train = STEPS_PER_EPOCH * BATCH * world
    train_set = TensorDataset(torch.randn(n_train, 8), torch.randint(0, 2, (n_train,)))
    val_set = TensorDataset(torch.randn(EVAL_BATCHES * BATCH, 8), torch.randint(0, 2, (EVAL_BATCHES * BATCH,)))
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=BATCH, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=BATCH)

    model = DDP(make_model())  # broadcast_buffers=True (the default)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            opt.zero_grad()
            out = model(x)  # ddpdoctor: train_forward
            loss = loss_fn(out, y)
            loss.backward()  # ddpdoctor: train_backward
            opt.step()
        if rank == 0:
            acc = evaluate(model, val_loader)
            print(f"epoch {epoch}: val acc {acc:.2f}", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
