"""Rank 0 blocks outside collectives while rank 1 waits in DDP's gradient all-reduce:
``--on queue``: on a queue whose producer thread died; ``--on lock``: on a lock a thread took
and never released (it died holding it); ``--on worker``: on a result from a worker process
that exited without sending it."""

import argparse
import multiprocessing
import queue
import threading

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--on", choices=["queue", "lock", "worker"], required=True)
args = parser.parse_args()


def producer(q):
    raise OSError("shard-00017 unreadable")  # ddpdoctor: thread_dies


def holder(lock):
    lock.acquire()
    raise RuntimeError("cache refresh failed")  # ddpdoctor: lock_holder_dies


def worker(results):
    raise SystemExit(3)  # ddpdoctor: worker_exits


def wait_for_input(kind):
    if kind == "queue":
        q = queue.Queue()
        threading.Thread(target=producer, args=(q,), name="prefetch", daemon=True).start()
        return q.get()  # ddpdoctor: blocked_queue
    if kind == "lock":
        lock = threading.Lock()
        t = threading.Thread(target=holder, args=(lock,), name="cache-refresh", daemon=True)
        t.start()
        t.join()
        with lock:  # ddpdoctor: blocked_lock
            return torch.randn(4, 8)
    results = multiprocessing.Queue()
    multiprocessing.Process(target=worker, args=(results,), name="tokenizer").start()
    return results.get()  # ddpdoctor: blocked_worker


dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 2))
for step in range(3):
    model(torch.randn(4, 8)).sum().backward()
x = wait_for_input(args.on) if rank == 0 else torch.randn(4, 8)
model(x).sum().backward()  # ddpdoctor: backward
dist.destroy_process_group()
