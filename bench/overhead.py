"""Recording overhead, measured side by side in one invocation: ``python bench/overhead.py``.

The measuring functions are used by ``bench/run.py`` (the full benchmark table); run alone,
this module prints the overhead part of it:

* caller-thread µs per recorded collective: the recording process group's hot path around a
  backend that returns at once, against calling that backend directly (in this process), and
  the whole process's CPU per collective once the writer thread has encoded and written it;
* a small all-reduce loop on 2 gloo ranks: plain torchrun, ``ddpdoctor run`` and plain
  torchrun with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (PyTorch's own collective checker);
* a DDP training loop (>= 5 ms steps, BatchNorm buffers, 4 gradient buckets), plain torchrun
  against ``ddpdoctor run``; and inside one ``ddpdoctor run`` job, recording switched on and
  off every 10 steps (``ddp_loop.py --ab``): the recording cost, free of drift between jobs.

Jobs of the different kinds alternate (A B C A B C ...), and the figure reported is the median
of the per-round ratios, so that drift of the machine between rounds hits every kind alike.
Every job runs with a tag in its environment; a job that overruns its time limit is stopped
and its processes (torchrun workers run in their own sessions) are found by that tag.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.launch.command import free_port

HERE = Path(__file__).resolve().parent
LOOP = HERE / "ddp_loop.py"
TAG_ENV = "DDPDOCTOR_BENCH_TAG"
PLAIN, DOCTOR, DETAIL = "plain", "ddpdoctor", "detail"


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


@dataclass
class HotPath:
    """Per call: the caller thread's CPU µs (plain and recorded), its wall-clock µs (recorded;
    includes waiting for the GIL and for the CPU on a busy machine), and the whole process's
    CPU µs per recorded collective once the writer thread has encoded and written it."""

    plain_us: float
    recorded_us: float
    recorded_wall_us: float
    cpu_us: float


def hot_path_us(n: int = 50_000) -> HotPath:
    """Time the recording process group around an instant backend, in this process."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
    from ddpdoctor.runtime.recorder import Recorder
    from ddpdoctor.runtime.torch_hooks import _internal_prefixes

    logdir = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    try:
        recorder = Recorder(logdir, "bench")
        recorder.set_internal_dirs(list(_internal_prefixes()))  # as in a rank
        recorder.start(0, 1, "gloo")
        inner = _InstantBackend()
        pg = RecordingProcessGroup(inner, None, 0, 1, "0", recorder)
        tensors = [torch.ones(4)]
        opts = dist.AllreduceOptions()

        def user_step(call: object) -> None:  # a user frame, as in a training loop
            call(tensors, opts)

        def timed(call: object, clock: object = time.thread_time) -> float:
            # The caller thread's own CPU time: what recording costs it, unaffected by other
            # processes competing for the CPU (wall time is reported beside it).
            chunks = []
            for _ in range(10):
                t0 = clock()
                for _ in range(n // 10):
                    user_step(call)
                chunks.append((clock() - t0) / (n // 10) * 1e6)
            return statistics.median(chunks)

        timed(pg.allreduce)  # warm the caches
        recorder.flush()
        plain, recorded = timed(inner.allreduce), timed(pg.allreduce)
        recorder.flush()
        wall = timed(pg.allreduce, time.perf_counter)
        recorder.flush()
        # Whole-process CPU (caller + writer thread) per collective, encoding and write included.
        cpu0 = time.process_time()
        for _ in range(n):
            user_step(pg.allreduce)
        recorder.flush()
        cpu = (time.process_time() - cpu0) / n * 1e6
        recorder.close()
        return HotPath(plain, recorded, wall, cpu)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _tagged_pids(tag: str) -> list[int]:
    """Processes whose environment carries ``TAG_ENV=tag`` (this user's, via /proc)."""
    needle = f"{TAG_ENV}={tag}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def stop_tagged(tag: str) -> None:
    """End every leftover process of a job, by pid: SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _tagged_pids(tag)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if not pids:
            return
        time.sleep(1.0)


@dataclass
class JobResult:
    """One benchmark job: its ``BENCH`` line, and for ddpdoctor jobs the trace it wrote."""

    value: float
    trace_bytes: int = 0
    collective_lines: int = 0
    collective_bytes: int = 0
    extra: dict = field(default_factory=dict)


def _trace_stats(logdir: Path) -> tuple[int, int, int]:
    """(all bytes, collective lines, bytes of collective lines) of the traces in ``logdir``."""
    total = lines = coll = 0
    for path in logdir.glob("rank-*.jsonl"):
        data = path.read_bytes()
        total += len(data)
        for line in data.split(b"\n"):
            if line.startswith(b'{"kind": "collective"'):
                lines += 1
                coll += len(line) + 1
    return total, lines, coll


def job(kind: str, mode: str, steps: int, env: dict[str, str] | None = None,
        timeout: float = 300.0, ab: int = 0) -> JobResult:
    """Run ``bench/ddp_loop.py`` once on 2 gloo ranks: plain torchrun, under ``ddpdoctor run``,
    or plain torchrun with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``. ``ab``: under ddpdoctor, switch
    recording on and off every ``ab`` steps (the result's ``value`` is then the on/off ratio)."""
    tag = uuid.uuid4().hex
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-bench-"))
    environ = dict(os.environ, **(env or {}), **{TAG_ENV: tag})
    environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    script = [str(LOOP), "--mode", mode, "--steps", str(steps), "--ab", str(ab)]
    if kind == DOCTOR:
        cmd = [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(work / "logs"),
               *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), *script]
        if kind == DETAIL:
            environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)
    except subprocess.TimeoutExpired:
        stop_tagged(tag)
        raise SystemExit(f"benchmark job ({kind}, {mode}) ran past {timeout:.0f} s") from None
    finally:
        stop_tagged(tag)
    try:
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCH ")), None)
        if line is None:
            raise SystemExit(f"benchmark job ({kind}, {mode}) failed:\n{out.stderr[-3000:]}")
        value = json.loads(line[6:])
        result = JobResult(value.get("ab_ratio", float("nan")) if ab else
                           value["step_ms" if mode == "ddp" else "op_us"], extra=value)
        if kind == DOCTOR:
            result.trace_bytes, result.collective_lines, result.collective_bytes = \
                _trace_stats(work / "logs")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def alternate(kinds: list[str], mode: str, steps: int, rounds: int,
              env: dict[str, dict[str, str]] | None = None) -> dict[str, list[JobResult]]:
    """``rounds`` rounds of one job of each kind, in turn (A B C A B C ...)."""
    out: dict[str, list[JobResult]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind in kinds:
            out[kind].append(job(kind, mode, steps, (env or {}).get(kind)))
    return out


@dataclass
class Paired:
    """A measure of two kinds over alternating rounds, as per-round ratios."""

    base: list[float]
    other: list[float]

    @property
    def ratios(self) -> list[float]:
        return [o / b for b, o in zip(self.base, self.other)]

    @property
    def ratio(self) -> float:
        """Median of the per-round ratios."""
        return statistics.median(self.ratios)

    def spread(self) -> str:
        """'×0.98–1.03 over 8 rounds' (min–max of the per-round ratios)."""
        r = self.ratios
        return f"×{min(r):.3f}–{max(r):.3f} over {len(r)} rounds"


def paired(results: dict[str, list[JobResult]], base: str, other: str,
           key: str | None = None) -> Paired:
    """The per-round values of two kinds of :func:`alternate`'s results (``key``: another
    figure of the ``BENCH`` line)."""
    def values(kind: str) -> list[float]:
        return [r.value if key is None else r.extra[key] for r in results[kind]]

    return Paired(values(base), values(other))


@dataclass
class InJob:
    """Recording on against off inside ``ddpdoctor run`` jobs: per block-pair ratios."""

    ratios: list[float]
    on: float
    off: float

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    def spread(self) -> str:
        """Interquartile range of the pair ratios, and how many pairs."""
        q = statistics.quantiles(self.ratios, n=4)
        return f"IQR ×{q[0]:.3f}–{q[2]:.3f} over {len(self.ratios)} block pairs"


def in_job_ab(mode: str, steps: int, block: int, jobs: int) -> InJob:
    """``jobs`` ddpdoctor jobs that switch recording on and off every ``block`` steps (ops)."""
    extras = [job(DOCTOR, mode, steps, ab=block).extra for _ in range(jobs)]
    return InJob([r for e in extras for r in e["ab_ratios"]],
                 statistics.median(e["ab_on"] for e in extras),
                 statistics.median(e["ab_off"] for e in extras))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of alternating jobs")
    parser.add_argument("--ddp-steps", type=int, default=150)
    parser.add_argument("--ops", type=int, default=3000)
    args = parser.parse_args()
    hp = hot_path_us()
    print(f"hot path: caller-thread CPU plain {hp.plain_us:.2f} µs, recorded "
          f"{hp.recorded_us:.2f} µs (wall {hp.recorded_wall_us:.2f} µs; process CPU incl. "
          f"writer {hp.cpu_us:.2f} µs)")
    ops = alternate([PLAIN, DOCTOR, DETAIL], "allreduce", args.ops, args.rounds)
    for kind in (DOCTOR, DETAIL):
        p = paired(ops, PLAIN, kind)
        print(f"all_reduce loop, {kind}: µs per op {statistics.median(p.other):.1f} vs "
              f"{statistics.median(p.base):.1f} plain, ×{p.ratio:.3f} ({p.spread()})")
    ddp = paired(alternate([PLAIN, DOCTOR], "ddp", args.ddp_steps, args.rounds), PLAIN, DOCTOR)
    print(f"DDP step: ms {statistics.median(ddp.other):.2f} vs {statistics.median(ddp.base):.2f}"
          f" plain, ×{ddp.ratio:.3f} ({ddp.spread()}; target ≤ ×1.02)")
    ab = in_job_ab("ddp", 600, 10, 1)
    print(f"DDP step, recording on/off inside one job: ×{ab.ratio:.3f} ({ab.spread()})")


if __name__ == "__main__":
    main()
