"""How long ``ddpdoctor attach`` takes, and what the ranks feel of it.

A job of N gloo ranks under plain torchrun (each rank all-reduces a small tensor, then loops
on 1 ms sleeps, noting every gap in its main thread over 5 ms in a file), is read by
``ddpdoctor attach`` as a user runs it (the whole command, start to report). The pause is each
rank's longest gap while attach ran, against the longest gap in the 5 s before anything
read the job (measured in the same job: on 2 cores, 8 ranks may already see gaps). The time
is the whole command against the same reads by hand, as users do today: ``py-spy dump`` of
each rank in turn, three rounds a second apart (the baseline, timed in the same job just
before), so the ratio is what ddpdoctor adds: its start, the analysis, the report.

    python bench/attach.py [--ranks 2 8] [--repeats 3]

Targets (issue 52): report in <= 5 s for 8 ranks on this machine; pause <= 50 ms per rank
(0 added in non-blocking mode, which is attach's own for every rank outside a backward).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

JOB = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.all_reduce(torch.ones(4))
    out = open(os.path.join(sys.argv[1], f"gaps-{rank}.txt"), "w", buffering=1)
    last = time.monotonic()
    end = last + float(sys.argv[2])
    while last < end:
        time.sleep(0.001)
        now = time.monotonic()
        if now - last > 0.005:
            out.write(f"{now:.4f} {now - last:.4f}\\n")
        last = now
""")


QUIET = 5.0  # seconds of the job without attach or py-spy: the gaps it has anyway


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _gaps(folder: Path, rank: int, start: float, end: float) -> float:
    """The longest gap of ``rank`` whose end falls in [start, end] (0 when none over 5 ms)."""
    worst = 0.0
    path = folder / f"gaps-{rank}.txt"
    for line in path.read_text().splitlines() if path.exists() else []:
        t, gap = map(float, line.split())
        if start <= t <= end + gap:
            worst = max(worst, gap)
    return worst


def _ranks_of(root: int) -> list[int]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from ddpdoctor.launch.proctree import descendants

    return descendants(root)


def one(ranks: int, options: list[str]) -> dict:
    """One job: attach once; the attach window's gaps and an equal window before it."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "job.py"
        script.write_text(JOB)
        job = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
             "--master-port", str(_free_port()), str(script), str(folder), "40"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            deadline = time.monotonic() + 60
            while len(list(folder.glob("gaps-*.txt"))) < ranks and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(QUIET + 1.0)
            pids = sorted(set(_ranks_of(job.pid)))
            quiet_end = time.monotonic()
            # The baseline: what users do today by hand, the same reads attach makes (py-spy
            # dump of each rank in turn, three rounds a second apart), without any analysis.
            manual = time.monotonic()
            for round_ in range(3):
                if round_:
                    time.sleep(1.0)
                for pid in pids:
                    subprocess.run(["py-spy", "dump", "--nonblocking", "--pid", str(pid)],
                                   capture_output=True, timeout=60)
            manual = time.monotonic() - manual
            time.sleep(0.5)
            start = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "attach", "--logdir",
                                   str(folder / "attach"), *options],
                                  capture_output=True, text=True, timeout=120)
            end = time.monotonic()
            time.sleep(0.2)
            span = end - start
            during = [_gaps(folder, r, start, end) for r in range(ranks)]
            before = [_gaps(folder, r, quiet_end - QUIET, quiet_end) for r in range(ranks)]
            return {"seconds": span, "rc": proc.returncode, "during": max(during),
                    "before": max(before), "manual": manual}
        finally:
            for pid in [job.pid, *_ranks_of(job.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            job.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for ranks in args.ranks:
        for mode, options in (("default", []), ("--native", ["--native"])):
            runs = [one(ranks, options) for _ in range(args.repeats)]
            codes = sorted({r["rc"] for r in runs})
            rows.append((ranks, mode, statistics.median(r["seconds"] for r in runs),
                         max(r["seconds"] for r in runs),
                         statistics.median(r["manual"] for r in runs),
                         statistics.median(r["during"] for r in runs) * 1000,
                         statistics.median(r["before"] for r in runs) * 1000, codes))
    print("| ranks | attach | time to report, median (max) | baseline: py-spy dump of each "
          "rank by hand, 3 rounds a second apart | ratio | longest gap a rank saw during "
          "attach | longest gap in the 5 s before | attach's exit codes |")
    print("|---|---|---|---|---|---|---|---|")
    for ranks, mode, med, top, manual, during, before, codes in rows:
        print(f"| {ranks} | {mode} | {med:.2f} s ({top:.2f}) | {manual:.2f} s | "
              f"x{med / manual:.2f} | {during:.0f} ms | {before:.0f} ms | {codes} |")

if __name__ == "__main__":
    main()
