"""The job's command line, its environment and its log folder.

The command is torchrun (its entry point, as the ``torchrun`` script runs it, with the user's
torchrun options verbatim), or, for scripts that start their own workers with ``mp.spawn``,
plain ``python``, or the user's own launch command as given (``ddpdoctor run -- accelerate
launch ...``).
Injection is a ``sitecustomize`` directory put first on ``PYTHONPATH``, so every Python process
of the job, however started, loads the runtime.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import socket
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.options import RunOptions
from ddpdoctor.runtime import env as rank_env
from ddpdoctor.runtime import torch_internals
from ddpdoctor.runtime.env import Launcher
from ddpdoctor.trace import schema

INJECT_DIR = str(Path(__file__).resolve().parents[1] / "runtime" / "inject")
DEFAULT_LOG_ROOT = "ddpdoctor-logs"


def default_nproc() -> int:
    """Visible GPUs (without importing torch), else 2."""
    return _visible_gpus() or 2


CPU_MODE_NPROC = 2  # ranks per node of a CPU-mode run unless a number is given
_GPU_WORDS = re.compile(r"""["']nccl["']|\.cuda\(|["']cuda|cuda\.device_count|device_ids\s*=""")


def needs_cpu_mode(opts: RunOptions) -> bool:
    """Whether the script asks for CUDA or NCCL on a machine without a GPU, run without
    ``--cpu``: it will fail, and the hint is worth saying before the ranks' tracebacks."""
    if opts.cpu or _visible_gpus() > 0 or opts.launcher == Launcher.COMMAND:
        return False
    try:
        with open(opts.script, encoding="utf-8", errors="replace") as fh:
            return bool(_GPU_WORDS.search(fh.read(1 << 20)))
    except OSError:
        return False


def _visible_gpus() -> int:
    """GPUs this process may use, without importing torch (CUDA stops at the first invalid
    entry of CUDA_VISIBLE_DEVICES: "" or "-1" hides every GPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for device in visible.split(","):
            if not device.strip() or device.strip() == "-1":
                break
            count += 1
        return count
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0


def check_flight_recorder(opts: RunOptions) -> None:
    """Refuse ``--flight-recorder`` where it would keep nothing: gloo groups (``--cpu``,
    ``--backend gloo``, no GPU) on a torch whose gloo writes no flight-recorder entries.
    torch's version is read from its installed metadata: the launcher does not import it."""
    if not opts.flight_recorder:
        return
    gloo = opts.cpu or (opts.backend or "").lower() == "gloo" or _visible_gpus() == 0
    try:
        from importlib.metadata import version

        installed = version("torch")
    except Exception:  # noqa: BLE001 - no metadata: the ranks find out themselves
        return
    found = torch_internals.minor(installed)
    if gloo and found is not None and found < torch_internals.GLOO_FLIGHT_RECORDER:
        low = ".".join(map(str, torch_internals.GLOO_FLIGHT_RECORDER))
        raise UsageError(f"--flight-recorder keeps nothing of gloo groups on torch "
                         f"{installed} (their flight recorder starts at {low}): run "
                         f"without it (ddpdoctor's own recorder) or on NCCL")


def nproc(opts: RunOptions) -> int:
    """Processes per node: as asked (a number; ``cpu``: one per core), else 2 in CPU mode,
    else the visible GPUs (or 2)."""
    if opts.launcher == Launcher.TORCHRUN and (opts.torchrun.given("nproc_per_node")
                                        or os.environ.get("PET_NPROC_PER_NODE")):
        asked = opts.torchrun.nproc_per_node
        if asked:
            return asked
        if opts.torchrun.nproc_word == "cpu":
            return os.cpu_count() or 1
    return CPU_MODE_NPROC if opts.cpu else default_nproc()


def lone_rank(opts: RunOptions) -> bool:
    """Whether ddpdoctor itself chose the processes per node and chose one, for a one-node job:
    one visible GPU. Such a world has no two ranks to compare."""
    if opts.launcher != Launcher.TORCHRUN or opts.torchrun.nnodes_max > 1:
        return False
    if opts.torchrun.given("nproc_per_node") or os.environ.get("PET_NPROC_PER_NODE"):
        return False
    return nproc(opts) == 1


def gpu_count_word(opts: RunOptions) -> str | None:
    """``gpu``, ``auto`` or ``xpu`` given as torchrun's processes per node in CPU mode: words
    that count accelerators, of which CPU mode has none (torchrun would stop with "Cuda is
    not available", or start one rank per core). Such a run gets :data:`CPU_MODE_NPROC`."""
    if not opts.cpu or opts.launcher != Launcher.TORCHRUN:
        return None
    word = opts.torchrun.nproc_word
    return word if word in ("gpu", "auto", "xpu") else None


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
    _refuse_taken(path)
    try:
        existed = path.is_dir()
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not existed:
            os.chmod(path, 0o700)  # the umask may have widened it; a user's folder keeps its mode
        # Can we write there? A file of our own, with a name nobody else uses.
        fd, probe = tempfile.mkstemp(prefix=".ddpdoctor-write-test-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"cannot use log folder {path.absolute()}: {exc.strerror or exc} "
                         f"(choose another with --logdir)") from None
    _lock(path)
    _refuse_taken(path)  # another run started writing meanwhile
    return path.resolve()


def _refuse_taken(path: Path) -> None:
    """Refuse a folder that holds a file under a name ddpdoctor writes: a run never
    overwrites, nor reads as its own, a file it did not write (a user's job.json, a .cut)."""
    if not path.is_dir():
        return
    taken = sorted({p.name for pattern in schema.OWN_FILES for p in path.glob(pattern)})
    if any(name.startswith("rank-") and name.endswith(".jsonl") for name in taken):
        raise UsageError(f"log folder {path} already holds traces; give an empty or new folder")
    if taken:
        shown = ", ".join(taken[:3]) + (", ..." if len(taken) > 3 else "")
        raise UsageError(f"log folder {path} holds files named as ddpdoctor's own ({shown}), "
                         f"which a run would overwrite or misread; give an empty or new folder")


_locks: list[int] = []  # descriptors held for the life of this process


def _lock(path: Path) -> None:
    """One run per log folder: an exclusive lock, held until ddpdoctor exits (however)."""
    fd = os.open(path / schema.LOCK_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(f"log folder {path} is in use by another ddpdoctor run") from None
    _locks.append(fd)


def run_id(opts: RunOptions) -> str:
    """The id every trace of the run carries: shared by the nodes of a multi-node job."""
    shared = opts.torchrun.run_id() if opts.launcher == Launcher.TORCHRUN else None
    return shared or secrets.token_hex(8)


def build_command(opts: RunOptions) -> list[str]:
    """The job's command line: torchrun with the user's options (and ddpdoctor's defaults for
    the processes per node and a free port), or plain python."""
    if opts.launcher == Launcher.COMMAND:
        return [opts.script, *opts.args]
    if opts.launcher == Launcher.PYTHON:
        target = ["-m", opts.script] if opts.module else [opts.script]
        return [sys.executable, *target, *opts.args]
    tr = opts.torchrun
    single = tr.nnodes_max <= 1
    entry = torch_internals.TORCHRUN_ENTRY_QUICK_EXIT if single else torch_internals.TORCHRUN_ENTRY
    cmd = [sys.executable, "-c", entry]
    if not (tr.given("nproc_per_node") or os.environ.get("PET_NPROC_PER_NODE")):
        cmd += ["--nproc-per-node", str(nproc(opts))]
    if single and not (tr.given("master_port") or tr.given("rdzv_endpoint")
                       or tr.values.standalone):
        cmd += ["--master-port", str(free_port())]
    cmd += list(opts.torchrun_args)
    if gpu_count_word(opts):  # torchrun keeps the last value given
        cmd += ["--nproc-per-node", str(CPU_MODE_NPROC)]
    return cmd + [opts.script, *opts.args]


def build_env(opts: RunOptions, logdir: Path, run: str) -> dict[str, str]:
    """The job's environment: the user's plus the injection and the ranks' configuration."""
    environ = dict(os.environ)
    path = environ.get("PYTHONPATH")
    environ["PYTHONPATH"] = INJECT_DIR + (os.pathsep + path if path else "")
    environ[rank_env.LOGDIR] = str(logdir)
    environ[rank_env.RUN_ID] = run
    environ[rank_env.LAUNCHER] = opts.launcher
    environ[rank_env.LAUNCHER_PID] = str(os.getpid())
    if opts.backend:
        environ[rank_env.BACKEND] = opts.backend
    if opts.flight_recorder:
        environ[rank_env.FLIGHT_RECORDER] = "1"
    if opts.record_nccl:
        environ[rank_env.RECORD_NCCL] = "1"
    if opts.cpu:
        environ[rank_env.CPU] = "1"
        environ[rank_env.BACKEND] = "gloo"
        environ[rank_env.CPU_DEVICES] = str(nproc(opts))
        environ["CUDA_VISIBLE_DEVICES"] = ""  # torch itself must not find a GPU either
    if opts.max_trace_mb is not None:
        environ[rank_env.MAX_TRACE_MB] = f"{opts.max_trace_mb:g}"
    if opts.max_steps is not None:
        environ[rank_env.MAX_STEPS] = str(opts.max_steps)
    if opts.epoch_steps is not None:
        environ[rank_env.EPOCH_STEPS] = str(opts.epoch_steps)
    if opts.max_steps is not None or opts.epoch_steps is not None:
        environ[rank_env.STOP_TIMEOUT] = f"{stop_timeout(opts):g}"
    if opts.launcher == Launcher.PYTHON:
        environ.setdefault("MASTER_ADDR", "127.0.0.1")
        environ.setdefault("MASTER_PORT", str(free_port()))
    return environ
