"""What a collective costs a user's whole job: the small-op loop (``small_ops.py``: one-element
``all_reduce`` on 2 gloo ranks) run as whole jobs, plain torchrun against ``ddpdoctor run``.

    python bench/per_op_whole_job.py [--rounds 8] [--short 5000] [--long 50000] [--aa]

A job's CPU is every process it started (``getrusage`` of the children: torchrun, the ranks,
ddpdoctor's launcher), what ``time`` shows a user. Each arm runs the loop twice per round,
``--short`` and ``--long`` collectives; the difference of the two jobs' CPU over the
difference of their collectives is that arm's CPU per collective, with start-up, teardown and
the report cancelled out. Per rank: the job's figure over the ranks. The jobs of a round run in
a new order each round (both arms first in turn, short and long alike), and the figure is the
median of the per-round differences, ddpdoctor less plain, with their interquartile range.
``--aa`` runs plain torchrun in both arms: the bench's own spread, same units. The trace of a
long ddpdoctor job passes its default 16 MB size cap: from there on it keeps repeats as runs,
as a user's long job does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import overhead  # noqa: E402  (bench/ is no package)

NPROC = 2


def per_op_us(short: overhead.JobResult, long: overhead.JobResult, ops: int) -> float:
    """CPU µs per collective per rank from a short and a long job of the same arm."""
    return (long.job_cpu_s - short.job_cpu_s) / ops / NPROC * 1e6


def run_round(arms: tuple[str, str], short: int, long: int, flip: int,
              ) -> tuple[float, float, float]:
    """One round: both arms' short and long jobs, in an order set by ``flip``; (arm A's µs per
    collective, arm B's, the most of the machine's other tenants' CPU in a job, in cores)."""
    jobs = [(i, n) for i in (0, 1) for n in (short, long)]
    if flip % 2:
        jobs = jobs[2:] + jobs[:2]
    if flip // 2 % 2:
        jobs = [jobs[1], jobs[0], jobs[3], jobs[2]]
    got = {(i, n): overhead.job(arms[i], overhead.SMALL_OPS, ["--ops", str(n)])
           for i, n in jobs}
    a, b = (per_op_us(got[(i, short)], got[(i, long)], long - short) for i in (0, 1))
    return a, b, max(r.others_cores for r in got.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--short", type=int, default=5000)
    parser.add_argument("--long", type=int, default=50000)
    parser.add_argument("--aa", action="store_true", help="plain torchrun in both arms")
    args = parser.parse_args()
    if args.long <= args.short or args.short < 10:
        parser.error("--long must be more than --short (at least 10)")
    arms = (overhead.PLAIN, overhead.PLAIN if args.aa else overhead.DOCTOR)
    rows = []
    for r in range(args.rounds):
        a, b, others = run_round(arms, args.short, args.long, r)
        rows.append((a, b, others))
        print(f"round {r + 1}: {arms[0]} {a:.1f} µs, {arms[1]} {b:.1f} µs, added {b - a:+.1f}"
              f" (others {others:.2f} cores)", file=sys.stderr, flush=True)
    added = [b - a for a, b, _ in rows]
    lo, hi = overhead.interquartile(added)
    name = "plain torchrun (A/A)" if args.aa else "ddpdoctor run"
    print(f"\n| arm | CPU per collective per rank, whole job (µs) |\n|---|---|\n"
          f"| plain torchrun | {statistics.median(a for a, _, _ in rows):.1f} |\n"
          f"| {name} | {statistics.median(b for _, b, _ in rows):.1f} |\n"
          f"| added (median of {len(rows)} per-round differences) | "
          f"**{statistics.median(added):+.1f}** (IQR {lo:+.1f} to {hi:+.1f}; range "
          f"{min(added):+.1f} to {max(added):+.1f}) |\n"
          f"\nothers' CPU at most {max(o for _, _, o in rows):.2f} cores in a job")


if __name__ == "__main__":
    main()
