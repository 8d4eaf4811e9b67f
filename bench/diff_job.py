"""A real DDP job whose traces the ``diff`` benchmark copies to many ranks
(``bench/real_traces.py``): a small MLP with BatchNorm on 2 gloo ranks, DDP buckets small
enough for several a step, the loss all-reduced every step for logging, ~10 collectives a
step. At step ``--diverge-at`` rank 1 alone logs with ``ReduceOp.MAX`` where every other rank
sums: a mismatch gloo does not notice, so the job runs to its end and each rank records every
collective (``ddpdoctor diff`` must name that all-reduce and the reduce op that differs).
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--diverge-at", type=int, default=1500)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(48, 48), nn.BatchNorm1d(48), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(48, 4)), bucket_cap_mb=0.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 48), torch.randint(0, 4, (16,))
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        op = dist.ReduceOp.MAX if step == args.diverge_at and dist.get_rank() == 1 else \
            dist.ReduceOp.SUM
        dist.all_reduce(logged, op=op)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
