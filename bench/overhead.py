"""Recording overhead, measured side by side in one invocation: ``python bench/overhead.py``.

Prints a table:

* caller-thread µs per recorded collective: the recording process group's hot path around a
  backend that returns at once, against calling that backend directly (in this process);
* a small all-reduce loop on 2 gloo ranks, plain torchrun against ``ddpdoctor run``;
* a DDP training loop (>= 5 ms steps, several buckets), plain against ``ddpdoctor run``.

Plain and ddpdoctor jobs alternate (A B A B ...) so that drift of the machine hits both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddpdoctor.launcher import free_port

HERE = Path(__file__).resolve().parent
LOOP = HERE / "ddp_loop.py"


class _Future:
    def value(self) -> None:
        return None


class _Work:
    def is_completed(self) -> bool:
        return True

    def get_future(self) -> _Future:
        return _Future()


class _InstantBackend:
    """Stands in for gloo so that only the recorder's own cost is timed."""

    _work = _Work()

    def allreduce(self, *args: object) -> _Work:
        return self._work


def hot_path_us(n: int = 50_000) -> tuple[float, float]:
    """(plain, recorded) µs per call on the caller's thread."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
    from ddpdoctor.runtime.recorder import Recorder

    logdir = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    recorder = Recorder(logdir, "bench")
    recorder.set_internal_dirs([os.path.dirname(torch.__file__),
                                os.path.dirname(os.path.dirname(HERE / "x"))])
    recorder.start(0, 1, "gloo")
    inner = _InstantBackend()
    pg = RecordingProcessGroup(inner, None, 0, 1, "0", recorder)
    tensors = [torch.ones(4)]
    opts = dist.AllreduceOptions()

    def user_step(call: object) -> None:  # a user frame, as in a training loop
        call(tensors, opts)

    def timed(call: object) -> float:
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 5):
                user_step(call)
            best.append((time.perf_counter() - t0) / (n // 5) * 1e6)
        return statistics.median(best)

    timed(pg.allreduce)  # warm the caches
    plain, recorded = timed(inner.allreduce), timed(pg.allreduce)
    recorder.close()
    return plain, recorded


def _job(doctor: bool, mode: str, steps: int) -> float:
    script = [str(LOOP), "--mode", mode, "--steps", str(steps)]
    if doctor:
        logdir = tempfile.mkdtemp(prefix="ddpdoctor-bench-") + "/logs"
        cmd = [sys.executable, "-m", "ddpdoctor", "run", "--logdir", logdir, *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), *script]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    line = next((l for l in out.stdout.splitlines() if l.startswith("BENCH ")), None)
    if line is None:
        raise SystemExit(f"benchmark job failed:\n{out.stderr[-3000:]}")
    value = json.loads(line[6:])
    return value["step_ms" if mode == "ddp" else "op_us"]


def paired(mode: str, steps: int, rounds: int) -> tuple[float, float]:
    plain, doctor = [], []
    for _ in range(rounds):
        plain.append(_job(False, mode, steps))
        doctor.append(_job(True, mode, steps))
    return statistics.median(plain), statistics.median(doctor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="plain/ddpdoctor pairs per row")
    parser.add_argument("--ddp-steps", type=int, default=150)
    parser.add_argument("--ops", type=int, default=5000)
    args = parser.parse_args()
    rows = []
    plain, rec = hot_path_us()
    rows.append(("caller-thread µs per collective (hot path)", plain, rec,
                 f"+{rec - plain:.2f} µs (target ≤ 10)"))
    plain, rec = paired("allreduce", args.ops, args.rounds)
    rows.append(("all_reduce loop, µs per op (2 ranks)", plain, rec,
                 f"+{rec - plain:.1f} µs, ×{rec / plain:.3f}"))
    plain, rec = paired("ddp", args.ddp_steps, args.rounds)
    rows.append(("DDP step, ms (2 ranks, BN, 3+ buckets)", plain, rec,
                 f"×{rec / plain:.3f} ({(rec / plain - 1) * 100:+.1f}%, target ≤ +2%)"))
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'plain':>10}  {'ddpdoctor':>10}  ddpdoctor vs plain")
    for name, a, b, note in rows:
        print(f"{name:<{width}}  {a:>10.2f}  {b:>10.2f}  {note}")


if __name__ == "__main__":
    main()
