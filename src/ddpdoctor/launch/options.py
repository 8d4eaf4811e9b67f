"""What ``ddpdoctor run`` was asked to do, and the checks made before anything starts."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ddpdoctor.launch.errors import UsageError
from ddpdoctor.runtime.env import Launcher

if TYPE_CHECKING:
    from ddpdoctor.launch.torchrun import Torchrun


# Jobs of this many ranks or more keep identical ranks' collective lines once (--share-lines).
SHARE_FROM_RANKS = 16


@dataclass
class RunOptions:
    """Everything ``ddpdoctor run`` was asked to do."""

    script: str
    args: list[str] = field(default_factory=list)
    torchrun_args: list[str] = field(default_factory=list)  # torchrun's options, verbatim
    launcher: Launcher = Launcher.TORCHRUN  # COMMAND: SCRIPT ARGS is the user's own launch
    # command (accelerate launch ..., srun ..., bash launch.sh)
    logdir: str | None = None
    backend: str | None = None
    hang_timeout: float = 30.0
    stuck_timeout: float | None = 600.0  # a rank idle at one place outside collectives
    grace: float = 5.0
    status_every: float = 10.0
    cpu: bool = False  # run a CUDA/NCCL script on the CPU with gloo (runtime/cpu_mode.py)
    max_steps: int | None = None  # stop every rank at the start of DDP iteration N+1
    epoch_steps: int | None = None  # every DataLoader pass yields at most N batches
    expect_schedule: str | None = None  # schedule file the run must match (analysis/schedule.py)
    # Per-rank trace size after which only what breaks the rank's pattern is written
    # (runtime/trace_cap.py; CLI --max-trace-mb): bench/run.py item f measures the hour.
    max_trace_mb: float | None = 16.0
    reports: bool = False  # --junit or --markdown: the run is a CI check
    flight_recorder: bool = False  # PyTorch's flight recorder instead of ddpdoctor's recorder
    record_nccl: bool = False  # wrap NCCL groups too (checked on one GPU)
    # Rewrite identical ranks' traces as member files once the job has ended
    # (trace/shared_lines.py): None decides by the job's size (SHARE_FROM_RANKS).
    share_lines: bool | None = None
    _torchrun: Torchrun | None = field(default=None, repr=False)

    @property
    def torchrun(self) -> Torchrun:
        """torchrun's reading of :attr:`torchrun_args` (raises :class:`UsageError`)."""
        if self._torchrun is None:
            from ddpdoctor.launch import torchrun

            self._torchrun = torchrun.read(self.torchrun_args, self.script, self.args)
        return self._torchrun

    @property
    def module(self) -> bool:
        """SCRIPT is a module name (``-m``)."""
        return any(t in ("-m", "--module") for t in self.torchrun_args)

    @property
    def ci_mode(self) -> bool:
        """A CI check (--cpu, --max-steps, --epoch-steps, a CI report, or $CI set): nothing
        tested fails."""
        ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
        return self.cpu or self.max_steps is not None or self.epoch_steps is not None or \
            self.reports or ci


def check_script(opts: RunOptions) -> None:
    """Refuse a missing or syntactically broken script (or a launch command that is not there)
    before starting anything."""
    if opts.launcher == Launcher.COMMAND:
        if shutil.which(opts.script) is None:
            raise UsageError(f"command not found: {opts.script}")
        return
    if opts.module or (opts.launcher == Launcher.TORCHRUN and opts.torchrun.no_python):
        return
    path = Path(opts.script)
    if not path.exists():
        raise UsageError(f"script not found: {opts.script}")
    if not path.is_file():
        raise UsageError(f"not a file: {opts.script}")
    try:
        source = path.read_bytes()
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise UsageError(f"{opts.script}:{exc.lineno}: syntax error: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {opts.script}: {exc}") from None


def check_options(opts: RunOptions) -> None:
    """Refuse contradictory options (one line, no traceback)."""
    if opts.cpu and opts.backend and opts.backend.lower() != "gloo":
        raise UsageError(f"--cpu runs on gloo; it cannot be combined with --backend "
                         f"{opts.backend}")
    if opts.max_steps is not None and opts.max_steps < 1:
        raise UsageError("--max-steps must be at least 1")
    if opts.epoch_steps is not None and opts.epoch_steps < 1:
        raise UsageError("--epoch-steps must be at least 1")
    if opts.launcher == Launcher.COMMAND:
        if opts.torchrun_args:
            raise UsageError(f"torchrun option {opts.torchrun_args[0]} has no meaning with a "
                             f"launch command (give it in the command)")
    elif opts.launcher == Launcher.PYTHON:
        other = [t for t in opts.torchrun_args if t not in ("-m", "--module")]
        if other:
            raise UsageError(f"torchrun option {other[0]} has no meaning with --launcher "
                             f"python (the script starts its own workers)")
    else:
        nproc = str(opts.torchrun.values.nproc_per_node or "1")
        if not (nproc.isdigit() and int(nproc) > 0) and nproc not in ("auto", "cpu", "gpu",
                                                                        "xpu"):
            raise UsageError(f"--nproc-per-node must be a number of processes or auto, cpu, "
                             f"gpu; not {nproc!r}")
