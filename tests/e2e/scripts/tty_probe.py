"""Reports, from each rank, whether its stderr is a terminal and how wide, then writes a line
to stderr: ddpdoctor's copier of a rank's stderr must leave both as they were."""

import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
columns = os.get_terminal_size(2).columns if os.isatty(2) else None
print(f"rank {rank}: stderr tty={os.isatty(2)} columns={columns}", flush=True)
sys.stderr.write(f"rank {rank} says goodbye on stderr\n")
dist.barrier()
dist.destroy_process_group()
