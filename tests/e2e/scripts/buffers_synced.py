"""DDP's coalesced broadcasts reach every rank: parameters at construction and BatchNorm
buffers before each forward, set differently on each rank beforehand. Exits 1 on rank 1 when a
value was not received (ddpdoctor runs these broadcasts on the backend directly)."""

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def states(module: torch.nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in list(module.parameters()) + list(module.buffers())]


def same_as_rank0(module: torch.nn.Module) -> bool:
    mine = states(module)
    theirs = [t.clone() for t in mine]
    for t in theirs:
        dist.broadcast(t, 0)  # rank 0's values, recorded as the script's own broadcasts
    return all(torch.equal(a, b) for a, b in zip(mine, theirs))


class Net(torch.nn.Module):
    """Parameters and buffers of three dtypes: float32, float64 and BatchNorm's int64 count."""

    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 16)
        self.norm = torch.nn.BatchNorm1d(16)
        self.last = torch.nn.Linear(16, 4, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.norm(self.first(x)).double())


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different parameters on each rank before DDP
    model = Net()
    with torch.no_grad():
        for buffer in model.buffers():
            buffer.fill_(rank + 1)
    ddp = DDP(model)
    ok = same_as_rank0(model)
    model.eval()  # BatchNorm keeps its running statistics: what the forward received
    with torch.no_grad():
        for buffer in model.buffers():
            buffer.fill_(10 * (rank + 1))
    ddp(torch.randn(4, 8)).sum()  # ddpdoctor: forward
    ok = same_as_rank0(model) and ok
    dist.destroy_process_group()
    print(f"rank {rank}: {'synced' if ok else 'NOT synced'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
