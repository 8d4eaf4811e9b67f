"""Ranks without torch that write real traces at a set rate, for the launcher's benchmark.

``python fake_ranks.py --ranks 8 --rate 1000 --seconds 20`` run under ``ddpdoctor run
--launcher python`` starts 8 processes; each opens its trace with the rank's own
:class:`~ddpdoctor.runtime.writer.TraceWriter` (its writer thread, its progress block where
the version has one) in the folder ddpdoctor gives it, and issues collectives that complete
at once, in the pattern of a DDP step (two buffer-broadcast chunks, then gradient buckets,
from their own call sites), ``rate`` a second, paced every 10 ms, as many on every rank.
Once every rank issues collectives it creates the file ``--steady`` names (the benchmark's
measuring window starts there); each ends cleanly after ``seconds``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

STACKS = {
    "ddp.broadcast_buffers": (("/job/train.py", 60, "forward"), ("/job/train.py", 90, "main")),
    "ddp.bucket": (("/job/train.py", 61, "backward"), ("/job/train.py", 90, "main")),
}
STEP = (("broadcast", "ddp.broadcast_buffers", 2048), ("broadcast", "ddp.broadcast_buffers", 64),
        ("all_reduce", "ddp.bucket", 262144), ("all_reduce", "ddp.bucket", 4096000))
TICK = 0.01


class _Done:
    """A Work that has completed."""

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def get_future(self) -> object:
        return self

    def value(self) -> None:
        return None


def rank_main(rank: int, world: int, rate: float, seconds: float, started: object) -> None:
    from ddpdoctor.runtime import env
    from ddpdoctor.runtime.writer import TraceWriter
    from ddpdoctor.trace import schema

    logdir = os.environ[env.LOGDIR]
    writer = TraceWriter(os.path.join(logdir, schema.trace_filename(rank)),
                         schema.header(rank, os.environ.get(env.RUN_ID, "bench"), 0), rank)
    writer.put({"kind": schema.PROCESS_START, "t": time.time(), "rank": rank,
                "world_size": world, "pid": os.getpid(), "backend": "gloo"})
    writer.put({"kind": schema.GROUP, "t": time.time(), "group": "0", "desc": "default_pg",
                "ranks": list(range(world)), "size": world, "group_rank": rank})
    sites = [writer.site("0", op, label, None, (((numel,), "torch.float32"),),
                         "SUM" if op == "all_reduce" else None, 0 if op == "broadcast" else None,
                         None, STACKS[label]) for op, label, numel in STEP]
    done = _Done()
    started.release()  # type: ignore[attr-defined]
    seq = issued = 0
    total = max(1, int(rate * seconds))  # every rank issues as many: no rank diverges
    begin = time.monotonic()
    while (now := time.monotonic()) < begin + seconds or issued < total:
        due = min(total, int((now - begin) * rate) + 1)
        while issued < due:
            seq += 1
            kind = seq % len(sites)
            cid = writer.write_at(sites[kind], seq, None, kind - 2 if kind >= 2 else None,
                                  seq // len(sites), time.time())
            writer.returned(cid, done)
            issued += 1
        time.sleep(TICK)
    writer.close([{"kind": schema.EXIT, "t": time.time(), "status": schema.EXIT_FINISHED,
                   "code": 0, "iteration": seq // len(sites)}])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--steady", required=True, help="a file to create once all run")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("fork")
    started = ctx.Semaphore(0)
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, args.rate, args.seconds, started))
             for r in range(args.ranks)]
    for p in procs:
        p.start()
    for _ in procs:
        started.acquire()
    open(args.steady, "w").close()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
