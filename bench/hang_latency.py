"""Seconds from the moment a scripted hang begins to ddpdoctor's printed diagnosis.

``python bench/hang_latency.py [--hang-timeout 5] [--rounds 3] [--kind timeout|mismatch]``
runs a 2-rank DDP job that hangs after a few steps; the job prints the wall-clock time at
which the hang begins, and the clock stops when ddpdoctor has printed the diagnosis and
exited.

* ``timeout``: rank 0 alone enters a barrier while rank 1 waits in a ``recv`` from it. Nothing
  proves that these cannot match (point-to-point), so the hang rule applies: every rank waits
  for the hang timeout. Target: at most hang-timeout + 5 s.
* ``mismatch``: rank 0 alone enters a barrier while rank 1 runs its next training step (a DDP
  gradient-bucket all-reduce). A barrier cannot match an all-reduce: ddpdoctor diagnoses it at
  once, whatever the hang timeout (30 s here). Target: at most 2 s.
* ``stuck``: rank 1 sleeps outside collectives after its fifth step while rank 0 waits in
  the sixth step's gradient all-reduce: the stuck rule (rank 1 blocked, everyone else
  waiting for it). Target: at most hang-timeout + 1 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = '''
import time, torch, torch.distributed as dist
from torch import nn
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
for _ in range(5):
    model(torch.randn(8, 64)).sum().backward()
if KIND == "stuck":
    if dist.get_rank() == 1:
        print("HANG_BEGINS", time.time(), flush=True)
        time.sleep(3600)
    model(torch.randn(8, 64)).sum().backward()
elif dist.get_rank() == 0:
    print("HANG_BEGINS", time.time(), flush=True)
    dist.barrier()
elif KIND == "mismatch":
    model(torch.randn(8, 64)).sum().backward()
else:
    dist.recv(torch.zeros(1), src=0)
time.sleep(3600)
'''

TIMEOUT = {"timeout": None, "mismatch": 30.0, "stuck": None}


def one(hang_timeout: float, kind: str = "timeout") -> float:
    """Latency of one hang, in seconds."""
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-hang-"))
    try:
        script = work / "hang_job.py"
        script.write_text(f"KIND = {kind!r}\n" + JOB)
        proc = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(work / "logs"),
             "--hang-timeout", str(hang_timeout), "--grace", "2", str(script)],
            capture_output=True, text=True, timeout=hang_timeout + 120,
            env={**os.environ, "TMPDIR": str(work)})  # torchrun's leftovers go with it
        done = time.time()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    begun = next((float(line.split()[1]) for line in proc.stdout.splitlines()
                  if line.startswith("HANG_BEGINS")), None)
    if begun is None or proc.returncode != 3:
        raise SystemExit(f"hang benchmark job did not hang as scripted:\n{proc.stderr[-3000:]}")
    return done - begun


def measure(hang_timeout: float, rounds: int, kind: str = "timeout") -> list[float]:
    return [one(hang_timeout, kind) for _ in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-timeout", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kind", choices=sorted(TIMEOUT), default="timeout")
    args = parser.parse_args()
    timeout = args.hang_timeout or TIMEOUT[args.kind] or 5.0
    values = measure(timeout, args.rounds, args.kind)
    median = statistics.median(values)
    target = {"mismatch": "≤ 2 s", "stuck": "≤ timeout + 1 s"}.get(args.kind,
                                                                  "≤ timeout + 5 s")
    print(f"{args.kind}: hang-to-diagnosis median {median:.2f} s over {len(values)} runs "
          f"(min {min(values):.2f}, max {max(values):.2f}); hang timeout {timeout:g} s "
          f"(target {target})")


if __name__ == "__main__":
    main()
