"""A rank that forks a child with ``os.fork()`` before it joins the process group; the child
ends with ``sys.exit`` (its atexit handlers run) or an uncaught exception (the excepthook
runs). (A child forked after ``init_process_group`` hangs at exit in gloo's destructor, with
or without ddpdoctor.)"""

import os
import sys

import torch
import torch.distributed as dist

pid = os.fork()
if pid == 0:
    if sys.argv[1:] == ["raise"]:
        raise RuntimeError("the child fails")
    sys.exit(0)
os.waitpid(pid, 0)
# The rank's trace, as the child left it (the rank trims it when it closes it at the end).
trace = os.path.join(os.environ["DDPDOCTOR_LOGDIR"], f"rank-{os.environ['RANK']}.jsonl")
with open(trace, "rb") as fh:
    headers = fh.read().count(b'"kind": "header"')
if headers != 1:
    sys.exit(f"the child wrote into this rank's trace: {headers} headers")
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(6):
    dist.all_reduce(t)
dist.destroy_process_group()
