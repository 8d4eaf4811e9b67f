"""A DDP job whose epochs come from DataLoaders: 20 training batches an epoch, evaluation on
every rank at each epoch's end, 5 epochs; each rank writes what it saw to ``--out``.rank-N.json
as it goes (len(loader), batches per pass, epochs begun). Each epoch first peeks at one batch,
as pytorch/examples' trainers do.

``--uneven``: each rank trains on its own shard, no DistributedSampler, and rank 1's shard holds
one batch more (no join()): at each epoch's end rank 1's extra backward has no partner.
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BATCH = 4
EPOCHS = 5


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--uneven", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if args.uneven:
        batches = 20 + rank  # rank 1 holds one batch more than rank 0
        train_set = TensorDataset(torch.randn(batches * BATCH, 8), torch.randn(batches * BATCH, 1))
        train_loader = DataLoader(train_set, batch_size=BATCH)
    else:
        train_set = TensorDataset(torch.randn(40 * BATCH, 8), torch.randn(40 * BATCH, 1))
        train_loader = DataLoader(train_set, batch_size=BATCH,
                                  sampler=DistributedSampler(train_set))
    val_loader = DataLoader(TensorDataset(torch.randn(12 * BATCH, 8)), batch_size=BATCH)
    seen = {"len_train": len(train_loader), "len_val": len(val_loader), "train": [],
            "val": []}
    for epoch in range(EPOCHS):
        if not args.uneven:
            train_loader.sampler.set_epoch(epoch)
        # pytorch/examples' trainers peek at one batch for its size at each epoch's start: a
        # pass abandoned after one batch, which is no epoch.
        assert len(next(iter(train_loader))[0]) == BATCH
        count = 0
        for x, y in train_loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()  # ddpdoctor: backward
            opt.step()
            count += 1
        seen["train"].append(count)
        with torch.no_grad():
            seen["val"].append(sum(1 for _ in val_loader))
        with open(f"{args.out}.rank-{rank}.json", "w") as fh:
            json.dump(seen, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
