"""Rank 1 fails on its first torchrun attempt (a flaky data shard) and, restarted, on the
second attempt at another line (its checkpoint is not there): run with ``--max-restarts 1``.

Each attempt keys its rendezvous apart in torchrun's store (a PrefixStore): a restarted group
under the same keys may read the failed attempt's addresses (gloo's connectFullMesh then fails,
about 1 run in 4 under plain torchrun)."""

import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                      int(os.environ["WORLD_SIZE"]), is_master=False,
                      timeout=datetime.timedelta(seconds=60))
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{attempt}", store),
                        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
for step in range(2):
    model(torch.randn(4, 8)).sum().backward()
if rank == 1 and attempt == 0:
    raise OSError("shard-00003 unreadable")  # ddpdoctor: first_failure
if rank == 1:
    raise FileNotFoundError("checkpoint step-2.pt")  # ddpdoctor: second_failure
dist.barrier()
dist.destroy_process_group()
