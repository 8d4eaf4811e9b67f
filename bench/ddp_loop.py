"""Benchmark workload, run by ``bench/overhead.py`` under plain torchrun and under ddpdoctor.

``--mode ddp``: a DDP training loop with several gradient buckets and BatchNorm buffers whose
steps take >= 5 ms; ``--mode allreduce``: a loop of small all-reduces. Rank 0 prints one line
``BENCH {json}`` with the median step time (or time per op). With ``--ab N`` under
``ddpdoctor run``, recording is switched off and on every N steps (ops) inside the one job and
the line holds the median ratio of neighbouring on/off blocks instead: the cost of recording,
measured where drift of a shared machine hits both sides alike.
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def _recording_group() -> object | None:
    """ddpdoctor's recording process group of the default group (None under plain torchrun)."""
    group = dist.distributed_c10d._get_default_group()
    return group if hasattr(group, "_enabled") else None


def _ab(blocks: list[tuple[bool, float]]) -> dict:
    """Every recording-on block against each recording-off block next to it (before and
    after, so that a trend favours neither): the median of these ratios. Neighbours are a
    fraction of a second apart, so drift of a shared machine hits both alike."""
    ratios = [(a[1] / b[1]) if a[0] else (b[1] / a[1])
              for a, b in zip(blocks, blocks[1:]) if a[0] != b[0]]
    on = [v for flag, v in blocks if flag]
    off = [v for flag, v in blocks if not flag]
    return {"ab_ratio": statistics.median(ratios), "ab_ratios": ratios,
            "ab_on": statistics.median(on), "ab_off": statistics.median(off)}


def ddp_loop(steps: int, ab: int = 0) -> dict:
    """A DDP training loop; ``ab`` > 0: recording alternates on/off every ``ab`` steps."""
    torch.manual_seed(0)
    # Four hidden layers of 1 MB each and a 0.5 MB bucket cap: after the rebuild on
    # iteration 2, every step all-reduces 4 gradient buckets and broadcasts the BN buffers.
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.BatchNorm1d(512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16))
    ddp = DDP(model, bucket_cap_mb=0.5)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def step() -> float:
        t0 = time.perf_counter()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0

    for _ in range(5):  # warm-up: the first iterations build and rebuild the buckets
        step()
    pg = _recording_group() if ab else None
    if pg is None:
        times = [step() for _ in range(steps)]
        return {"step_ms": statistics.median(times) * 1e3}
    blocks = []
    for b in range(max(2, steps // ab)):
        pg._enabled = b % 2 == 0
        blocks.append((pg._enabled, statistics.median(step() for _ in range(ab)) * 1e3))
    pg._enabled = True
    return _ab(blocks)


def allreduce_loop(ops: int, ab: int = 0) -> dict:
    """Small all-reduces; ``ab`` > 0: recording alternates on/off every ``ab`` ops."""
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    pg = _recording_group() if ab else None
    if pg is None:
        chunks = []
        for _ in range(10):
            t0 = time.perf_counter()
            for _ in range(ops // 10):
                dist.all_reduce(t)
            chunks.append((time.perf_counter() - t0) / (ops // 10))
        return {"op_us": statistics.median(chunks) * 1e6}
    blocks = []
    for b in range(max(2, ops // ab)):
        pg._enabled = b % 2 == 0
        t0 = time.perf_counter()
        for _ in range(ab):
            dist.all_reduce(t)
        blocks.append((pg._enabled, (time.perf_counter() - t0) / ab * 1e6))
    pg._enabled = True
    return _ab(blocks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "allreduce"], default="ddp")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ab", type=int, default=0,
                        help="under ddpdoctor: switch recording on and off every N steps/ops")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    result = (ddp_loop if args.mode == "ddp" else allreduce_loop)(args.steps, args.ab)
    if dist.get_rank() == 0:
        print("BENCH " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
