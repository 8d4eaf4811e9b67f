"""What each of ddpdoctor's Python entries costs a DDP step, with the caches as training leaves
them (bench/RESULTS.md, session 29).

    ddpdoctor run --nproc-per-node 2 bench/entry_costs.py [--steps 600] [--bucket-cap-mb 25]
        [--head-channels 480 --bucket-cap-mb default --batch 20]   # the headline's job

The realistic job's CNN (``cnn_job.py``) trains with recording switched on and off in turn
(on, off, off, on, ...). Each of ddpdoctor's per-step entries from the training loop is timed
on the training thread (``time.thread_time`` around it; the timer costs ~0.5 µs warm): the end
of DDP's forward (``ddp_buckets.after_forward``) and the arming in it, the hook that writes a
backward's bucket lines, the two callbacks at the backward's end, DDP's buffer broadcast as
DDP calls it and gloo's broadcast inside it (the difference is ddpdoctor's), and each call
into the backend's sequence number. Each rank prints one line ``ENTRIES {json}``: per entry
and kind, the mean µs per call, the median and the calls per step; rank 0 also prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import cnn_job  # noqa: E402  (bench/ is not a package)

_now = time.thread_time
_times: dict[tuple[str, str], list[float]] = {}
_kind = ["on"]


def _timed(name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = _now()
        try:
            return call(*args, **kwargs)
        finally:
            _times.setdefault((name, _kind[0]), []).append(_now() - t0)

    return timed


def _time_entries() -> None:
    """Wrap the entries (under ddpdoctor run: its runtime is imported in every rank), before
    the process group is made: ddpdoctor's own broadcast patch, made with the group, then
    calls the timed torch function (:func:`_time_ddps_broadcast` times the patch)."""
    try:
        from ddpdoctor.runtime import ddp_buckets
    except ImportError:
        raise SystemExit("run it under ddpdoctor run: its runtime is not in this process") \
            from None
    plan = ddp_buckets._Plan
    for owner, name, label in ((dist, "_broadcast_coalesced", "· gloo's broadcast in it"),
                               (ddp_buckets, "after_forward", "end of DDP's forward"),
                               (plan, "arm", "· arming"),
                               (plan, "backward_starts", "bucket lines"),
                               (plan, "_graph_done", "callback 1"),
                               (plan, "_after_ddp", "callback 2")):
        setattr(owner, name, _timed(label, getattr(owner, name)))
    made = plan.__init__

    def init(self: Any, issuer: Any, layout: tuple, nodes: tuple,
             counter: Callable[[], int]) -> None:
        made(self, issuer, layout, nodes, _timed("· backend's sequence number", counter))

    plan.__init__ = init  # type: ignore[method-assign]


def _time_ddps_broadcast() -> None:
    """Time the buffer broadcast as DDP calls it (ddpdoctor's patch, once the group is made)."""
    dist._broadcast_coalesced = _timed(  # type: ignore[attr-defined]
        "buffer broadcast (DDP's call)", dist._broadcast_coalesced)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--bucket-cap-mb", type=cnn_job.bucket_cap, default=25.0,
                        help="as cnn_job.py's ('default': none given)")
    parser.add_argument("--head-channels", type=int, default=192)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    _time_entries()
    dist.init_process_group("gloo")
    _time_ddps_broadcast()
    torch.manual_seed(0)
    model = DDP(cnn_job.cnn(args.head_channels), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    group = dist.distributed_c10d._get_default_group()
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.randn(args.batch, 3, 16, 16), torch.randint(0, 10, (args.batch,))

    def step(on: bool) -> None:
        _kind[0] = "on" if on else "off"
        group._enabled = on  # type: ignore[attr-defined]  # the recording group's switch
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(20):  # DDP builds and rebuilds its buckets; the plan starts
        step(i % 2 == 0)
    _times.clear()
    dist.barrier()
    for i in range(args.steps):
        step((i + i // 2) % 2 == 0)
    group._enabled = True  # type: ignore[attr-defined]
    per_kind = args.steps // 2
    out = {f"{name} [{kind}]": {"mean_us": statistics.mean(v) * 1e6,
                                "median_us": statistics.median(v) * 1e6,
                                "per_step": len(v) / per_kind}
           for (name, kind), v in sorted(_times.items())}
    print("ENTRIES " + json.dumps({"rank": dist.get_rank(), "steps": args.steps, **out}),
          flush=True)
    if dist.get_rank() == 0:
        print("\n| entry [recording] | mean µs | median µs | calls a step |\n|---|---|---|---|")
        for name, row in out.items():
            print(f"| {name} | {row['mean_us']:.1f} | {row['median_us']:.1f} | "
                  f"{row['per_step']:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
