"""Small-op workload for the bench: a loop of ``all_reduce`` on one float32 on 2 gloo ranks, the
case where a per-collective cost shows most. Each rank prints one line ``BENCH {json}``: the
median µs per op and its process CPU µs per op (every thread: ddpdoctor's writer included).

``--wrapper-ab`` (under ``ddpdoctor run``): blocks of all-reduces through ddpdoctor's recording
group (its ``allreduce``: the record, the trace line, then gloo) alternate with blocks on the
gloo backend it wraps, called the same way; the line then also holds the calling thread's CPU
µs per op of each: the cost of recording on the caller's thread, measured while both ranks
run (on this 2-core machine that is several times the single-process microbenchmark's).
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def wrapper_ab(t: torch.Tensor, ops: int, block: int = 100) -> dict:
    """Caller-thread CPU µs per all-reduce through the recording group and on the backend it
    wraps, in alternating blocks (medians over blocks)."""
    group = dist.distributed_c10d._get_default_group()
    inner = getattr(group, "_inner", None)
    if inner is None:
        return {}
    opts = dist.AllreduceOptions()
    via, direct = [], []
    for b in range(2 * (ops // block)):
        wrapped = b % 2 == 0
        t0 = time.thread_time()
        for _ in range(block):
            (group if wrapped else inner).allreduce([t], opts).wait()
        (via if wrapped else direct).append((time.thread_time() - t0) / block * 1e6)
    return {"wrapped_cpu_us": statistics.median(via), "direct_cpu_us": statistics.median(direct)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--wrapper-ab", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    chunks = []
    cpu0 = time.process_time()
    for _ in range(10):
        t0 = time.perf_counter()
        for _ in range(args.ops // 10):
            dist.all_reduce(t)
        chunks.append((time.perf_counter() - t0) / (args.ops // 10))
    cpu = time.process_time() - cpu0
    result = {"rank": dist.get_rank(), "op_us": statistics.median(chunks) * 1e6,
              "cpu_us": cpu / (args.ops // 10 * 10) * 1e6}
    if args.wrapper_ab:
        result.update(wrapper_ab(t, args.ops))
    print("BENCH " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
