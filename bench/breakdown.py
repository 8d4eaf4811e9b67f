"""Where the recording's cost goes on the calling thread of a real 2-rank gloo job.

Run it under ddpdoctor (it needs the recording process group)::

    ddpdoctor run --nproc-per-node 2 bench/breakdown.py

Blocks of 200 ``all_reduce`` of one float32 alternate between variants, each with one more
part of the recording switched on, 15 rounds (each round starts one variant later: a block
runs faster after some variants than after others); each rank prints one ``BREAKDOWN
{json}`` line: the median caller-thread CPU µs per op of each variant. The difference between
two neighbours is what that part costs *in the job*: on this 2-core VM every part costs 3-5
times its single-process price (``bench/run.py`` item a), because both ranks' threads share
the cores and the main thread comes back from each ``wait()`` to cold caches. The job's own
diagnosis is INCOMPLETE by design: the variants number collectives whose lines they do not
write.

The ``floor`` variant is no part of ddpdoctor: the least any recording in Python can do on
the calling thread (the group's Python method entered, a number, the caller's code and
instruction as a key, one append to a list), then the backend; what a design that looks up
sites and keeps fields elsewhere, or never, could at best cost in this job. (Since session 39
the calling thread formats no line: it stores the fields into the issue ring, which the
``full`` variant includes.)
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ddpdoctor.runtime import writer as writer_module
from ddpdoctor.runtime.pg_wrapper import group_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hot_path_floor import floor_issue  # noqa: E402  (bench/ is no package)

# (variant, what it adds to the one before)
VARIANTS = [
    ("plain", "torch's own path: a ProcessGroup dispatching to gloo"),
    ("direct", "gloo's binding called directly"),
    ("wrapper", "the recording group forwarding, recording off"),
    ("floor", "the least a Python recording can do: number, caller key, one append"),
    ("record", "numbering, shapes, caller frame, the site's key and lookup, the issue time"),
    ("describe", "the call path walked (the labels and call stack read off the frames)"),
    ("unreleased", "the fields stored into the issue ring, the Work kept for the look"),
    ("full", "the previous Work released where it completed: everything ddpdoctor does"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    dist.init_process_group("gloo")
    group = dist.distributed_c10d._get_default_group()
    inner, recorder = getattr(group, "_inner", None), getattr(group, "_recorder", None)
    if inner is None or recorder is None or recorder.writer is None:
        raise SystemExit("run this under ddpdoctor run: the recording group is not in place")
    group.allreduce([torch.ones(1)], dist.AllreduceOptions()).wait()  # the writer's path held
    release = writer_module._is_success_quiet  # write_at releases completed Works
    # What the variants switch off, where the recording group holds them; each must exist,
    # or the figures would silently be wrong (getattr raises for a renamed one).
    issuer = group._issuer
    targets = {"collective": (issuer, "write_at"), "describe": (issuer, "place_id")}
    originals = {name: getattr(obj, attr) for name, (obj, attr) in targets.items()}
    assert hasattr(group, "_enabled")
    stubs = {"collective": lambda *args: None, "describe": lambda frame: 0}
    off = {"plain": set(), "direct": set(), "wrapper": set(), "floor": set(),
           "record": {"collective", "describe"},
           "describe": {"collective"}, "unreleased": set(), "full": set()}

    issue, floor = group._issue, floor_issue(group)

    def use(variant: str) -> None:
        group._enabled = variant != "wrapper"  # plain and direct do not pass the group
        group._issue = floor if variant == "floor" else issue
        for name, (obj, attr) in targets.items():
            setattr(obj, attr, stubs[name] if name in off[variant] else originals[name])
        writer_module.use_is_success(release and variant != "unreleased")

    t, opts = torch.ones(1), dist.AllreduceOptions()

    def block(call, n: int = 200) -> float:
        t0 = time.thread_time()
        for _ in range(n):
            call([t], opts).wait()
        return (time.thread_time() - t0) / n * 1e6

    calls = {"plain": group_of(inner, group.rank(), group.size()).allreduce,
             "direct": inner.allreduce}
    for _ in range(300):
        group.allreduce([t], opts).wait()
    samples: dict[str, list[float]] = {v: [] for v, _ in VARIANTS}
    names = [v for v, _ in VARIANTS]
    for r in range(rounds):
        for variant in names[r % len(names):] + names[:r % len(names)]:
            use(variant)
            samples[variant].append(block(calls.get(variant, group.allreduce)))
    use("full")
    time.sleep(0.3 * dist.get_rank())  # the ranks' lines one after the other
    print("BREAKDOWN " + json.dumps({"rank": dist.get_rank(), **{
        v: round(statistics.median(s), 1) for v, s in samples.items()}}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
