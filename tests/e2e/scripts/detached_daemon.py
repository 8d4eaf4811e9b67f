"""Rank 0 starts a daemon the way daemons start (a fork, ``setsid``, a second fork: the
daemon is in a session of its own and re-parented away from the rank) and a plain child it
never waits for; both outlive the script. Each writes its pid to ``sys.argv[1]`` (a folder)."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # as daemons do: the job's output is not theirs to hold
                os.dup2(null, fd)
            with open(os.path.join(sys.argv[1], "daemon"), "w") as fh:
                fh.write(str(os.getpid()))
            time.sleep(60)
        os._exit(0)
    if os.fork() == 0:
        with open(os.path.join(sys.argv[1], "child"), "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
t = torch.ones(4)
for _ in range(4):
    dist.all_reduce(t)
time.sleep(0.5)  # the pid files are written
dist.destroy_process_group()
