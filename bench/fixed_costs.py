"""What ddpdoctor costs a job once, whatever its length: part by part, each part measured alone.

    python bench/fixed_costs.py [--rounds 12] [--ranks 2]

Whole jobs cannot resolve it on this VM: two plain torchrun jobs of the LM headline job differ
by up to ±1.5 CPU-s (importing torch alone takes 1.3 or 1.9 CPU-s from one process to the
next), and the once-a-job cost is a few tenths of that. Each part below is a process, or a
call, measured on its own, with and without ddpdoctor in turn (``--rounds`` alternations);
the figure is the median of the differences with their interquartile range:

* **a rank's start**: a Python process with a torchrun worker's environment, up to its exit,
  with ddpdoctor's ``sitecustomize`` on its path (the runtime's boot: its imports, the trace
  opened, the watchdog thread started, the stderr helper spawned, the exit record) against
  the same process without it. Both import the standard-library modules the boot imports
  that ``import torch`` imports anyway (``shared_with_torch``: 36 in a rank, 25 in the agent,
  ``socket``, ``subprocess``, ``multiprocessing``...): in a rank the boot only imports them
  earlier, so they are no added cost (until session 51 they were counted: ~35 ms a process
  on session 52's host, half of the part);
* **torchrun's agent's start**: the same in a process that never becomes a rank;
* **the patches on torch's import** (``bootstrap._on_torch_imported``, timed inside a rank),
  and what the same hook runs in torchrun's agent (its workers' exit codes; no recording
  patches there since session 51);
* **the stderr helper** of each rank (a ``python -S -I`` process) copying 64 KB;
* **ddpdoctor's own process** for a job of a few small all-reduces on ``--ranks`` ranks: its
  start and imports, watching the job, the end read and the report (``overhead.job``).
* **torchrun's agent's end**, a part ddpdoctor takes away: on one node ``ddpdoctor run``
  starts the agent through ``TORCHRUN_ENTRY_QUICK_EXIT``, which ends it without the
  interpreter's teardown once torchrun's ``main`` has returned (``runtime/quick_exit.py``),
  against the console script's entry (``TORCHRUN_ENTRY``); each a torchrun of one worker that
  runs ``pass``, no ddpdoctor boot in either.

Not here: what the runtime costs while a rank imports torch and builds its model (the
watchdog's wake-ups, up to ~0.3 CPU-s a rank until session 49: ``rank_phases.py``), the
ranks' first DDP steps (sites learnt, DDP's hooks: ~20-50 ms a rank by a profile), the
in-rank threads and the launcher's watching, which grow with the job's length
(``whole_job.py``'s table, per job-minute), and the end read of a long job's
traces. Prints a table and the sum for a job of ``--ranks`` ranks on one node.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.launch.command import INJECT_DIR
from ddpdoctor.runtime import env, stderr_tail
from ddpdoctor.runtime.torch_internals import TORCHRUN_ENTRY, TORCHRUN_ENTRY_QUICK_EXIT

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402  (bench/ is no package)

TAIL_INPUT = 64 * 1024  # bytes the stderr helper copies in its measurement

_PATCH_TIMER = """
import time
from ddpdoctor.runtime import bootstrap
real = bootstrap._on_torch_imported
took = []
def timed():
    t0 = time.thread_time()
    real()
    took.append(time.thread_time() - t0)
bootstrap._on_torch_imported = timed
bootstrap.boot()
import torch
print(repr(took[0]))
"""


def process_cpu(cmd: list[str], environ: dict[str, str], stdin: bytes = b"") -> float:
    """CPU seconds of one process from its start to its exit (every thread; children it
    waited for included: only torchrun's one worker in ``agent-end``)."""
    before = overhead.children_cpu()
    subprocess.run(cmd, input=stdin, env=environ, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=True, timeout=300)
    return overhead.children_cpu() - before


def rank_env(base: dict[str, str], logdir: str, ranks: int, worker: bool) -> dict[str, str]:
    """The environment ``ddpdoctor run`` gives a process of a torchrun job (``worker``: a rank
    whose parent is the job's top process, this bench)."""
    environ = dict(base, **{
        "PYTHONPATH": os.pathsep.join(p for p in (INJECT_DIR, base.get("PYTHONPATH", "")) if p),
        env.LOGDIR: logdir, env.RUN_ID: "fixed-costs", env.LAUNCHER: "torchrun",
        env.LAUNCHER_PID: "1", env.TOP_PID: str(os.getpid())})
    if worker:
        environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(ranks),
                       LOCAL_WORLD_SIZE=str(ranks), TORCHELASTIC_RUN_ID="fixed-costs")
    else:
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
            environ.pop(name, None)
    return environ


@dataclass(frozen=True)
class Part:
    """One part of the once-a-job cost: its key and name, how many of it a job of N ranks
    has, what it costs without ddpdoctor and with it, one round (CPU seconds; plain None:
    nothing to compare)."""

    key: str
    name: str
    per_job: Callable[[int], int]
    measure: Callable[[Path], tuple[float | None, float]]


@dataclass
class Figure:
    """A part's rounds."""

    part: Part
    plain: list[float]
    doctor: list[float]

    @property
    def added(self) -> list[float]:
        """ddpdoctor's CPU seconds over plain's, round by round."""
        if not self.plain:
            return list(self.doctor)
        return [d - p for p, d in zip(self.plain, self.doctor)]

    @property
    def median(self) -> float:
        return statistics.median(self.added)


def per_job_sum(figures: list[Figure], ranks: int) -> float:
    """CPU seconds ddpdoctor adds once to a job of ``ranks`` ranks on one node: each part's
    median times its count in the job."""
    return sum(f.median * f.part.per_job(ranks) for f in figures)


def _modules(environ: dict[str, str], code: str = "") -> set[str]:
    """The modules a Python process with ``environ`` has imported after running ``code``."""
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(*sorted(sys.modules))"],
                         env=environ, capture_output=True, text=True, check=True, timeout=300)
    return set(out.stdout.splitlines()[-1].split())


_TORCH_MODULES: dict[str, set[str]] = {}  # by PYTHONPATH: one torch import a bench run


def shared_with_torch(base: dict[str, str], booted: dict[str, str]) -> list[str]:
    """The modules a process booted with ``booted`` imports beyond a plain one that importing
    torch (and DDP) imports anyway; ddpdoctor's own excluded."""
    plain = _modules(base)
    key = base.get("PYTHONPATH", "")
    if key not in _TORCH_MODULES:
        _TORCH_MODULES[key] = _modules(base, "import torch, torch.distributed, torch.nn.parallel")
    torch = _TORCH_MODULES[key]
    return sorted(m for m in (_modules(booted) - plain) & torch
                  if m.partition(".")[0] not in ("ddpdoctor", "sitecustomize", "__mp_main__"))


def parts(base: dict[str, str], ranks: int) -> list[Part]:
    plain_env = dict(base)
    commands: dict[bool, list[str]] = {}

    def command(worker: bool, work: Path) -> list[str]:
        """Both arms import what torch would (found once, on the first round)."""
        if worker not in commands:
            booted = rank_env(base, tempfile.mkdtemp(dir=work), ranks, worker)
            names = shared_with_torch(base, booted)
            commands[worker] = [sys.executable, "-c", "import " + ", ".join(names or ["sys"])]
        return commands[worker]

    def start(worker: bool) -> Callable[[Path], tuple[float | None, float]]:
        def measure(work: Path) -> tuple[float | None, float]:
            python = command(worker, work)
            plain = process_cpu(python, plain_env)
            logdir = tempfile.mkdtemp(dir=work)
            doctor = process_cpu(python, rank_env(base, logdir, ranks, worker))
            return plain, doctor
        return measure

    def patches(worker: bool) -> Callable[[Path], tuple[float | None, float]]:
        def measure(work: Path) -> tuple[float | None, float]:
            environ = rank_env(base, tempfile.mkdtemp(dir=work), ranks, worker)
            environ["PYTHONPATH"] = base.get("PYTHONPATH", "")  # boot() is called by the timer
            if not worker:  # the launcher's child: the job's top process, torchrun's agent
                environ[env.LAUNCHER_PID] = str(os.getpid())
            out = subprocess.run([sys.executable, "-c", _PATCH_TIMER], env=environ, check=True,
                                 capture_output=True, text=True, timeout=300)
            return None, float(out.stdout.strip().splitlines()[-1])
        return measure

    def helper(work: Path) -> tuple[float | None, float]:
        cmd = [sys.executable, "-S", "-I", stderr_tail.__file__, str(work / "stderr-tail.txt")]
        return None, process_cpu(cmd, {"PATH": base.get("PATH", "")}, b"x" * TAIL_INPUT)

    def launcher(_work: Path) -> tuple[float | None, float]:
        result = overhead.job(overhead.DOCTOR, overhead.SMALL_OPS, ["--ops", "50"], nproc=ranks)
        return None, result.launcher_cpu_s

    def agent_end(work: Path) -> tuple[float | None, float]:
        worker = work / "worker.py"
        worker.write_text("pass\n")

        def agent(entry: str) -> float:
            return process_cpu([sys.executable, "-c", entry, "--nproc-per-node", "1",
                                "--master-port", str(overhead.free_port()), str(worker)],
                               plain_env)
        return agent(TORCHRUN_ENTRY), agent(TORCHRUN_ENTRY_QUICK_EXIT)

    def each_rank(n: int) -> int:
        return n

    def once(_n: int) -> int:
        return 1

    return [
        Part("rank", "a rank's start, to its exit (boot, trace, watchdog, helper spawned; "
             "beyond what torch imports anyway)", each_rank, start(worker=True)),
        Part("agent", "torchrun's agent's start, to its exit (beyond what torch imports "
             "anyway)", once, start(worker=False)),
        Part("patches", "the patches on torch's import, in a rank", each_rank, patches(True)),
        Part("agent-patches", "what torch's import runs in torchrun's agent (exit codes)", once,
             patches(False)),
        Part("helper", f"a rank's stderr helper, copying {TAIL_INPUT // 1024} KB", each_rank,
             helper),
        Part("launcher", "ddpdoctor's own process, a job of 50 small all-reduces", once,
             launcher),
        Part("agent-end", "torchrun's agent's end, its interpreter's teardown (a job of one "
             "worker that runs `pass`)", once, agent_end),
    ]


def measure(rounds: int, ranks: int) -> list[Figure]:
    base = dict(os.environ)
    base.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's install has its bytecode
    overhead.compile_sources(base)
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-fixed-costs-"))
    try:
        figures = [Figure(p, [], []) for p in parts(base, ranks)]
        for i in range(rounds):
            for f in figures:
                plain, doctor = f.part.measure(work)
                if plain is not None:
                    f.plain.append(plain)
                f.doctor.append(doctor)
            print(f"round {i + 1}/{rounds}", file=sys.stderr, flush=True)
        return figures
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(figures: list[Figure], ranks: int) -> str:
    rows = ["| part | per job | plain CPU ms | with ddpdoctor CPU ms | added ms (median) | IQR |",
            "|---|---|---|---|---|---|"]
    for f in figures:
        low, high = overhead.interquartile(f.added)
        plain = f"{statistics.median(f.plain) * 1e3:.1f}" if f.plain else "—"
        rows.append(f"| {f.part.name} | ×{f.part.per_job(ranks)} | {plain} | "
                    f"{statistics.median(f.doctor) * 1e3:.1f} | {f.median * 1e3:+.1f} | "
                    f"{low * 1e3:+.1f} to {high * 1e3:+.1f} |")
    rows.append(f"\nAdded once to a job of {ranks} ranks on one node, the parts above: "
                f"**{per_job_sum(figures, ranks):.3f} CPU-s** "
                f"({len(figures[0].doctor)} rounds).")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    print(table(measure(args.rounds, args.ranks), args.ranks))


if __name__ == "__main__":
    main()
