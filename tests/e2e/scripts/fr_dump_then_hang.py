"""A job run without ddpdoctor, with PyTorch's flight recorder on, that hangs on rank 0's extra
barrier; a thread of each rank dumps the flight recorder to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``
two seconds into the hang, as NCCL's watchdog does when a collective times out."""

import os
import threading
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()


def dump_later() -> None:
    time.sleep(2)
    data = torch._C._distributed_c10d._dump_fr_trace(includeCollectives=True,
                                                      includeStackTraces=True)
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as fh:
        fh.write(data)


model = DDP(torch.nn.Linear(4, 1))
for step in range(3):
    model(torch.ones(2, 4)).sum().backward()  # ddpdoctor: backward
threading.Thread(target=dump_later, daemon=True).start()
if rank == 0:
    dist.barrier()  # ddpdoctor: barrier
model(torch.ones(2, 4)).sum().backward()
