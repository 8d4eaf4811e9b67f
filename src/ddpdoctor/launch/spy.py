"""Reading a running rank from outside: its stacks with py-spy, its counters from ``/proc``,
and the evidence it left (its stderr where that is a file, torchelastic's error file, a
flight-recorder dump).

py-spy reads a process's memory with ptrace permissions; by default here it does not pause
the rank (``--nonblocking``). Only a rank that sits still inside a backward is read once more
with its native frames, which tell DDP's reducer waiting for its gradient all-reduce from
autograd computing; that read pauses the rank while py-spy unwinds it
(:data:`NATIVE_PAUSE_NOTE`); a rank computing its backward is not paused. Every rank is
read in parallel, a few times apart (:func:`take`), so a rank that moves is told from one
that waits. Nothing here writes to, signals or slows a rank beyond those reads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ddpdoctor.analysis.hang_rules import BUSY_CPU
from ddpdoctor.analysis.stacks import RankView, view
from ddpdoctor.launch.discover import FoundJob, RankProcess
from ddpdoctor.launch.proctree import alive
from ddpdoctor.runtime.source_capture import capture
from ddpdoctor.trace.ddp_sites import BACKWARD, SPAWN_WRAP
from ddpdoctor.trace.flight_recorder import looks_like_dump
from ddpdoctor.trace.job_logs import read_tail
from ddpdoctor.trace.model import is_internal_file
from ddpdoctor.trace.rank_text import rank_list
from ddpdoctor.trace.redact import mask_args
from ddpdoctor.trace.snapshot import Frame, RankSnapshot, Sample, Snapshot, Thread

PY_SPY_TIMEOUT = 20.0  # seconds one py-spy read may take (native symbols of libtorch: ~1.5 s)
STDERR_TAIL = 16 * 1024
ERROR_FILE_MAX = 64 * 1024
FR_MAX = 256 * 1024 * 1024
FR_DEFAULT_PREFIX = "/tmp/nccl_trace_rank_"
FR_FOLDER = "flight-recorder"  # the copies of the dumps the job left, beside attach.json
NATIVE_PAUSE_NOTE = ("read once more with native frames (inside a backward), which paused it "
                     "while py-spy unwound its stack")
_PLAIN_VALUE = re.compile(r"^(-?\d+(\.\d+)?|True|False|None)$")
_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class SpyMissing(RuntimeError):
    """py-spy is not installed where ddpdoctor can run it."""


def py_spy() -> str:
    """The py-spy executable: beside this Python's (installed with ddpdoctor), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("py-spy")
    if found is None:
        raise SpyMissing("py-spy is not installed: pip install py-spy (ddpdoctor's own "
                         "dependency; reinstall ddpdoctor with pip)")
    return found


def counters(pid: int) -> tuple[float | None, int | None]:
    """CPU seconds (user + system, every thread) and bytes read and written so far."""
    cpu: float | None = None
    io: int | None = None
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, IndexError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/io", "rb") as fh:
            values = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
        io = int(values[b"rchar"]) + int(values[b"wchar"])
    except (OSError, KeyError, ValueError):
        pass
    return cpu, io


def _error_text(stderr: str) -> str:
    """py-spy's error in one line: 'Failed to ...: Permission denied (os error 13)'."""
    lines = [ln.strip() for ln in stderr.split("Stack backtrace:")[0].splitlines() if ln.strip()]
    if not lines:
        return "py-spy failed without a message"
    head = lines[0].removeprefix("Error: ").rstrip(".")
    causes = [re.sub(r"^\d+:\s*", "", ln) for ln in lines[1:] if re.match(r"^\d+:\s", ln)]
    return head + (f": {causes[-1]}" if causes else "")


def _frame(raw: dict) -> Frame:
    native = raw.get("module") is not None
    file = str(raw.get("filename") or "?")
    line = int(raw.get("line") or 0)
    local = {} if native else {
        str(v.get("name")): str(v.get("repr")) for v in raw.get("locals") or []
        if isinstance(v, dict) and _PLAIN_VALUE.match(str(v.get("repr", "")))}
    frame = Frame(function=str(raw.get("name") or "?"), file=file, line=line, native=native,
                  locals=local)
    if not native and line > 0 and not is_internal_file(file):
        source = capture(file, line)
        frame.text = source.get("text", "")
        frame.indent = source.get("indent")
        frame.blocks = source.get("blocks", [])
    return frame


def _threads(pid: int, dump: list) -> list[Thread]:
    threads = []
    for raw in dump:
        if not isinstance(raw, dict):
            continue
        tid = int(raw.get("os_thread_id") or 0)
        threads.append(Thread(name=str(raw.get("thread_name") or ""), tid=tid,
                              main=tid == pid or raw.get("thread_name") == "MainThread",
                              frames=[_frame(f) for f in raw.get("frames") or []
                                      if isinstance(f, dict)]))
    return threads


def _start(exe: str, pid: int, native: bool) -> subprocess.Popen:
    args = [exe, "dump", "--pid", str(pid), "--json", "--locals"]
    args += ["--native"] if native else ["--nonblocking"]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def _finish(proc: subprocess.Popen, pid: int, t: float) -> Sample:
    try:
        out, err = proc.communicate(timeout=PY_SPY_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Sample(t=t, cpu=None, io=None, error=f"py-spy took over {PY_SPY_TIMEOUT:g}s")
    cpu, io = counters(pid)
    if proc.returncode != 0:
        return Sample(t=t, cpu=cpu, io=io, error=_error_text(err.decode("utf-8", "replace")))
    try:
        dump = json.loads(out)
    except json.JSONDecodeError:
        return Sample(t=t, cpu=cpu, io=io, error="py-spy printed no readable stack")
    return Sample(t=t, cpu=cpu, io=io, threads=_threads(pid, dump if isinstance(dump, list)
                                                         else []))


def sample_all(exe: str, pids: list[int],
               native: frozenset[int] | set[int] = frozenset()) -> dict[int, Sample]:
    """One sample of every pid, read in parallel (``native``: pids read with native frames).
    A read that failed is tried once more: without pausing a busy rank, py-spy may find a
    frame freed under it ("Bad address")."""
    t = time.time()
    started = {pid: _start(exe, pid, pid in native) for pid in pids}
    taken = {pid: _finish(proc, pid, t) for pid, proc in started.items()}
    again = [pid for pid, s in taken.items() if s.error and alive(pid)]
    retried = {pid: _start(exe, pid, pid in native) for pid in again}
    taken.update({pid: _finish(proc, pid, t) for pid, proc in retried.items()})
    return taken


def _in_backward(sample: Sample) -> bool:
    main = sample.main
    return main is not None and any(f.function == BACKWARD[1] for f in main.frames[:4])


def _still(v: RankView) -> bool:
    """At one place through every read, and not computing: the native frames tell whether
    it waits (the hang rules' threshold: a rank with a collective pending computes above it)."""
    return not v.moved and (v.cpu_share is None or v.cpu_share < BUSY_CPU)


def _spawn_index(sample: Sample) -> int | None:
    main = sample.main
    for f in (main.frames if main else []):
        if f.file.replace("\\", "/").endswith(SPAWN_WRAP[0]) and f.function == SPAWN_WRAP[1]:
            value = f.locals.get("i", "")
            return int(value) if value.isdigit() else None
    return None


def stderr_path(pid: int) -> str | None:
    """The regular file the process's stderr goes to, if it goes to one."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    return target if os.path.isfile(target) else None


def _error_file(proc: RankProcess, siblings: list[RankProcess], rank: int) -> str:
    """torchelastic's error file of ``rank``: its own path, or for a rank without a process
    its sibling's path with the local rank's folder changed (``.../attempt_0/<local>/``)."""
    path = proc.env.get("TORCHELASTIC_ERROR_FILE", "") if proc.pid else ""
    if not path:
        for s in siblings:
            local = s.number("LOCAL_RANK")
            other = s.env.get("TORCHELASTIC_ERROR_FILE", "")
            if other and local is not None and s.rank is not None:
                parent = Path(other).parent
                if parent.name == str(local):
                    path = str(parent.with_name(str(local + rank - s.rank)) / Path(other).name)
                    break
    return read_tail(path, ERROR_FILE_MAX) if path and os.path.isfile(path) else ""


def _flight_recorder(proc: RankProcess, rank: int, out: Path) -> str:
    """Copy the rank's flight-recorder dump, if the job left one, into ``out/``
    :data:`FR_FOLDER` under its own name (``ddpdoctor diff`` of that folder aligns the dumps by
    sequence number); returns the copy's path relative to ``out``."""
    prefix = proc.env.get("TORCH_FR_DUMP_TEMP_FILE") or \
        proc.env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or FR_DEFAULT_PREFIX
    source = Path(f"{prefix}{rank}")
    try:
        if not source.is_file() or source.is_symlink() or source.stat().st_size > FR_MAX or \
                not looks_like_dump(source):
            return ""
        (out / FR_FOLDER).mkdir(exist_ok=True, mode=0o700)
        shutil.copyfile(source, out / FR_FOLDER / source.name)
        return f"{FR_FOLDER}/{source.name}"
    except OSError:
        return ""


def take(job: FoundJob, out: Path, samples: int = 3, interval: float = 1.0,
         native: bool | None = None,
         progress: Callable[[str], None] = lambda _s: None) -> Snapshot:
    """Sample every rank of ``job`` ``samples`` times ``interval`` seconds apart; with
    ``native`` None, read the ranks found still inside a backward once more with native
    frames (True: every rank; False: none). Writes nothing but flight-recorder copies into
    ``out``."""
    exe = py_spy()
    pids = [r.pid for r in job.ranks]
    taken: dict[int, list[Sample]] = {pid: [] for pid in pids}
    for i in range(max(1, samples)):
        if i:
            time.sleep(interval)
        progress(f"reading {len(pids)} rank(s): sample {i + 1} of {samples}")
        for pid, s in sample_all(exe, pids).items():
            taken[pid].append(s)
    wanted = set(pids) if native else set() if native is False else {
        pid for pid, ss in taken.items() if ss and _in_backward(ss[-1])
        and _still(view(RankSnapshot(rank=0, pid=pid, samples=ss)))}
    if wanted:
        progress(f"reading {len(wanted)} rank(s) with native frames")
        for pid, s in sample_all(exe, sorted(wanted), native=wanted).items():
            if not s.error:
                taken[pid].append(s)
    out.mkdir(parents=True, exist_ok=True)
    ranks: list[RankSnapshot] = []
    unnamed: list[int] = []
    host = socket.gethostname()
    for proc in job.ranks:
        ss = taken[proc.pid]
        rank = proc.rank
        if rank is None:
            rank = next((i for i in map(_spawn_index, ss) if i is not None), None)
        if rank is None:
            unnamed.append(proc.pid)
            continue
        err = stderr_path(proc.pid)
        note = next((s.error for s in ss if s.error), "")
        ranks.append(RankSnapshot(
            rank=rank, pid=proc.pid, host=host, samples=ss,
            stderr_tail=read_tail(err, STDERR_TAIL) if err else "",
            error_file=_error_file(proc, job.ranks, rank),
            flight_recorder=_flight_recorder(proc, rank, out), note=note))
    ranks.sort(key=lambda r: r.rank)
    node = job.node_ranks
    paused = sorted(r.rank for r in ranks if r.pid in wanted)
    notes = [f"{rank_list(paused)}: {NATIVE_PAUSE_NOTE}"] if paused else []
    if unnamed:
        notes.append(f"spawned process(es) {', '.join(map(str, unnamed))}: no rank in their "
                     f"stack (torch's spawn wrapper not found), left out")
    dumped = sorted(r.rank for r in ranks if r.flight_recorder)
    if dumped:
        notes.append(f"the flight-recorder dumps the job left for {rank_list(dumped)} are "
                     f"copied into {out / FR_FOLDER}: `ddpdoctor diff {out / FR_FOLDER}` "
                     f"aligns them by sequence number")
    return Snapshot(host=host, t=time.time(), kind=job.kind, world_size=job.world_size,
                    ranks=ranks + _absent(job, node, {r.rank for r in ranks}, out),
                    node_ranks=node, launcher=" ".join(mask_args(job.launcher_cmdline)),
                    notes=notes)


def _absent(job: FoundJob, node: list[int] | None, seen: set[int],
            out: Path) -> list[RankSnapshot]:
    """Ranks this node should hold but has no process of: what they left."""
    if node is None or not job.ranks:
        return []
    some = job.ranks[0]
    gone = []
    for rank in node:
        if rank in seen:
            continue
        ghost = RankProcess(pid=0, ppid=0, rank=rank, cmdline=[], env=some.env)
        gone.append(RankSnapshot(rank=rank, pid=None, host=socket.gethostname(),
                                 error_file=_error_file(ghost, job.ranks, rank),
                                 flight_recorder=_flight_recorder(ghost, rank, out),
                                 note="no process: it has exited"))
    return gone
