"""A one-rank job that writes to stdout and stderr and exits with code 7 (own launcher)."""

import os
import sys

import torch
import torch.distributed as dist

from ddpdoctor.launch.command import free_port

dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                        world_size=1)
t = torch.ones(2)
dist.all_reduce(t)
print("to stdout: sum", t.sum().item())
print("to stderr: marker", file=sys.stderr)
print("sitecustomize marker:", os.environ.get("USER_SITECUSTOMIZE_RAN", "no"))
dist.destroy_process_group()
sys.exit(7)
