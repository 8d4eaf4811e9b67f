"""Rank 1 never reaches init_process_group (stuck in its own start-up); rank 0 waits in it."""

import os
import time

import torch.distributed as dist


def load_data() -> None:
    time.sleep(3600)  # ddpdoctor: stuck_before_init


if int(os.environ["RANK"]) == 1:
    load_data()
dist.init_process_group("gloo")  # ddpdoctor: init
dist.barrier()
