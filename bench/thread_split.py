"""Where a collective's process CPU goes, thread by thread: the small-op loop (``small_ops.py``:
one-element ``all_reduce`` on 2 gloo ranks, 20,000 per job) under plain torchrun and under
``ddpdoctor run``, in alternating jobs.

    python bench/thread_split.py [--rounds 6] [--ops 20000] [--before COMMIT] [--aa]
                                  [--hot-paths NAMES]

Each rank measures its loop's process CPU and splits it: the training thread, ddpdoctor's own
threads (by name), and the rest (gloo's threads, torch's). The table gives, per arm, the
medians over ranks × jobs of each, in µs per collective, with their interquartile range, and
each arm less plain; then, paired by round (the arms' jobs of a round run back to back, in an
order that turns each round), the median over rounds of each arm's mean over its ranks less
plain's, for the process and the training thread, with their range. ``--before`` adds that
commit's ddpdoctor (its ``src`` from ``git archive``, first on ``PYTHONPATH``) as an arm;
``--aa`` a second plain arm (the bench's own spread, same units); ``--hot-paths``
ddpdoctor with its recording replaced by each stand-in named (``hot_path_floor.py``: off,
floor, lean). Figures from one run only are comparable: this 2-core VM's speed
drifts.
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

PARTS = ("process", "main", "ddpdoctor", "gloo")


def figures(result: overhead.JobResult) -> list[dict[str, float]]:
    """Each rank's µs per collective by part."""
    return [{"process": r["cpu_us"], **r["split_us"]} for r in result.ranks]


def describe(values: list[float]) -> str:
    low, high = overhead.interquartile(values)
    return f"{statistics.median(values):.1f} ({low:.1f}–{high:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--before", help="a commit whose ddpdoctor to measure beside")
    parser.add_argument("--aa", action="store_true", help="a second plain arm")
    parser.add_argument("--hot-paths", type=overhead.hot_paths, default=[],
                        help=overhead.HOT_PATHS_HELP)
    args = parser.parse_args()
    before = checkout(args.before) if args.before else None
    arms = overhead.arms(before, args.before, args.aa, args.hot_paths)
    got: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in arms}
    rounds: list[dict[str, list[dict[str, float]]]] = []
    try:
        for n in range(args.rounds):
            print(f"round {n + 1} of {args.rounds}", file=sys.stderr, flush=True)
            rounds.append({})
            for name, kind, env in arms[n % len(arms):] + arms[:n % len(arms)]:
                rows = figures(overhead.job(kind, overhead.SMALL_OPS, ["--ops", str(args.ops)],
                                            env=env))
                got[name] += rows
                rounds[-1][name] = rows
    finally:
        if before is not None:
            shutil.rmtree(before.parent, ignore_errors=True)
    plain = got[overhead.PLAIN_ARM]
    print(f"µs of CPU per collective, median (IQR) over {len(plain)} ranks × jobs; "
          f"{args.ops} all_reduce per job")
    print("| arm | " + " | ".join(PARTS) + " | process − plain |")
    print("|---" * (len(PARTS) + 2) + "|")
    base = statistics.median(r["process"] for r in plain)
    for name, rows in got.items():
        cells = [describe([r[p] for r in rows]) for p in PARTS]
        added = statistics.median(r["process"] for r in rows) - base
        print(f"| {name} | " + " | ".join(cells) + f" | {added:+.1f} |")
    print("\npaired by round: median over rounds of the arm's mean over its ranks less plain's "
          "(range)")
    print("| arm | process − plain | main − plain |\n|---|---|---|")
    for name in list(got)[1:]:
        cells = []
        for part in ("process", "main"):
            diffs = [statistics.mean(r[part] for r in one[name]) -
                     statistics.mean(r[part] for r in one[overhead.PLAIN_ARM]) for one in rounds]
            cells.append(f"{statistics.median(diffs):+.1f} ({min(diffs):+.1f} to "
                         f"{max(diffs):+.1f})")
        print(f"| {name}, paired | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
