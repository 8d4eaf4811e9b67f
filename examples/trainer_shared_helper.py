"""Evaluation on rank 0 through a training helper: one line, two callers.

The shape of pytorch/examples' ``distributed/minGPT-ddp`` Trainer (and of most trainer
classes): training and evaluation both go through ``_run_batch()``, which calls the DDP
model, and ``_run_epoch(train=...)`` chooses which.  Here evaluation runs on rank 0 alone
(``if self.test_loader and self.rank == 0:``), as it does in many scripts that only want
rank 0 to print a validation loss.  A DDP forward broadcasts the module buffers (BatchNorm
statistics; minGPT's attention mask) from rank 0 even under ``torch.no_grad()``, so rank 0's
evaluation issues a broadcast that rank 1's next *training* broadcast answers: same op, same
shapes, same source line (``_run_batch``).  Only the caller differs: ``train()``'s
evaluation line on rank 0, its training line on rank 1.  The sequences then drift by one
collective, and at the end rank 0 waits in a broadcast that rank 1, finished, never issues.
Cause id: ``rank_conditional_ddp_forward``.  Fix: evaluate through ``model.module`` on the
one rank, or evaluate on every rank.

Run:
    ddpdoctor run examples/trainer_shared_helper.py
    (plain: torchrun --nproc-per-node 2 examples/trainer_shared_helper.py)

Observed on gloo (torch 2.13 CPU, 2 ranks): rank 1 prints "rank 1 done" and exits; rank 0
fails in its last forward with gloo's "Connection closed by peer", or waits until
ddpdoctor's hang timeout stops it.  On NCCL the job hangs.  ddpdoctor names the first
collective that paired rank 0's evaluation with rank 1's training, with the two callers.

Expected diagnosis:
  verdict: diverged
  finding: callsite_divergence
  cause: rank_conditional_ddp_forward
  ranks: 0,1
  lines: model_call
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EPOCHS = 2
BATCH = 4
STEPS = 3


class Trainer:
    def __init__(self, model, train_loader, test_loader, rank):
        self.rank = rank
        self.model = DDP(model)  # broadcast_buffers=True (the default)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.train_loader = train_loader
        self.test_loader = test_loader

    def _run_batch(self, x, y, train=True):
        with torch.set_grad_enabled(train):
            out = self.model(x)  # ddpdoctor: model_call
            loss = torch.nn.functional.cross_entropy(out, y)
        if train:
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch, loader, train=True):
        if train:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = self._run_batch(x, y, train)
        print(f"[rank {self.rank}] epoch {epoch} {'train' if train else 'eval'} loss {loss:.3f}",
              flush=True)

    def train(self):
        for epoch in range(EPOCHS):
            self._run_epoch(epoch, self.train_loader, train=True)
            if self.test_loader and self.rank == 0:
                self._run_epoch(epoch, self.test_loader, train=False)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    n = STEPS * BATCH * world
    train_set = TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,)))
    test_set = TensorDataset(torch.randn(2 * BATCH, 8), torch.randint(0, 2, (2 * BATCH,)))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))
    trainer = Trainer(model,
                      DataLoader(train_set, batch_size=BATCH, sampler=DistributedSampler(train_set)),
                      DataLoader(test_set, batch_size=BATCH), rank)
    trainer.train()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
