"""What each part of the recording costs the calling thread in one process, with nothing else
running: the single-process prices behind ``breakdown.py``'s in-job figures.

    ddpdoctor run --nproc-per-node 1 bench/parts_alone.py [--ops 20000] [--loops 21]

One rank; the gloo backend's ``allreduce`` is replaced by a function that returns a completed
``Work`` at once, so only ddpdoctor's Python is timed. Parts are switched off from the inside
out; each figure is the median over ``--loops`` loops of ``--ops`` all-reduces of the calling
thread's CPU µs per call, less the stub's own. Prints one line ``PARTS {json}``: the group's
Python method with recording off (``entry``), the numbering, shapes, caller frame, site key,
lookup and issue time (``site``; before session 42 ``issue`` and ``site`` apart, when the
recording group called the recorder for the site), the call-stack walk (``walk``)
and the line written into the trace (``line``). A long run passes the trace's 16 MB cap: from
there on its lines fold into runs, as a long job's do; the job's diagnosis is incomplete by
design (collectives numbered without lines).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ddpdoctor.runtime import torch_internals


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--loops", type=int, default=21)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    group = dist.distributed_c10d._get_default_group()
    recorder = getattr(group, "_recorder", None)
    if recorder is None or recorder.writer is None:
        raise SystemExit("run this under ddpdoctor run: the recording group is not in place")
    t, opts = torch.ones(1), dist.AllreduceOptions()
    group.allreduce([t], opts).wait()
    future = torch.futures.Future()
    future.set_result(None)
    done = torch_internals.work_from_future()(future)
    group._issuer.calls["allreduce"] = lambda *a: done

    def per_call(call: Callable[..., object]) -> float:
        def loop() -> float:
            t0 = time.thread_time()
            for _ in range(args.ops):
                call([t], opts)
            return (time.thread_time() - t0) / args.ops * 1e6
        return statistics.median(loop() for _ in range(args.loops))

    stub = per_call(lambda tensors, options: done)
    cost: dict[str, float] = {}
    group._enabled = False
    cost["off"] = per_call(group.allreduce)
    group._enabled = True
    issuer = group._issuer  # holds the writer's write_at and the labeler's place_id
    write_at, place_id = issuer.write_at, issuer.place_id
    issuer.write_at = lambda *a: 1
    key = place_id(sys._getframe())
    issuer.place_id = lambda frame: key
    cost["site"] = per_call(group.allreduce)
    issuer.place_id = place_id
    cost["walk"] = per_call(group.allreduce)
    issuer.write_at = write_at
    cost["line"] = per_call(group.allreduce)
    order = ["off", "site", "walk", "line"]
    parts = {"entry": cost["off"] - stub}
    parts.update({name: cost[name] - cost[before] for before, name in zip(order, order[1:])})
    parts["total"] = cost["line"] - stub
    print("PARTS " + json.dumps({k: round(v, 2) for k, v in parts.items()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
