"""In-rank watchdog: says what a quiet rank is doing, and answers the launcher's hang request.

A daemon thread in every rank wakes every :data:`POLL_SECONDS` while the rank is quiet and
idle, every :data:`WORKING_POLL_SECONDS` while it is quiet but its main thread works (importing
torch, building the model, evaluating: no collective, but the CPU in use), and no sooner than
the moment it would turn quiet while it issues collectives: a wake-up costs a busy rank far
more CPU than the check it makes (the main thread hands the GIL over and back: up to ~0.3
CPU-s of a rank's start-up at ten wake-ups a second, bench/RESULTS.md, session 49), and a rank
that works is no hang to answer for in a tenth of a second. The same wake-ups make the trace
writer's looks (:meth:`~ddpdoctor.runtime.writer.TraceWriter.look`, due every ``interval``
while the rank is quiet, at the wake-up that finds it quiet, and every
``writer.BUSY_LOOK_SECONDS`` while it issues collectives, see :meth:`Watchdog._look`): a
thread of its own would wake twice a second more, at ~1-2 ms of CPU each on a busy 2-core VM
(bench/RESULTS.md, session 38). While the rank issues no
collective for :data:`QUIET_SECONDS`, it writes an ``activity`` record every
:data:`ACTIVITY_SECONDS`: where the main thread is (its innermost frames of user code) and how
much CPU it has used. That is how the launcher tells a rank *busy* outside collectives (a
checkpoint save, a data download, rank-0 evaluation) from one *waiting* in a collective, and a
rank stuck in user code (same place, no CPU) from one that works.

When the launcher decides the job hangs it creates ``<logdir>/hang-request.json``. The main
thread is blocked inside the backend with the GIL released, so this thread can read every
thread's Python stack with ``sys._current_frames()`` (no ptrace, no py-spy). It records the
pending collectives and the stacks as a ``hang`` record, flushes the trace and acknowledges
with ``<logdir>/hang-ack-<rank>``. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

from ddpdoctor.runtime import source_capture, stderr_tail, user_code
from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime import writer as writer_mod
from ddpdoctor.runtime.thread_frames import current_frames
from ddpdoctor.trace import handshake, schema
from ddpdoctor.trace.basics import call_name

POLL_SECONDS = 0.1
QUIET_SECONDS = 0.3  # no collective issued for this long: the rank may be outside collectives
ACTIVITY_SECONDS = 1.0  # then an activity record this often
WORKING_POLL_SECONDS = QUIET_SECONDS  # quiet, and its main thread works: wake-ups this far apart
WORKING_CPU_RATE = 0.5  # main-thread CPU per second since the last reading that counts as work
USER_FRAMES = 3


def thread_stacks() -> list[dict]:
    """Python stacks of all threads of this process, outermost frame first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in current_frames().items():
        if names.get(ident, "").startswith("ddpdoctor-"):
            continue
        frames = [{"file": f.filename, "line": f.lineno, "function": f.name,
                   "text": (f.line or "")[:240]} for f in traceback.extract_stack(frame)]
        out.append({"thread": names.get(ident, str(ident)), "main": ident == main,
                    "frames": frames})
    out.sort(key=lambda s: not s["main"])
    return out


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_TREE = 64  # processes of a rank's tree that are looked at (DataLoader workers, helpers)


def _io_of(pid: str) -> int:
    with open(f"/proc/{pid}/io", "rb") as fh:
        fields = dict(line.split(b":", 1) for line in fh.read().splitlines() if b":" in line)
    return int(fields[b"rchar"]) + int(fields[b"wchar"])


def _cpu_of(pid: str) -> float:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def _children(pid: str) -> list[str]:
    out: list[str] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out.extend(fh.read().decode().split())
    except OSError:
        pass
    return out


def tree_usage() -> tuple[float, int] | None:
    """CPU seconds and bytes read and written (files and sockets: ``rchar`` + ``wchar``) of
    this process and the processes below it (a download in a subprocess, DataLoader workers),
    Linux; None where ``/proc`` does not tell. Every thread counts, ddpdoctor's own too."""
    try:
        cpu, io = _cpu_of("self"), _io_of("self")
    except (OSError, KeyError, ValueError, IndexError):
        return None
    todo, seen = _children(str(os.getpid())), 0
    helper = str(stderr_tail.helper_pid)
    while todo and seen < MAX_TREE:
        pid = todo.pop()
        if pid == helper:  # ddpdoctor's copier of the rank's stderr, not the user's work
            continue
        seen += 1
        try:
            cpu += _cpu_of(pid)
            io += _io_of(pid)
        except (OSError, KeyError, ValueError, IndexError):
            continue  # it ended meanwhile, or is not ours to read
        todo.extend(_children(pid))
    return cpu, io


def ended_children() -> list[dict]:
    """The worker processes this rank started with ``multiprocessing`` that have ended with a
    non-zero exit code (a rank may be blocked waiting for what one of them never sent)."""
    process = sys.modules.get("multiprocessing.process")
    out = []
    for child in list(getattr(process, "_children", None) or ())[:64]:
        try:
            code = child.exitcode  # polls (WNOHANG); the main thread's join sees it as well
        except Exception:
            continue
        if code:
            out.append({"name": str(child.name)[:200], "pid": child.pid, "exitcode": code})
    return out


def main_thread_cpu() -> float | None:
    """CPU seconds the main thread has used (Linux); None where the clock is unavailable."""
    try:
        clock = time.pthread_getcpuclockid(threading.main_thread().ident or 0)
        return round(time.clock_gettime(clock), 3)
    except (AttributeError, OSError, TypeError, ValueError):
        return None


_COLLECTIVE_FILES = (os.sep.join(("torch", "distributed", "")),
                     os.sep.join(("torch", "autograd", "graph.py")))
_IMPORTING = "<frozen importlib."  # the import system's frames (importlib._bootstrap, ...)


def in_collective(frame: Any) -> bool:
    """Whether the main thread is inside torch.distributed (a collective, a barrier, a DDP
    call) or a backward pass: with no CPU use, a rank whose backend ddpdoctor does not record
    is then waiting in a collective. An import in progress is no call: torch.distributed's
    modules running their top-level code while ``import torch`` loads them, or any module
    loading inside a torch.distributed function."""
    while frame is not None:
        code = frame.f_code
        name = code.co_filename
        if name.startswith(_IMPORTING):
            return False
        if any(part in name for part in _COLLECTIVE_FILES):
            return code.co_name != "<module>"
        frame = frame.f_back
    return False


class Watchdog:
    """Writes activity records while the rank is quiet, and answers a hang request."""

    def __init__(self, recorder: Any, logdir: str, rank: int) -> None:
        self._recorder = recorder
        self._logdir = logdir
        self._rank = rank
        self._next_activity = 0.0
        self._quiet_since = 0.0  # the quiet spell the readings below belong to
        # (time, main-thread CPU): the readings of the last second (see _activity)
        self._cpu: deque[tuple[float, float]] = deque(maxlen=11)
        self._working = False  # the main thread worked between the last two readings
        # (time, (CPU, I/O bytes) of the process tree), read once per activity record: it
        # costs ~0.1 ms (a few /proc files per thread and child)
        self._tree: tuple[float, tuple[float, int]] | None = None
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        answered = False
        next_look = 0.0
        while not self._recorder.closed:  # the exit record is written: nothing more to do
            if not answered and handshake.requested(self._logdir):
                answered = True
                try:
                    self.dump()
                except Exception as exc:  # this thread makes the writer's looks: it goes on
                    self._recorder.warn(f"hang evidence failed: {type(exc).__name__}: {exc}")
                finally:
                    handshake.acknowledge(self._logdir, self._rank)
            # An active rank cannot be hung: sleep until it would have been quiet long enough.
            quiet_at = max(self._recorder.last_issue, self._recorder.started) + QUIET_SECONDS
            pause = WORKING_POLL_SECONDS if self._working else POLL_SECONDS
            time.sleep(min(QUIET_SECONDS, max(pause, quiet_at - time.time())))
            now = time.time()
            writer = self._recorder.writer
            if writer is not None:
                quiet = now - max(self._recorder.last_issue, self._recorder.started) >= \
                    QUIET_SECONDS
                next_look = self._look(writer, now, next_look, quiet)
            if answered:
                continue  # the evidence is given: completions only, until the job is stopped
            try:
                self._activity(now)
            except Exception:  # what the rank is doing is enrichment; never stop the watch
                pass

    @staticmethod
    def _look(writer: Any, now: float, next_look: float, quiet: bool) -> float:
        """Make the writer's look when it is due; the time the next one is due. While the
        rank issues collectives a look is due every ``writer.BUSY_LOOK_SECONDS`` (or once a
        quarter of its issue ring waits for lines), and at once when the rank turns quiet:
        then every ``writer.interval``. A look's own work in a busy rank costs ~2 ms a time
        on top of its work per collective (bench/RESULTS.md, sessions 44 and 46), while
        what the launcher watches for a hang is a quiet rank's, which is as fresh as ever."""
        if now < next_look and not (quiet and next_look - now > writer.interval) and \
                writer.backlog() < writer_mod.BUSY_BACKLOG:
            return next_look
        try:
            writer.look()
        except Exception:  # a broken writer cuts its own trace
            pass
        # The wake-up nearest the time due.
        return now + (writer.interval if quiet else writer_mod.BUSY_LOOK_SECONDS) - \
            POLL_SECONDS / 2

    def _activity(self, now: float) -> None:
        quiet_since = max(self._recorder.last_issue, self._recorder.started)
        if quiet_since != self._quiet_since:
            # The rank issued a collective since the last look: a new quiet spell, whose
            # first record is due as soon as it has two readings (not a second after the
            # previous spell's last record), and whose readings start afresh.
            self._quiet_since = quiet_since
            self._cpu.clear()
            self._working = False
            self._tree = None
            self._next_activity = 0.0
        if now - quiet_since < QUIET_SECONDS:
            return
        cpu = main_thread_cpu()
        if cpu is not None:
            if self._cpu:
                t, c = self._cpu[-1]
                self._working = now > t and (cpu - c) / (now - t) >= WORKING_CPU_RATE
            self._cpu.append((now, cpu))
            # Readings come every POLL_SECONDS, or WORKING_POLL_SECONDS apart: keep the last
            # second's, whichever (the first reading older than a second is the rate's start).
            while len(self._cpu) > 2 and now - self._cpu[1][0] >= ACTIVITY_SECONDS:
                self._cpu.popleft()
        if now < self._next_activity or len(self._cpu) < 2:
            return
        self._next_activity = now + ACTIVITY_SECONDS
        writer = self._recorder.writer
        if writer is None or writer.failed:
            return
        (t0, c0), (t1, c1) = self._cpu[0], self._cpu[-1]
        tree, before = tree_usage(), self._tree
        self._tree = (now, tree) if tree is not None else None
        frame = current_frames().get(threading.main_thread().ident or 0)
        record = {"kind": schema.ACTIVITY, "t": round(now, 3),
                  "quiet_since": round(quiet_since, 3), "cpu": cpu,
                  "cpu_rate": round((c1 - c0) / (t1 - t0), 3) if t1 > t0 else None,
                  "pending": len(writer.pending()), "frames": self.user_frames(frame),
                  "in_collective": in_collective(frame)}
        if tree is not None and before is not None and now > before[0]:
            # The whole process tree since the last record: a rank whose main thread waits
            # while a thread or a child process downloads is busy, not blocked.
            span, (cpu0, io0) = now - before[0], before[1]
            record["tree_cpu_rate"] = round((tree[0] - cpu0) / span, 3)
            record["io_rate"] = round((tree[1] - io0) / span)  # bytes/s
        call = self.library_call(frame)
        if call:
            record["call"] = call
        if self._recorder.flight_recorder:
            # A group ddpdoctor does not record: a stack inside torch.distributed with nothing
            # pending may be a wait in it. Otherwise such a stack is a hole in the record.
            record["unrecorded"] = True
        self._recorder.emit(record)

    @staticmethod
    def library_call(frame: Any) -> str | None:
        """The library function the main thread's user code is inside ('queue.get()'), or None
        when its innermost frame is the user's own. A wrapper of ddpdoctor's is named by what
        it wraps (``DistributedDataParallel.__init__``, not ddpdoctor's patch of it)."""
        callee = None
        while frame is not None:
            name = frame.f_code.co_filename
            if not user_code.is_library(name) and not name.startswith("<"):
                if callee is None or callee.f_code.co_filename.startswith("<"):
                    return None  # the user's own line, or an import in progress
                return call_name(callee.f_code.co_filename, callee.f_code.co_name)
            if callee is None or not user_code.is_own(name):
                callee = frame
            frame = frame.f_back
        return None

    def user_frames(self, frame: Any) -> list[dict]:
        """The innermost :data:`USER_FRAMES` frames of user code, innermost first (the
        innermost frame at all when none is the user's)."""
        out: list[dict] = []
        first = None
        while frame is not None and len(out) < USER_FRAMES:
            code = frame.f_code
            entry = {"file": code.co_filename, "line": frame.f_lineno, "function": code.co_name}
            first = first or entry
            if not user_code.is_library(code.co_filename) and \
                    not code.co_filename.startswith("<"):
                out.append(entry)
            frame = frame.f_back
        return out or ([first] if first else [])

    def dump(self) -> None:
        """Record the pending collectives and every thread's stack, and flush."""
        writer = self._recorder.writer
        pending = [{"id": r.id, "group": r.group, "seq": r.seq, "op": r.op, "label": r.label}
                   for r in (writer.pending() if writer else [])]
        self._recorder.emit({"kind": schema.HANG, "t": time.time(), "pending": pending,
                             "threads": thread_stacks(), "children": ended_children()})
        self._recorder.flush()
        if self._recorder.flight_recorder:
            self._dump_flight_recorder()

    def _dump_flight_recorder(self) -> None:
        """PyTorch's flight-recorder rings of this rank, into the log folder (JSON)."""
        try:
            dump = internals.flight_recorder_dump()
            for entry in dump.get("entries", []):
                for f in entry.get("frames") or []:
                    # The source the rank can read now, so that the report needs no file.
                    f.update(source_capture.capture(str(f.get("filename", "")),
                                                    int(f.get("line", 0) or 0)))
            path = os.path.join(self._logdir,
                                schema.flight_recorder_file(self._recorder.rank or 0))
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
                json.dump(dump, fh)
        except Exception as exc:
            self._recorder.warn(f"flight-recorder dump failed: {type(exc).__name__}: {exc}")
            self._recorder.flush()
