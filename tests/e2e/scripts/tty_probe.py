"""Reports, from each rank, whether its stderr and stdout are terminals and how wide, draws a
progress bar with ``\r`` on stdout, then writes a line to stderr: ddpdoctor (its copier of a
rank's stderr, its live view) must leave all of that as it was."""

import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
columns = os.get_terminal_size(2).columns if os.isatty(2) else None
print(f"rank {rank}: stderr tty={os.isatty(2)} columns={columns}", flush=True)
print(f"rank {rank}: stdout tty={sys.stdout.isatty()}", flush=True)
dist.barrier()
for step in range(1, 4):
    sys.stdout.write(f"\rrank {rank} bar {step}/3")
    sys.stdout.flush()
    time.sleep(0.1)
sys.stdout.write("\n")
sys.stdout.flush()
dist.barrier()
sys.stderr.write(f"rank {rank} says goodbye on stderr\n")
dist.barrier()
dist.destroy_process_group()
