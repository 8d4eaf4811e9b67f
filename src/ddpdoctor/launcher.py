"""Starts the user's job with every rank instrumented, watches it, and stops it on a hang.

The command is torchrun (``python -m torch.distributed.run``) or, for scripts that start their
own workers with ``mp.spawn``, plain ``python``. Injection is a ``sitecustomize`` directory put
first on ``PYTHONPATH``, so every Python process of the job, however started, loads the
runtime. While the job runs the launcher tails the traces; when the hang rule fires it asks
every rank for its stacks, waits briefly for the answers, then ends every process of the job.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ddpdoctor import proctree
from ddpdoctor.progress import JobProgress, hang_request_path
from ddpdoctor.runtime import env as rank_env
from ddpdoctor.runtime.watchdog import ack_file

INJECT_DIR = str(Path(__file__).resolve().parent / "runtime" / "inject")
DEFAULT_LOG_ROOT = "ddpdoctor-logs"


class UsageError(Exception):
    """Bad input from the user; the message is one line, shown without a traceback."""


@dataclass
class RunOptions:
    """Everything ``ddpdoctor run`` was asked to do."""

    script: str
    args: list[str] = field(default_factory=list)
    module: bool = False
    launcher: str = "torchrun"
    nproc_per_node: int | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int | None = None
    logdir: str | None = None
    backend: str | None = None
    hang_timeout: float = 30.0
    stuck_timeout: float | None = 600.0  # a rank idle at one place outside collectives
    grace: float = 5.0
    status_every: float = 10.0
    cpu: bool = False  # run a CUDA/NCCL script on the CPU with gloo (runtime/cpu_mode.py)
    max_steps: int | None = None  # stop every rank at the start of DDP iteration N+1
    expect_schedule: str | None = None  # schedule file the run must match (schedule.py)
    max_trace_mb: float | None = None  # per-rank trace size after which only what breaks
    # the rank's pattern is written (runtime/trace_cap.py; CLI --max-trace-mb)
    reports: bool = False  # --junit or --markdown: the run is a CI check

    @property
    def ci_mode(self) -> bool:
        """A CI check (--cpu, --max-steps, a CI report, or $CI set): nothing tested fails."""
        ci = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
        return self.cpu or self.max_steps is not None or self.reports or ci


@dataclass
class JobResult:
    """How the job ended."""

    exit_code: int
    logdir: str
    duration: float
    hang: bool = False
    stop: str | None = None  # why the job was stopped: hang, deadlock or stuck (progress.py)
    reason: str = ""  # the same, in words
    interrupted: bool = False
    killed: list[int] = field(default_factory=list)
    acks: list[int] = field(default_factory=list)


def check_script(opts: RunOptions) -> None:
    """Refuse a missing or syntactically broken script before starting anything."""
    if opts.module:
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


def default_nproc() -> int:
    """Visible GPUs (without importing torch), else 2."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
        if count:
            return count
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        count = 0
    return count or 2


def nproc(opts: RunOptions) -> int:
    """Processes per node: as asked, else 2 in CPU mode, else the visible GPUs (or 2)."""
    if opts.nproc_per_node:
        return opts.nproc_per_node
    return 2 if opts.cpu else default_nproc()


def stop_timeout(opts: RunOptions) -> float:
    """How long a rank stopped by ``--max-steps`` waits for the others: half the hang timeout.

    A peer that does not come is blocked elsewhere (the ranks diverged); once the stopped rank
    has left, that peer's collective fails with a lost connection well before the hang
    timeout, and the job ends as a divergence (exit 1) within seconds rather than as a hang.
    """
    return opts.hang_timeout / 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_logdir(requested: str | None) -> Path:
    """Create the log folder (readable by the user only)."""
    if requested:
        path = Path(requested)
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = Path(DEFAULT_LOG_ROOT) / f"{stamp}-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot use log folder {path}: {exc.strerror or exc}") from None
    if any(path.glob("rank-*.jsonl")):
        raise UsageError(f"log folder {path} already holds traces; give an empty or new folder")
    return path.resolve()


def build_command(opts: RunOptions) -> list[str]:
    """The job's command line: torchrun with its options, or plain python."""
    target = ["-m", opts.script] if opts.module else [opts.script]
    if opts.launcher == "python":
        return [sys.executable, *target, *opts.args]
    cmd = [sys.executable, "-m", "torch.distributed.run",
           "--nproc-per-node", str(nproc(opts))]
    for flag, value in (("--nnodes", opts.nnodes), ("--node-rank", opts.node_rank),
                        ("--rdzv-backend", opts.rdzv_backend),
                        ("--rdzv-endpoint", opts.rdzv_endpoint),
                        ("--master-addr", opts.master_addr), ("--master-port", opts.master_port),
                        ("--max-restarts", opts.max_restarts)):
        if value is not None:
            cmd += [flag, str(value)]
    if opts.master_port is None and opts.rdzv_endpoint is None and not opts.nnodes:
        cmd += ["--master-port", str(free_port())]
    if opts.module:
        cmd.append("--module")
        target = [opts.script]
    return cmd + target + list(opts.args)


def build_env(opts: RunOptions, logdir: Path, run_id: str) -> dict[str, str]:
    """The job's environment: the user's plus the injection and the ranks' configuration."""
    environ = dict(os.environ)
    path = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = INJECT_DIR + (os.pathsep + path if path else "")
    environ[rank_env.LOGDIR] = str(logdir)
    environ[rank_env.RUN_ID] = run_id
    environ[rank_env.LAUNCHER] = opts.launcher
    environ[rank_env.LAUNCHER_PID] = str(os.getpid())
    if opts.backend:
        environ[rank_env.BACKEND] = opts.backend
    if opts.cpu:
        environ[rank_env.CPU] = "1"
        environ[rank_env.BACKEND] = "gloo"
        environ[rank_env.CPU_DEVICES] = str(nproc(opts))
        environ["CUDA_VISIBLE_DEVICES"] = ""  # torch itself must not find a GPU either
    if opts.max_trace_mb is not None:
        environ[rank_env.MAX_TRACE_MB] = f"{opts.max_trace_mb:g}"
    if opts.max_steps is not None:
        environ[rank_env.MAX_STEPS] = str(opts.max_steps)
        environ[rank_env.STOP_TIMEOUT] = f"{stop_timeout(opts):g}"
    if opts.launcher == "python":
        environ.setdefault("MASTER_ADDR", opts.master_addr or "127.0.0.1")
        if opts.master_port is not None:
            environ["MASTER_PORT"] = str(opts.master_port)
        environ.setdefault("MASTER_PORT", str(free_port()))
    return environ


class _Signals:
    """Turns SIGINT/SIGTERM of ddpdoctor into a flag the watch loop acts on."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = signum

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run_job(opts: RunOptions, logdir: Path,
            on_status: Callable[[JobProgress, str], None] | None = None) -> JobResult:
    """Run the job to its end, or stop it on a hang or a signal; never leaves a process."""
    run_id = secrets.token_hex(8)
    cmd = build_command(opts)
    environ = build_env(opts, logdir, run_id)
    proctree.become_subreaper()
    progress = JobProgress(str(logdir))
    started = time.time()
    result = JobResult(exit_code=0, logdir=str(logdir), duration=0.0)
    with _Signals() as signals:
        try:
            proc = subprocess.Popen(cmd, env=environ)
        except OSError as exc:
            raise UsageError(f"cannot start {cmd[0]}: {exc.strerror}") from None
        next_status = started + opts.status_every
        while proc.poll() is None:
            time.sleep(0.2)
            now = time.time()
            progress.poll(now)
            if signals.received is not None:
                result.interrupted = True
                break
            verdict = progress.verdict(opts.hang_timeout, opts.stuck_timeout, now)
            if verdict is not None:
                result.hang, result.stop, result.reason = True, verdict, progress.reason
                if on_status:
                    on_status(progress, "hang")
                result.acks = _collect_evidence(logdir, progress, proc)
                break
            if on_status and now >= next_status:
                on_status(progress, "status")
                next_status = now + opts.status_every
        if proc.poll() is None:
            result.killed = _stop(proc, opts)
        try:
            proc.wait(timeout=opts.grace + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Workers that outlived their parent (re-parented to us): end them too.
        leftovers = proctree.descendants(os.getpid())
        if leftovers:
            result.killed += proctree.terminate(leftovers, 1.0)
        proctree.reap()
    progress.poll()
    result.exit_code = proc.returncode
    result.duration = time.time() - started
    write_job_record(logdir, result)
    return result


JOB_FILE = "job.json"


def write_job_record(logdir: Path, result: JobResult) -> None:
    """What only the launcher knows, for ``diff`` to read later: why it stopped the job."""
    record = {"stopped": result.stop, "reason": result.reason,
              "interrupted": result.interrupted, "exit_code": result.exit_code}
    try:
        with open(os.open(logdir / JOB_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w", encoding="utf-8") as fh:
            json.dump(record, fh)
    except OSError:
        pass


def _stop(proc: subprocess.Popen, opts: RunOptions) -> list[int]:
    """End the job: the ranks get SIGTERM, then SIGKILL after the grace period.

    torchrun's agent is ours, not the user's: it is killed outright, so that it does not print
    its own traceback over the diagnosis; its workers live in their own sessions and are
    re-parented to us, found through the snapshot taken first.
    """
    workers = proctree.descendants(proc.pid)
    if opts.launcher == "torchrun":
        proctree.signal_all([proc.pid], signal.SIGKILL)
        return proctree.terminate(workers, opts.grace, exclude=proc.pid)
    return proctree.terminate([proc.pid, *workers], opts.grace, exclude=proc.pid)


def _collect_evidence(logdir: Path, progress: JobProgress, proc: subprocess.Popen,
                      wait: float = 5.0) -> list[int]:
    """Ask every rank for its stacks and wait for their answers; returns the ranks that did."""
    with open(os.open(hang_request_path(str(logdir)), os.O_WRONLY | os.O_CREAT, 0o600), "w") as fh:
        fh.write(f'{{"t": {time.time()}}}\n')
    expected = [r for r, p in progress.ranks.items() if p.status == "running"]
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        acked = [r for r in expected if (logdir / ack_file(r)).exists()]
        if len(acked) == len(expected) or proc.poll() is not None:
            return acked
        time.sleep(0.05)
    return [r for r in expected if (logdir / ack_file(r)).exists()]
