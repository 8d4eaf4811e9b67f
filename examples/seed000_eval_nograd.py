"""Seed 000: only rank 0 evaluates through the DDP wrapper (``no_grad`` variant).

Reproduces seed 000 (CanTechLab, "解决PyTorch DDP训练卡住问题": training hangs
at epoch 2; ``broadcast_buffers=False`` "fixes" it).  The model has BatchNorm
and is wrapped in DistributedDataParallel with the default
``broadcast_buffers=True``.  After each training epoch only rank 0 evaluates,
and it calls the DDP wrapper (``model(x)``) instead of the bare module
(``model.module(x)``).  A DDP forward broadcasts the BatchNorm buffers from
rank 0 even under ``torch.no_grad()`` (once per eval, on the first no-grad
forward), so rank 0 issues collectives that rank 1 never issues.
Cause id: ``rank_conditional_ddp_forward``.  Fix: evaluate with
``model.module`` (or evaluate on every rank); ``broadcast_buffers=False`` only
hides it.

Run:
    ddpdoctor run examples/seed000_eval_nograd.py
    (plain: torchrun --nproc-per-node 2 examples/seed000_eval_nograd.py)

Collectives (torch 2.13, gloo, per rank, from the flight recorder): each
training step is buffer broadcast float32[32] + int64[1], then one gradient
all-reduce float32[210].  Rank 0's eval broadcasts (seq 16-17) are matched by
rank 1's first training broadcasts of epoch 1 - same op, same shapes, wrong
partner (the call sites differ: evaluate() vs the training loop).  Rank 0's
own first training forward of epoch 1 then skips its buffer broadcast (DDP
only syncs buffers again after a grad-enabled forward), so the sequences
realign and epoch 1 trains "fine".  Rank 0's second evaluation (after the
last epoch) is left with an unmatched broadcast.

Observed on gloo (torch 2.13 CPU, 2 ranks, ~4 s, 6 runs): rank 0 prints
"epoch 0: val acc 0.25", rank 1 prints "rank 1 done" and exits (once in 6 runs
with SIGABRT at teardown, the known gloo DDP exit abort); rank 0 fails in the eval forward of the second evaluation with
``RuntimeError: [.../gloo/transport/tcp/pair.cc:553] Connection closed by
peer`` once rank 1 is gone; torchrun exits 1.  Nothing in gloo's message names
the collective or the line.  On NCCL the job hangs at epoch 2 (the seed).

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
    with torch.no_grad():
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
            loss.backward()
            opt.step()
        if rank == 0:
            acc = evaluate(model, val_loader)
            print(f"epoch {epoch}: val acc {acc:.2f}", flush=True)

    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
