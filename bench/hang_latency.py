"""Seconds from the moment a scripted hang begins to ddpdoctor's printed diagnosis.

``python bench/hang_latency.py [--hang-timeout 5] [--rounds 3]`` runs a 2-rank job in which
rank 0 alone enters a barrier after a few steps. The job prints the wall-clock time at which
the hang begins; the clock stops when ddpdoctor has printed the diagnosis and exited.
Target: at most hang-timeout + 5 s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = '''
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
for _ in range(20):
    t = torch.ones(8)
    dist.all_reduce(t)
if dist.get_rank() == 0:
    print("HANG_BEGINS", time.time(), flush=True)
    dist.barrier()
time.sleep(3600)
'''


def one(hang_timeout: float) -> float:
    """Latency of one hang, in seconds."""
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-hang-"))
    script = work / "hang_job.py"
    script.write_text(JOB)
    proc = subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(work / "logs"),
         "--hang-timeout", str(hang_timeout), "--grace", "2", str(script)],
        capture_output=True, text=True, timeout=hang_timeout + 120)
    done = time.time()
    begun = next((float(line.split()[1]) for line in proc.stdout.splitlines()
                  if line.startswith("HANG_BEGINS")), None)
    if begun is None or proc.returncode != 3:
        raise SystemExit(f"hang benchmark job did not hang as scripted:\n{proc.stderr[-3000:]}")
    return done - begun


def measure(hang_timeout: float, rounds: int) -> list[float]:
    return [one(hang_timeout) for _ in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-timeout", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    values = measure(args.hang_timeout, args.rounds)
    median = statistics.median(values)
    print(f"hang-to-diagnosis: median {median:.2f} s over {len(values)} runs "
          f"(min {min(values):.2f}, max {max(values):.2f}); timeout {args.hang_timeout:g} s, "
          f"overshoot {median - args.hang_timeout:+.2f} s (target ≤ +5 s)")


if __name__ == "__main__":
    main()
