"""Reads many rank files at once in worker processes, when there are enough bytes to pay off.

Reading a trace is Python work per line (about 1.3 µs per collective on a 2-core VM): 1024
ranks × 20,000 collectives is half a minute in one process. Files are independent, so large
runs are read by forked worker processes, one per core (at most :data:`MAX_WORKERS`), each
taking :data:`FILES_PER_TASK` files at a time; results come back in file order. What crosses
the pipe is ddpdoctor's own objects built from the JSON in the worker (the usual
``multiprocessing`` transport): the trace files themselves are only ever decoded as JSON.

One process reads when forking would not pay or is not safe: fewer than
:data:`MIN_FILES` files or :data:`MIN_BYTES` bytes, a single core, a platform other than
Linux, or other threads running in this process (a fork copies their locks, held or not).
A worker pool that breaks (a worker killed, out of memory) is not fatal: what it did not
deliver is read here.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import Future

T = TypeVar("T")

MIN_FILES = 16
MIN_BYTES = 64 * 1024 * 1024
MAX_WORKERS = 4
FILES_PER_TASK = 16


def workers_for(files: Sequence[Path]) -> int:
    """How many worker processes should read ``files`` (0: read them in this process)."""
    if len(files) < MIN_FILES or not sys.platform.startswith("linux") or _threads_running():
        return 0
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return 0
    total = 0
    for path in files:
        try:
            total += path.stat().st_size
        except OSError:
            pass  # the reader reports it
    return min(cores, MAX_WORKERS) if total >= MIN_BYTES else 0


def _threads_running() -> bool:
    """Other threads run in this process (``ddpdoctor run``'s launcher, a test runner's)."""
    return threading.active_count() > 1


def _quiet_worker() -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool; the workers must not
    # print a traceback each.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def in_batches(read: Callable[[list[Path]], list[T]], files: Sequence[Path],
               workers: int) -> Iterator[T]:
    """``read`` applied to ``files`` in batches of :data:`FILES_PER_TASK`, results in file
    order as each batch is read (a caller can show progress): by ``workers`` forked processes
    when ``workers`` > 1, else here. ``read`` must be a module-level function (the workers find
    it by name). Errors it raises reach the caller as raised."""
    files = list(files)
    tasks = [files[i:i + FILES_PER_TASK] for i in range(0, len(files), FILES_PER_TASK)]
    if workers < 2:
        for task in tasks:
            yield from read(task)
        return
    # Imported here: ``ddpdoctor run``'s launcher reads a handful of files, in this process,
    # and its start-up is part of every job's cost.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_quiet_worker)
    futures: list[Future[list[T]]] = []
    try:
        futures = [pool.submit(read, task) for task in tasks]
        for task, future in zip(tasks, futures):
            try:
                results = future.result()
            except BrokenProcessPool:
                results = read(task)  # a worker died: read its share here
            yield from results
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
