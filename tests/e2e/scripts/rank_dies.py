"""Rank 1 dies after a few all-reduces: ``--how segfault`` (SIGSEGV), ``--how exit``
(os._exit(3)) or ``--how kill`` (SIGKILL)."""

import argparse
import ctypes
import os
import signal

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--how", choices=["segfault", "exit", "kill"], required=True)
how = parser.parse_args().how
dist.init_process_group("gloo")
for step in range(10):
    t = torch.ones(4)
    dist.all_reduce(t)  # ddpdoctor: all_reduce
    if step == 3 and dist.get_rank() == 1:
        if how == "segfault":
            ctypes.string_at(0)  # ddpdoctor: segfault
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # ddpdoctor: sigkill
        os._exit(3)  # ddpdoctor: os_exit
dist.destroy_process_group()
