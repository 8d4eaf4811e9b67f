"""Recording overhead, measured side by side in one invocation: ``python bench/overhead.py``.

The measuring functions are used by ``bench/run.py`` (the full benchmark table); run alone,
this module prints the overhead part of it:

* caller-thread µs per recorded collective: the recording process group's hot path around a
  backend that returns at once, against calling that backend directly (in this process), and
  the whole process's CPU per collective once the writer thread has encoded and written it;
* a realistic DDP job (``cnn_job.py``: a 3.0 M-parameter CNN with BatchNorm,
  ``bucket_cap_mb=0.5``, 2 gloo ranks): plain torchrun, ``ddpdoctor run`` and plain torchrun
  with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` -- each rank's CPU time and the median step time;
* a small all-reduce loop (``small_ops.py``), the same three ways: µs and process CPU µs per op.

Jobs of the different kinds alternate (A B C A B C ...), and the figure reported is the median
of the per-round ratios with their spread, so that drift of the machine between rounds hits
every kind alike. Every job runs with a tag in its environment; a job that overruns its time
limit is stopped and its processes (torchrun workers run in their own sessions) are found by
that tag.
"""

from __future__ import annotations

import argparse
import compileall
import json
import math
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ddpdoctor
from ddpdoctor.launch.command import free_port

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hot_path_floor  # noqa: E402  (bench/ is no package)

CNN = HERE / "cnn_job.py"
SMALL_OPS = HERE / "small_ops.py"
TAG_ENV = "DDPDOCTOR_BENCH_TAG"
PLAIN, DOCTOR, DETAIL = "plain", "ddpdoctor", "detail"
# plain torchrun with PyTorch's flight recorder off (torch 2.13 keeps 2,000 entries by default)
NO_FR = "plain, no flight recorder"
# An arm of a bench that compares whole jobs: its name in the table, its kind of job (above),
# its environment.
Arm = tuple[str, str, "dict[str, str] | None"]
PLAIN_ARM = "plain torchrun"
DOCTOR_ARM = "ddpdoctor run"


HOT_PATHS_HELP = ("ddpdoctor arms whose small-op loop runs on stand-ins of the recording, "
                  "comma-separated: " + ", ".join(
                      f"{name} ({hot_path_floor.VARIANTS[name]})"
                      for name in hot_path_floor.STAND_INS))


def hot_paths(text: str) -> list[str]:
    """``--hot-paths``: the stand-ins named (``hot_path_floor.STAND_INS``), in order."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [n for n in names if n not in hot_path_floor.STAND_INS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown hot path {', '.join(unknown) or text!r}: one or more of "
            + ", ".join(hot_path_floor.STAND_INS))
    return names


def arms(before: Path | None, commit: str | None, aa: bool,
         stand_ins: list[str] | tuple[str, ...] = ()) -> list[Arm]:
    """Plain torchrun and ddpdoctor run; with ``before`` (the ``src`` of ``commit``),
    that commit's ddpdoctor, first on ``PYTHONPATH``; per name in ``stand_ins``, ddpdoctor run
    with the small-op loop's recording replaced by that stand-in (``hot_path_floor.py``); with
    ``aa``, a second plain arm (the bench's own spread)."""
    out: list[Arm] = [(PLAIN_ARM, PLAIN, None), (DOCTOR_ARM, DOCTOR, None)]
    if before is not None:
        out.append((f"ddpdoctor run, {(commit or '')[:8]}", DOCTOR, {"PYTHONPATH": str(before)}))
    out += [(f"ddpdoctor run, hot path {variant}", DOCTOR,
             {hot_path_floor.VARIANT_ENV: variant}) for variant in stand_ins]
    if aa:
        out.append((f"{PLAIN_ARM} (A/A)", PLAIN, None))
    return out


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
    module_loop_us: float  # caller CPU, the loop at module level of a 2,000-line script


# A tutorial-style script: its setup, then the training loop at module level, where each frame
# of the call stack sits deep in a long code object (reading its line number scans the code's
# line table; hashing it covers its constants).
_MODULE_LOOP = "\n".join(f"setting_{i} = {i}" for i in range(2000)) + """
t0 = clock()
for _ in range(n):
    call(tensors, opts)
elapsed = clock() - t0
"""


def hot_path_us(n: int = 50_000) -> HotPath:
    """Time the recording process group around an instant backend, in this process."""
    import torch
    import torch.distributed as dist

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
    from ddpdoctor.runtime.recorder import Recorder
    from ddpdoctor.runtime.user_code import internal_prefixes

    logdir = tempfile.mkdtemp(prefix="ddpdoctor-bench-")
    try:
        recorder = Recorder(logdir, "bench")
        recorder.set_internal_dirs(list(internal_prefixes()))  # as in a rank
        recorder.start(0, 1, "gloo")
        inner = _InstantBackend()
        pg = RecordingProcessGroup(inner, None, 0, 1, "0", recorder)
        tensors = [torch.ones(4)]
        opts = dist.AllreduceOptions()

        def user_step(call: object) -> None:  # a user frame, as in a training loop
            call(tensors, opts)

        def timed(call: object, clock: object = time.thread_time) -> float:
            # The caller thread's own CPU time: what recording costs it, unaffected by other
            # processes competing for the CPU (wall time is reported beside it). The mean over
            # all calls, not a median of chunks: a median hides what recording causes now and
            # then (the interpreter's full garbage collections: 6 µs a call before records
            # stopped keeping a dozen objects alive each).
            t0 = clock()
            for _ in range(n):
                user_step(call)
            return (clock() - t0) / n * 1e6

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
        scope = {"clock": time.thread_time, "n": n, "call": pg.allreduce, "tensors": tensors,
                 "opts": opts}
        exec(compile(_MODULE_LOOP, os.path.join(logdir, "train.py"), "exec"), scope)
        module_loop = scope["elapsed"] / n * 1e6
        recorder.close()
        return HotPath(plain, recorded, wall, cpu, module_loop)
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
    """One benchmark job: the ``BENCH`` line of every rank, the CPU time of the whole job
    (launchers included, from the moment it started), its wall time, the CPU the rest of the
    machine used meanwhile, for ddpdoctor jobs the trace and the CPU of ddpdoctor's own
    process (the launcher, its monitor and reporting)."""

    ranks: list[dict]
    job_cpu_s: float
    wall_s: float = 0.0
    others_cpu_s: float = float("nan")  # the machine's busy CPU less this job's
    steal_s: float = float("nan")  # the hypervisor's steal from this machine during the job
    launcher_cpu_s: float = float("nan")
    trace_bytes: int = 0
    collective_lines: int = 0
    collective_bytes: int = 0

    @property
    def others_cores(self) -> float:
        """The other tenants' CPU during the job, in cores."""
        return self.others_cpu_s / self.wall_s if self.wall_s else float("nan")

    @property
    def steal_cores(self) -> float:
        """The host's other guests' share of this machine's CPUs during the job, in cores."""
        return self.steal_s / self.wall_s if self.wall_s else float("nan")

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.ranks)

    def total(self, key: str) -> float:
        return sum(r[key] for r in self.ranks)


def _trace_stats(logdir: Path) -> tuple[int, int, int]:
    """(all bytes, collective lines, bytes of collective lines) of the traces in ``logdir``."""
    total = lines = coll = 0
    for path in logdir.glob("rank-*.jsonl"):
        data = path.read_bytes()
        total += len(data)
        for line in data.split(b"\n"):
            if line.startswith(b'{"id": '):  # format 4's collective lines
                lines += 1
                coll += len(line) + 1
    return total, lines, coll


def children_cpu() -> float:
    """CPU seconds (user and system) of every child this process has waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_cpu() -> tuple[float, float]:
    """CPU seconds since boot (``/proc/stat``): what every process of the machine used (user,
    nice, system, irq and softirq time), and what the hypervisor gave to others while this
    machine's CPUs had work (steal: a host shared with other guests); NaN where there is no
    such file."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return float("nan"), float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, steal / tick


# ``python -m ddpdoctor`` that writes its own process's CPU seconds (every thread, its children
# not counted) to the file named by SELF_CPU_ENV as it exits (the CLI ends with os._exit).
SELF_CPU_ENV = "DDPDOCTOR_BENCH_SELF_CPU"
_SELF_CPU = f"""
import os, resource, runpy, sys
out = os.environ.pop({SELF_CPU_ENV!r})
real_exit = os._exit
def _exit(code):
    if os.getpid() == launcher:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(out, "w") as fh:
            fh.write(repr(usage.ru_utime + usage.ru_stime))
    real_exit(code)
launcher = os.getpid()
os._exit = _exit
sys.argv[0] = "ddpdoctor"
runpy.run_module("ddpdoctor", run_name="__main__", alter_sys=True)
"""


_COMPILED: set[Path] = set()


def compile_sources(environ: dict[str, str]) -> None:
    """Write the bytecode of each ddpdoctor package a job with ``environ`` may import (its
    ``PYTHONPATH``'s, then the one this process imports), once a bench: a user's install has
    it (pip compiles at install), a fresh checkout has not, and the first ddpdoctor job of a
    bench would pay for compiling it (~3 CPU-s in ddpdoctor's own process, session 48)."""
    folders = [Path(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for package in [f / "ddpdoctor" for f in folders] + [Path(ddpdoctor.__file__).parent]:
        if package not in _COMPILED and package.is_dir():
            _COMPILED.add(package)
            compileall.compile_dir(str(package), quiet=1)


def job(kind: str, script: Path, args: list[str], env: dict[str, str] | None = None,
        timeout: float = 300.0, options: tuple[str, ...] = (), nproc: int = 2) -> JobResult:
    """Run ``script`` once on ``nproc`` gloo ranks: plain torchrun, under ``ddpdoctor run`` (with
    ``options``), plain torchrun with ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, or plain torchrun
    with PyTorch's flight recorder off."""
    tag = uuid.uuid4().hex
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-bench-"))
    # TMPDIR: what torchrun and the ranks leave in the temporary folder goes with ``work``.
    environ = dict(os.environ, **(env or {}), **{TAG_ENV: tag, "TMPDIR": str(work)})
    environ.pop("TORCH_DISTRIBUTED_DEBUG", None)
    environ.pop("TORCH_FR_BUFFER_SIZE", None)  # torch's default, unless NO_FR
    # A user's install has its modules' bytecode cached: a job must not compile ddpdoctor's
    # sources on every start because this shell says not to write bytecode.
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if kind == DOCTOR:
        compile_sources(environ)
        environ[SELF_CPU_ENV] = str(work / "launcher-cpu")
        cmd = [sys.executable, "-c", _SELF_CPU, "run", "--logdir", str(work / "logs"),
               *options, "--nproc-per-node", str(nproc), str(script), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", str(free_port()), str(script), *args]
        if kind == DETAIL:
            environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        if kind == NO_FR:
            environ["TORCH_FR_BUFFER_SIZE"] = "0"
    (busy0, steal0), cpu0, wall0 = machine_cpu(), children_cpu(), time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)
    except subprocess.TimeoutExpired:
        stop_tagged(tag)
        raise SystemExit(f"benchmark job ({kind}, {script.name}) ran past {timeout:.0f} s") \
            from None
    finally:
        stop_tagged(tag)
    try:
        lines = bench_lines(out.stdout)
        if len(lines) != nproc:
            raise JobFailed(f"{kind} job of {script.name} failed (exit {out.returncode}): "
                            + _last_error(out.stderr))
        wall, job_cpu = time.perf_counter() - wall0, children_cpu() - cpu0
        busy, steal = machine_cpu()
        result = JobResult(sorted(lines, key=lambda r: r["rank"]), job_cpu, wall,
                           busy - busy0 - job_cpu, steal - steal0)
        if kind == DOCTOR:
            try:
                result.launcher_cpu_s = float((work / "launcher-cpu").read_text())
            except (OSError, ValueError):
                pass
            result.trace_bytes, result.collective_lines, result.collective_bytes = \
                _trace_stats(work / "logs")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench_lines(stdout: str) -> list[dict]:
    """The ``BENCH {json}`` records in a job's output (two ranks' lines may share a line)."""
    decoder = json.JSONDecoder()
    out = []
    for piece in stdout.split("BENCH ")[1:]:
        try:
            out.append(decoder.raw_decode(piece)[0])
        except json.JSONDecodeError:
            continue
    return out


class JobFailed(Exception):
    """A benchmark job ended without its BENCH lines (DETAIL does, on DDP with torch 2.13)."""


def _last_error(stderr: str) -> str:
    """The last line naming an exception ('RuntimeError: ...'), for a one-line reason."""
    for line in reversed(stderr.splitlines()):
        found = re.search(r"\b\w*(Error|Exception): .*", line)
        if found:
            return found.group(0).strip()[:200]
    return (stderr.strip().splitlines() or ["no output"])[-1][:200]


def alternate(kinds: list[str], script: Path, args: list[str], rounds: int,
              ) -> tuple[dict[str, list[JobResult]], dict[str, str]]:
    """``rounds`` rounds of one job of each kind, in turn (A B C A B C ...). A kind whose
    first job fails is dropped, with the reason, from the later rounds."""
    out: dict[str, list[JobResult]] = {k: [] for k in kinds}
    failed: dict[str, str] = {}
    for _ in range(rounds):
        for kind in kinds:
            if kind in failed:
                continue
            try:
                out[kind].append(job(kind, script, args))
            except JobFailed as exc:
                failed[kind] = str(exc)
    return out, failed


def interquartile(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles of ``values`` (the least and the greatest under 4)."""
    r = sorted(values)
    if len(r) < 4:
        return r[0], r[-1]
    q = statistics.quantiles(r, n=4)
    return q[0], q[2]


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval of the median of ``values`` (order statistics:
    the k-th least and greatest, k the largest with P(Binomial(n, ½) < k) ≤ (1 − level) / 2);
    None when too few values allow one at ``level`` (under 6 at 95 %)."""
    r, n = sorted(values), len(values)
    tail, k, below = (1 - level) / 2, 0, 0.0
    while k < n and below + math.comb(n, k) / 2 ** n <= tail:
        below += math.comb(n, k) / 2 ** n
        k += 1
    if k == 0:
        return None
    return r[k - 1], r[n - k]


def against_target(interval: tuple[float, float] | None, target: float) -> str:
    """Whether a median's interval shows a figure at most ``target``: met (the whole interval at
    or under it), not met (the whole interval over it), else not resolved."""
    if interval is None:
        return "too few rounds to tell"
    if interval[1] <= target:
        return "met"
    return "not met" if interval[0] > target else "not resolved"


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

    @property
    def low_high(self) -> tuple[float, float]:
        """The interquartile range of the per-round ratios (min–max under 4 rounds)."""
        return interquartile(self.ratios)

    def spread(self) -> str:
        """'IQR ×0.98–1.03 of 8 rounds'."""
        lo, hi = self.low_high
        what = "IQR" if len(self.ratios) >= 4 else "range"
        return f"{what} ×{lo:.3f}–{hi:.3f} of {len(self.ratios)} rounds"


def paired(results: dict[str, list[JobResult]], base: str, other: str,
           value: Callable[[JobResult], float]) -> Paired:
    """``value`` of two kinds of :func:`alternate`'s results, round by round."""
    return Paired([value(r) for r in results[base]], [value(r) for r in results[other]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of alternating jobs")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ops", type=int, default=3000)
    args = parser.parse_args()
    hp = hot_path_us()
    print(f"hot path: caller-thread CPU plain {hp.plain_us:.2f} µs, recorded "
          f"{hp.recorded_us:.2f} µs (wall {hp.recorded_wall_us:.2f} µs; process CPU incl. "
          f"writer {hp.cpu_us:.2f} µs)")
    res, failed = alternate([PLAIN, DOCTOR, DETAIL], CNN, ["--steps", str(args.steps)],
                            args.rounds)
    for kind in (DOCTOR, DETAIL):
        if kind in failed:
            print(f"CNN job, {kind}: {failed[kind]}")
            continue
        cpu = paired(res, PLAIN, kind, lambda r: r.total("cpu_s"))
        step = paired(res, PLAIN, kind, lambda r: r.median("step_ms"))
        print(f"CNN job, {kind}: rank CPU ×{cpu.ratio:.4f} ({cpu.spread()}), step "
              f"×{step.ratio:.4f} ({step.spread()})")
    ops, failed = alternate([PLAIN, DOCTOR, DETAIL], SMALL_OPS, ["--ops", str(args.ops)],
                            args.rounds)
    for kind in (DOCTOR, DETAIL):
        p = paired(ops, PLAIN, kind, lambda r: r.median("op_us"))
        print(f"all_reduce loop, {kind}: µs per op {statistics.median(p.other):.1f} vs "
              f"{statistics.median(p.base):.1f} plain, ×{p.ratio:.3f} ({p.spread()})")


if __name__ == "__main__":
    main()
