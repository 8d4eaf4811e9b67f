"""A multi-GPU torchrun training script, written for CUDA/NCCL only (healthy).

The style of pytorch/examples ``distributed/ddp-tutorial-series/multigpu_torchrun.py``
(own code): ``init_process_group(backend="nccl")`` after
``torch.cuda.set_device(local_rank)``, the model moved with ``.to(local_rank)`` and wrapped in
``DDP(model, device_ids=[local_rank])``, batches moved with ``.to(local_rank)``, a
``DataLoader(pin_memory=True)`` over a ``DistributedSampler``, a snapshot written by rank 0
and resumed with ``torch.load(map_location=f"cuda:{local_rank}")``, a loss total kept in a
``.cuda()`` tensor and summed with ``dist.all_reduce``. There is not one CPU branch: without
``--cpu`` it needs a GPU per process.

Run (CI, no GPU):
    ddpdoctor run --cpu --epoch-steps 2 examples/ci/multigpu_torchrun_style.py
    (GPUs: torchrun --nproc-per-node 2 examples/ci/multigpu_torchrun_style.py)

Observed on gloo (torch 2.13 CPU, 2 ranks, ``--cpu``): 4 epochs of 2 steps; with
``--epoch-steps 2`` both ranks run epochs 0 and 1 (rank 0 saves its snapshot after each) and
stop at the start of epoch 2 (iteration 5), ~3 s, exit 0. Before the first step: DDP's construction (all-gather int64[1],
broadcasts int64[12] and float32[1604]); per step: one gradient bucket all-reduce
(float32[1604]), the bucket-rebuild broadcasts on iteration 2, and the all-reduce of the
step's loss and count (float32[2]).

Expected diagnosis:
  verdict: clean
  finding: none
  cause: none
  ranks: none
  lines: none
"""
import argparse
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.distributed import all_reduce, destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=generator), torch.randint(0, 4, (1,), generator=generator).item())
                     for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


def ddp_setup():
    assert torch.cuda.is_available(), "this script needs GPUs"
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model.to(self.local_rank)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.local_rank], bucket_cap_mb=0.01)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=f"cuda:{self.local_rank}")
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)  # ddpdoctor: train_forward
        loss = F.cross_entropy(output, targets)
        loss.backward()  # ddpdoctor: train_backward
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        totals = torch.zeros(2).cuda()
        for source, targets in self.train_data:
            source = source.to(self.local_rank, non_blocking=True)
            targets = targets.to(self.local_rank, non_blocking=True)
            loss = self._run_batch(source, targets)
            step = torch.tensor([loss.item(), 1.0], device=f"cuda:{self.local_rank}")
            all_reduce(step)  # ddpdoctor: loss_allreduce
            totals += step
        if self.global_rank == 0:
            print(f"[GPU{self.global_rank}] epoch {epoch} | steps {len(self.train_data)} "
                  f"| mean loss {totals[0].item() / max(totals[1].item(), 1.0):.4f}", flush=True)

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
        torch.save(snapshot, self.snapshot_path)
        print(f"epoch {epoch}: snapshot saved", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = RandomDataset(64)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    return train_set, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, pin_memory=True, shuffle=False,
                      sampler=DistributedSampler(dataset))


def main(save_every, total_epochs, batch_size, snapshot_path):
    ddp_setup()
    print(f"rank {os.environ['RANK']}: {torch.cuda.device_count()} GPUs, using cuda:{torch.cuda.current_device()}", flush=True)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="multi-GPU training job (torchrun)")
    parser.add_argument("--total-epochs", type=int, default=4)
    parser.add_argument("--save-every", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16, help="input batch size on each device")
    parser.add_argument("--snapshot-path", help="default: a file in the temporary folder, one per job",
                        default=os.path.join(tempfile.gettempdir(), f"ddpdoctor_ci_snapshot_{os.environ.get('MASTER_PORT')}.pt"))
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot_path)
