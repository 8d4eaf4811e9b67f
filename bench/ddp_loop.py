"""Benchmark workload, run by ``bench/overhead.py`` under plain torchrun and under ddpdoctor.

``--mode ddp``: a DDP training loop with several gradient buckets and BatchNorm buffers whose
steps take >= 5 ms; ``--mode allreduce``: a loop of small all-reduces. Rank 0 prints one line
``BENCH {json}``: the median step (or per-op) wall time and the mean CPU time of the rank's
process (all its threads) per step (or op).
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_loop(steps: int) -> dict:
    torch.manual_seed(0)
    # Four hidden layers of 1 MB each and a 0.5 MB bucket cap: after the rebuild on
    # iteration 2, every step all-reduces 5 gradient buckets and broadcasts the BN buffers.
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16))
    ddp = DDP(model, bucket_cap_mb=0.5)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    times, cpu = [], []
    for step in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    # warm-up: first iterations build and rebuild buckets. CPU: every thread of this process
    # (gloo's, ddpdoctor's writer), much less sensitive to other load than wall time.
    times, cpu = times[5:], cpu[5:]
    return {"step_ms": statistics.median(times) * 1e3,
            "cpu_ms": statistics.mean(cpu) * 1e3}


def allreduce_loop(ops: int) -> dict:
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    chunks, cpu = [], []
    for _ in range(10):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(ops // 10):
            dist.all_reduce(t)
        chunks.append((time.perf_counter() - t0) / (ops // 10))
        cpu.append((time.process_time() - c0) / (ops // 10))
    return {"op_us": statistics.median(chunks) * 1e6, "cpu_us": statistics.mean(cpu) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "allreduce"], default="ddp")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    result = ddp_loop(args.steps) if args.mode == "ddp" else allreduce_loop(args.steps)
    if dist.get_rank() == 0:
        print("BENCH " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
