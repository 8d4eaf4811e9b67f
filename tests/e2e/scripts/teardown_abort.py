"""Finishes its work, then aborts during interpreter teardown, like gloo + DDP sometimes does.

An object left in ``__main__`` whose finaliser calls ``os.abort()`` fires when the interpreter
clears modules, after ``atexit`` handlers (ddpdoctor's exit record included) have run.
"""

import os

import torch
import torch.distributed as dist


class _AbortAtTeardown:
    def __del__(self) -> None:
        os.abort()


dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
print(f"rank {dist.get_rank()} finished")
if dist.get_rank() == 1:
    _bomb = _AbortAtTeardown()
