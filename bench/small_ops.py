"""Small-op workload for the bench: a loop of ``all_reduce`` on one float32 on 2 gloo ranks, the
case where a per-collective cost shows most. Each rank prints one line ``BENCH {json}``: the
median µs per op, its process CPU µs per op (every thread: ddpdoctor's included), the calling
thread's CPU µs per op, and the process CPU split by thread (``split_us``: the training thread,
ddpdoctor's threads, the rest: gloo's and torch's).

``--wrapper-ab`` (under ``ddpdoctor run``): blocks of all-reduces through ddpdoctor's recording
group (its ``allreduce``: the record, the trace line, then gloo) alternate with blocks through
a plain process group over the same gloo backend (torch's own path), through the recording
group with recording off, on the backend's binding, and through torch's path after a
pure-Python loop of known single-process cost; the line then also holds the calling
thread's CPU µs per op of each, and the CPU of ddpdoctor's own threads per recorded op
(measured after the alternation, over a loop that records without pause): the cost of
recording measured while both ranks run (on this 2-core machine several times the
single-process microbenchmark's), free of the spread between whole jobs.

``DDPDOCTOR_BENCH_HOT_PATH`` (under ``ddpdoctor run``): ``off`` or ``floor`` switches the
recording group to a stand-in (``hot_path_floor.py``) before the loop, for whole-job arms that
ask what a leaner recording would cost.
"""

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hot_path_floor  # noqa: E402  (bench/ is no package)


def _own_threads_cpu() -> float:
    """CPU seconds of ddpdoctor's threads in this rank (writer, watchdog, peers)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith("ddpdoctor-") and thread.ident is not None:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except OSError:  # the thread ended
                pass
    return total


def wrapper_ab(t: torch.Tensor, ops: int, block: int = 200) -> dict:
    """What recording adds to one all-reduce, in blocks that alternate between paths to the
    same gloo backend: torch's own (a plain ``ProcessGroup`` over it, through the c10d
    dispatcher: what ``dist.all_reduce`` runs without ddpdoctor), ddpdoctor's recording group
    (its ``allreduce``: the record, the trace line, then the backend's binding), the same with
    recording off (the forwarding alone), that binding called directly, and torch's path after
    a pure-Python loop of known single-process cost (what that much CPU work costs in this
    job, see calibrate_spin). The calling thread's CPU µs per op of each (medians over
    blocks), and the CPU of ddpdoctor's own threads over the whole alternation per recorded
    op (their completion work and their wake-ups). Process CPU per block is no measure here:
    gloo's threads spread it by ±100 µs per op from block to block."""
    from ddpdoctor.runtime.pg_wrapper import group_of

    group = dist.distributed_c10d._get_default_group()
    inner = getattr(group, "_inner", None)
    if inner is None:
        return {}
    plain = group_of(inner, group.rank(), group.size())
    opts = dist.AllreduceOptions()
    spins, spin_us = calibrate_spin(plain, group.rank(), group.size())

    def busy(tensors: list, options: object) -> object:
        for _ in range(spins):
            pass
        return plain.allreduce(tensors, options)

    # arm: (the call, recording on); "off" is the recording group forwarding alone; "busy" is
    # torch's path after a pure-Python loop of known cost (calibrate_spin)
    arms = {"plain": (plain.allreduce, True), "wrapped": (group.allreduce, True),
            "off": (group.allreduce, False), "direct": (inner.allreduce, True),
            "busy": (busy, True)}
    thread: dict[str, list[float]] = {arm: [] for arm in arms}
    blocks = ops // block
    own0 = _own_threads_cpu()
    names = list(arms)
    for r in range(blocks):
        # Each arm in each position in turn, both ways round: an arm's block runs faster
        # after some arms than after others (by ~1.5 µs per op in a fixed order).
        order = names[r % len(names):] + names[:r % len(names)]
        if (r // len(names)) % 2:
            order.reverse()
        for arm in order:
            call, group._enabled = arms[arm]
            t0 = time.thread_time()
            for _ in range(block):
                call([t], opts).wait()
            thread[arm].append((time.thread_time() - t0) / block * 1e6)
    group._enabled = True
    time.sleep(0.5)  # the writer's last completion batch
    own = (_own_threads_cpu() - own0) / (blocks * block) * 1e6
    return {**{f"{arm}_cpu_us": statistics.median(v) for arm, v in thread.items()},
            "spin_alone_us": spin_us,
            "threads_alternating_cpu_us": own, "threads_cpu_us": threads_per_op(group, t, ops)}


def calibrate_spin(plain: dist.ProcessGroup, rank: int, size: int, target_us: float = 5.0,
                   block: int = 200) -> tuple[int, float]:
    """(n, µs): an empty loop of n turns costs this thread µs of CPU when nothing else runs
    (each rank measures in turn while the others wait in a barrier), measured as the A/B
    blocks are: the mean over ``block`` loops, the median over blocks. The same loop before a
    collective in those blocks shows what that much CPU work costs in the job."""
    n, spin_us = 0, 0.0
    for turn in range(size):
        plain.barrier().wait()
        if turn == rank:
            per_thousand = statistics.median(_spin_us(1000, block) for _ in range(5))
            n = max(1, round(target_us * 1000 / per_thousand))
            spin_us = statistics.median(_spin_us(n, block) for _ in range(25))
    plain.barrier().wait()
    return n, spin_us


def _spin_us(n: int, block: int) -> float:
    """Thread CPU µs of one empty loop of ``n`` turns: the mean over ``block`` of them."""
    t0 = time.thread_time()
    for _ in range(block):
        for _ in range(n):
            pass
    return (time.thread_time() - t0) / block * 1e6


def threads_per_op(group: dist.ProcessGroup, t: torch.Tensor, ops: int) -> float:
    """CPU µs of ddpdoctor's threads per collective of a loop that records without pause: the
    threads' CPU from the loop's start until the writer has written its last completions,
    less what the same threads spend in an idle period as long as that wait (their
    wake-ups). In the alternation above the threads also wake during the three arms that
    record nothing, which would be charged to the recorded operations."""
    opts = dist.AllreduceOptions()
    settle = 0.45  # over two completion intervals of the writer
    time.sleep(settle)
    idle0 = _own_threads_cpu()
    time.sleep(settle)
    start = _own_threads_cpu()
    idle = start - idle0
    for _ in range(ops):
        group.allreduce([t], opts).wait()
    time.sleep(settle)
    return (_own_threads_cpu() - start - idle) / ops * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--wrapper-ab", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    variant = os.environ.get(hot_path_floor.VARIANT_ENV)
    if variant:
        hot_path_floor.use(variant)
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    chunks, thread = [], []
    cpu0, main0, own0 = time.process_time(), time.thread_time(), _own_threads_cpu()
    for _ in range(10):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(args.ops // 10):
            dist.all_reduce(t)
        thread.append((time.thread_time() - c0) / (args.ops // 10))
        chunks.append((time.perf_counter() - t0) / (args.ops // 10))
    cpu, main = time.process_time() - cpu0, time.thread_time() - main0
    own = _own_threads_cpu() - own0
    n = args.ops // 10 * 10
    result = {"rank": dist.get_rank(), "op_us": statistics.median(chunks) * 1e6,
              "cpu_us": cpu / n * 1e6, "thread_us": statistics.median(thread) * 1e6,
              # The loop's process CPU by thread: the training thread, ddpdoctor's threads,
              # and the rest (gloo's threads, torch's).
              "split_us": {"main": main / n * 1e6, "ddpdoctor": own / n * 1e6,
                           "gloo": (cpu - main - own) / n * 1e6}}
    if args.wrapper_ab:
        result.update(wrapper_ab(t, args.ops))
    print("BENCH " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
