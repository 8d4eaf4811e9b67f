"""The launcher's own CPU while it watches a job, against the job's rate of collectives.

``python bench/launcher_cost.py [--ranks 2 8] [--rates 0 100 1000 5000] [--seconds 20]
[--window 12] [--before COMMIT]`` runs ``ddpdoctor run --launcher python`` on
``fake_ranks.py``: N processes without torch that write real traces through the rank's own
trace writer at a set rate of collectives each (DDP's pattern: two buffer-broadcast chunks and
two gradient buckets a step, completed at once). Once every rank issues collectives the
launcher's CPU time (all its threads, ``/proc/<pid>/task/*/schedstat``) is read, and again
``--window`` seconds later: its CPU per minute of the job while it watches, the figure
issue 56 holds to 0.5 CPU-s at 8 ranks x 1,000 collectives a second, flat in the rate. Each
row also runs at rate 0 (the ranks idle) in the same invocation, the baseline of the ratio;
with ``--before`` the same runs of that commit's code (its launcher and its ranks, from
``git archive``) are measured beside them. The achieved rate is read back from the traces
(the last ``done`` record's ``upto``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
_UPTO = re.compile(rb'"upto": (\d+)')


def cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid``, every thread of it (not its children), to the nanosecond
    (the scheduler's run time of each thread: ``/proc/<pid>/stat`` counts 10 ms ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended in between
    return total / 1e9


def issued(logdir: Path) -> int:
    """Collectives the ranks issued, from each trace's last ``done`` record."""
    total = 0
    for path in logdir.glob("rank-*.jsonl"):
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - 65536))
            found = _UPTO.findall(fh.read())
        total += int(found[-1]) if found else 0
    return total


def one(src: Path, ranks: int, rate: float, seconds: float, window: float) -> dict:
    """One job: the launcher's CPU seconds over the window, per job-minute, and the rate."""
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-launcher-"))
    try:
        steady = work / "steady"
        cmd = [sys.executable, "-m", "ddpdoctor", "run", "--launcher", "python", "--logdir",
               str(work / "logs"), "--hang-timeout", "120", str(HERE / "fake_ranks.py"),
               "--ranks", str(ranks), "--rate", str(rate), "--seconds", str(seconds),
               "--steady", str(steady)]
        environ = {**os.environ, "PYTHONPATH": str(src), "TMPDIR": str(work)}
        proc = subprocess.Popen(cmd, env=environ, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not steady.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # the writers' first completions
        first, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window)
        last, t1 = cpu_seconds(proc.pid), time.monotonic()
        _out, err = proc.communicate(timeout=seconds + 300)
        if proc.returncode != 0:
            raise SystemExit(f"ddpdoctor run exited {proc.returncode}:\n{err[-2000:]}")
        return {"per_minute": (last - first) / (t1 - t0) * 60.0,
                "rate": issued(work / "logs") / seconds / ranks}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def checkout(commit: str) -> Path:
    """``src/`` of ``commit``, extracted into a temporary folder."""
    dest = Path(tempfile.mkdtemp(prefix="ddpdoctor-before-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "src"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1000, 5000],
                        help="collectives a second per rank (rate 0 always runs first)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--window", type=float, default=12.0)
    parser.add_argument("--before", help="a commit whose launcher to measure beside")
    args = parser.parse_args()
    versions = [("this", ROOT / "src")]
    if args.before:
        versions.append((args.before[:8], checkout(args.before)))
    rates = [0.0] + [r for r in args.rates if r > 0]
    print(f"launcher CPU-s per job-minute while it watches ({args.window:g} s window of a "
          f"{args.seconds:g} s job); ratio: against rate 0 of the same code, same run\n")
    head = "| ranks | collectives/s per rank (achieved) |"
    for name, _ in versions:
        head += f" {name}: CPU-s/min | ratio |"
    print(head)
    print("|" + "---|" * (2 + 2 * len(versions)))
    for ranks in args.ranks:
        base: dict[str, float] = {}
        for rate in rates:
            cells, achieved = [], 0.0
            for name, src in versions:
                got = one(src, ranks, rate, args.seconds, args.window)
                base.setdefault(name, got["per_minute"])
                achieved = got["rate"]
                ratio = got["per_minute"] / base[name] if base[name] > 0 else float("nan")
                cells.append(f" {got['per_minute']:.2f} | ×{ratio:.2f} |")
            print(f"| {ranks} | {rate:g} ({achieved:.0f}) |" + "".join(cells), flush=True)
    for _name, src in versions[1:]:
        shutil.rmtree(src.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
