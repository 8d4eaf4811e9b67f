"""What a collective costs a user's whole job: the small-op loop (``small_ops.py``: one-element
``all_reduce`` on 2 gloo ranks) run as whole jobs, plain torchrun against ``ddpdoctor run``.

    python bench/per_op_whole_job.py [--rounds 8] [--short 5000] [--long 50000] [--aa]
                                     [--before COMMIT] [--hot-paths NAMES] [--target 8]

A job's CPU is every process it started (``getrusage`` of the children: torchrun, the ranks,
ddpdoctor's launcher), what ``time`` shows a user. Each arm runs the loop twice per round,
``--short`` and ``--long`` collectives; the difference of the two jobs' CPU over the
difference of their collectives is that arm's CPU per collective, with start-up, teardown and
the report cancelled out. Per rank: the job's figure over the ranks. The jobs of a round run in
a new order each round (each arm first in turn, short and long first in turn), and each arm's
figure is the median of its per-round differences from plain torchrun's, with their
interquartile range and a 95 % interval of the median (order statistics, no assumed
distribution): an arm meets ``--target`` when that whole interval lies at or under it.
``--aa`` adds a second plain torchrun arm (the bench's own spread, in the same rounds);
``--before`` adds that commit's ddpdoctor (its ``src`` from ``git archive``, first on
``PYTHONPATH``); ``--hot-paths off,floor,lean`` adds ``ddpdoctor run`` with the loop's
recording replaced by each stand-in named (``hot_path_floor.py``): the recording group
switched off (its Python entry and forwarding alone), cut to the least any Python recording
can do, and its per-collective work in one function with its own state: what a leaner
recording could reach (their traces lack the loop's collectives). The trace of a long
ddpdoctor job passes its default 16 MB size cap: from there on it keeps repeats as runs, as a
user's long job does.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # noqa: E402  (bench/ is no package)
from launcher_cost import checkout  # noqa: E402

NPROC = 2
PLAIN = overhead.PLAIN_ARM
DOCTOR_ARM = overhead.DOCTOR_ARM


def per_op_us(short: overhead.JobResult, long: overhead.JobResult, ops: int) -> float:
    """CPU µs per collective per rank from a short and a long job of the same arm."""
    return (long.job_cpu_s - short.job_cpu_s) / ops / NPROC * 1e6


def run_round(arms: list[overhead.Arm], short: int, long: int, flip: int,
              ) -> tuple[dict[str, float], float]:
    """One round: every arm's short and long jobs, in an order set by ``flip`` (the arms
    rotated by it; short or long first, in turn); (µs per collective by arm, the most of the
    machine's other tenants' CPU in a job, in cores)."""
    turn = flip % len(arms)
    order = arms[turn:] + arms[:turn]
    sizes = (short, long) if flip // len(arms) % 2 == 0 else (long, short)
    got = {(name, n): overhead.job(kind, overhead.SMALL_OPS, ["--ops", str(n)], env=env)
           for name, kind, env in order for n in sizes}
    per_arm = {name: per_op_us(got[(name, short)], got[(name, long)], long - short)
               for name, _, _ in arms}
    return per_arm, max(r.others_cores for r in got.values())


def against_doctor(rows: list[dict[str, float]], name: str) -> str:
    """An arm's per-round difference from ddpdoctor run's, as a median and its 95 % interval
    ("—" for ddpdoctor run itself): a stand-in or an older commit against the code of now."""
    if name == DOCTOR_ARM:
        return "—"
    diffs = [row[name] - row[DOCTOR_ARM] for row in rows]
    interval = overhead.median_interval(diffs)
    within = "" if interval is None else f" ({interval[0]:+.1f} to {interval[1]:+.1f})"
    return f"{statistics.median(diffs):+.1f}{within}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--short", type=int, default=5000)
    parser.add_argument("--long", type=int, default=50000)
    parser.add_argument("--aa", action="store_true", help="a second plain torchrun arm")
    parser.add_argument("--before", help="a commit whose ddpdoctor to measure beside")
    parser.add_argument("--hot-paths", type=overhead.hot_paths, default=[],
                        help=overhead.HOT_PATHS_HELP)
    parser.add_argument("--target", type=float, default=8.0,
                        help="µs per collective an arm may add (issue 56: 8)")
    args = parser.parse_args()
    if args.long <= args.short or args.short < 10:
        parser.error("--long must be more than --short (at least 10)")
    before = checkout(args.before) if args.before else None
    arms = overhead.arms(before, args.before, args.aa, args.hot_paths)
    rows: list[dict[str, float]] = []
    others = 0.0
    try:
        for r in range(args.rounds):
            per_arm, busy = run_round(arms, args.short, args.long, r)
            rows.append(per_arm)
            others = max(others, busy)
            print(f"round {r + 1}: " + ", ".join(f"{name} {us:.1f} µs" for name, us in
                                                 per_arm.items()) + f" (others {busy:.2f} cores)",
                  file=sys.stderr, flush=True)
    finally:
        if before is not None:
            shutil.rmtree(before.parent, ignore_errors=True)
    print("\n| arm | CPU per collective per rank, whole job (µs, median) | added: median of "
          f"{len(rows)} per-round differences from plain | 95 % interval of that median | "
          f"IQR | range | against {DOCTOR_ARM}, paired by round (95 % interval) |"
          "\n|---|---|---|---|---|---|---|")
    verdicts = []
    for name, _, _ in arms:
        own = statistics.median(row[name] for row in rows)
        if name == PLAIN:
            print(f"| {name} | {own:.1f} | — | — | — | — | — |")
            continue
        added = [row[name] - row[PLAIN] for row in rows]
        lo, hi = overhead.interquartile(added)
        interval = overhead.median_interval(added)
        within = "—" if interval is None else f"{interval[0]:+.1f} to {interval[1]:+.1f}"
        print(f"| {name} | {own:.1f} | **{statistics.median(added):+.1f}** | {within} | "
              f"{lo:+.1f} to {hi:+.1f} | {min(added):+.1f} to {max(added):+.1f} | "
              f"{against_doctor(rows, name)} |")
        verdicts.append(f"{name}: {overhead.against_target(interval, args.target)}")
    print(f"\nothers' CPU at most {others:.2f} cores in a job")
    print(f"added ≤ {args.target:+.1f} µs (the whole 95 % interval under it): "
          + "; ".join(verdicts))


if __name__ == "__main__":
    main()
