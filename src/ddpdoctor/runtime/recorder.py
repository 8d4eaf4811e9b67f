"""Per-process recording state: the rank's trace writer, group registry and DDP counters.

One :class:`Recorder` lives in each rank. The recording process group records every
collective on the caller's thread (``pg_wrapper._Issuer.issue``), with the sites, DDP counters
and writer kept here, and calls :meth:`learn` for a site it has not seen; everything here
(sites, process start, DDP construction, exceptions, exit) is rare and may be slow. Standard
library only.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from typing import Any

from ddpdoctor.runtime import env, stderr_tail, user_code
from ddpdoctor.runtime.labels import StackLabeler
from ddpdoctor.runtime.watchdog import Watchdog
from ddpdoctor.runtime.writer import MAX_SITES, CallSite, TraceWriter
from ddpdoctor.trace import redact, schema
from ddpdoctor.trace.ddp_sites import BUCKET, UNUSED_PARAMS

# Environment variables worth keeping in a trace; no other environment value is recorded.
ENV_ALLOW_LIST = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                  "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")


_now = time.time
MAX_FRAMES = 20  # innermost frames of an exception's traceback kept in its record
MAX_USER_FRAMES = 5  # and the user's own frames outside those


def kept_frames(frames: list[dict]) -> list[dict]:
    """The frames of an exception worth a record, outermost first: the innermost
    :data:`MAX_FRAMES`, and before them the innermost user frames of the rest. An error deep
    inside torch (the compiler's tracebacks run to 60 frames) still names the user's line."""
    inner = frames[-MAX_FRAMES:]
    outer = [f for f in frames[:-MAX_FRAMES] if not user_code.is_library(f["file"])]
    return outer[-MAX_USER_FRAMES:] + inner


class Recorder:
    """Collects one rank's records and hands them to its :class:`TraceWriter`."""

    def __init__(self, logdir: str, run_id: str) -> None:
        self.logdir = logdir
        self.run_id = run_id
        self.keep_stderr = False  # the rank's stderr tail goes to the log folder (bootstrap)
        self.labeler = StackLabeler([os.path.dirname(os.path.dirname(__file__))])
        self.attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
        self._start_afresh()

    def _start_afresh(self) -> None:
        """This process's own state: no trace yet, nothing counted, not closed."""
        self.writer: TraceWriter | None = None
        self.rank: int | None = None
        self.iteration = 0
        self.bucket_index = 0
        self.last_issue = 0.0  # time of the last collective issued (the watchdog reads it)
        self.started = _now()
        self.flight_recorder = False  # a group ddpdoctor does not record: dump PyTorch's on a hang
        self.group_ready = False  # init_process_group returned (torch is then fully imported)
        self.watchdog: Watchdog | None = None
        self._early: list[dict] = []
        # (site, bucketed) by the static fields of a collective and the places of its caller's
        # frames (StackLabeler.place_id): one lookup per collective once a call site is known
        # (the key is pg_wrapper._Issuer.issue's; None, looked up for a collective with no
        # caller frame, is never kept).
        self.sites: dict[tuple | None, tuple[CallSite, bool]] = {}
        self._ddp_count = 0
        self._closed = False
        self.exit_code: int | None = None
        self._exit_status: str | None = None

    def after_fork(self) -> None:
        """Start afresh in a forked child. The parent's trace is not this process's to write
        (a DataLoader worker writes none); a child that becomes a rank itself (a script that
        starts its workers with ``multiprocessing.Process``) opens its own trace when it calls
        ``init_process_group``, and must not reuse the parent's sites (encoded for the
        parent's trace) or counters, nor find itself already closed when it exits."""
        self._start_afresh()

    @property
    def world_size(self) -> int | None:
        value = os.environ.get("WORLD_SIZE", "")
        return int(value) if value.isdigit() else None

    def status(self) -> str:
        """running, or how the rank ended (its exit record's status)."""
        if not self._closed:
            return schema.RUNNING
        return self._exit_status or (
            schema.EXIT_FAILED if self.exit_code else schema.EXIT_FINISHED)

    def set_internal_dirs(self, dirs: list[str]) -> None:
        """Frames under ``dirs`` are not user code (torch's and ddpdoctor's folders)."""
        self.labeler.reset(dirs)
        self.sites.clear()  # keyed by the places of the old labeler's code objects

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, rank: int, world_size: int, backend: str | None) -> None:
        """Open this rank's trace once its rank is known (start-up or ``init_process_group``).

        Called again when the process group is up, with the backend: a second
        ``process_start`` then completes the first (readers keep the last one).
        """
        if self.writer is None:
            self.rank = rank
            # A process of this rank that ran before this one (the script's first mp.spawn
            # of two, as the DDP tutorial does) left its trace: this is the next round.
            round_ = 0
            while os.path.exists(path := os.path.join(
                    self.logdir, schema.trace_filename(rank, self.attempt, round_))):
                round_ += 1
            self.writer = TraceWriter(path, schema.header(rank, self.run_id, self.attempt,
                                                          round_), rank,
                                      wake=os.environ.get(env.WAKE), thread=False)
            self.writer.put(self._process_start(rank, world_size, backend))
            for rec in self._early:
                self.writer.put(rec)
            self._early.clear()
            if self.watchdog is None:  # one per process, whatever the rounds
                self.watchdog = Watchdog(self, self.logdir, rank)
                if self.keep_stderr:
                    stderr_tail.start(self.logdir)
        elif backend is not None:
            self.writer.put(self._process_start(rank, world_size, backend))

    def _process_start(self, rank: int, world_size: int, backend: str | None) -> dict:
        torch = sys.modules.get("torch")
        return {"kind": schema.PROCESS_START, "t": _now(), "rank": rank,
                "local_rank": int(os.environ.get("LOCAL_RANK", rank)),
                "world_size": world_size if world_size > 0 else
                int(os.environ.get("WORLD_SIZE", "0") or 0) or None,
                "host": socket.gethostname(), "pid": os.getpid(),
                "torch": getattr(torch, "__version__", None), "python": sys.version.split()[0],
                "backend": backend, "cpu_mode": os.environ.get(env.CPU) == "1",
                "argv": redact.mask_args(list(sys.argv)),
                "env": {k: os.environ[k] for k in ENV_ALLOW_LIST if k in os.environ}}

    def next_round(self) -> None:
        """The process makes its process group again (after ``destroy_process_group``): the
        round recorded so far ends as finished, and what follows is recorded as the next
        round, in a trace file of its own (``start`` opens it), numbered from 1 again as the
        new group numbers its collectives."""
        if self.writer is None:
            return
        self.writer.close([{"kind": schema.EXIT, "t": _now(), "status": schema.EXIT_FINISHED,
                            "code": 0, "round_end": True, "iteration": self.iteration}])
        self.writer = None
        self.iteration = 0
        self.bucket_index = 0
        self.sites.clear()
        self._ddp_count = 0
        self.group_ready = False

    def init_started(self, backend: str | None) -> None:
        self.emit({"kind": schema.INIT, "t": _now(), "state": schema.PENDING,
                   "backend": backend})

    def init_done(self, ok: bool) -> None:
        self.group_ready = self.group_ready or ok
        self.emit({"kind": schema.INIT, "t": _now(),
                   "state": schema.COMPLETED if ok else schema.FAILED})

    def emit(self, record: dict) -> None:
        """Queue a rare record (not a collective); kept in memory until the trace opens."""
        if self.writer is None:
            self._early.append(record)
        else:
            self.writer.put(record)

    # -- sites (the hot path itself is the recording group's: pg_wrapper._Issuer.issue) ----
    def learn(self, key: tuple | None, group: str, op: str, tensors: tuple, reduce_op: Any,
              root: int | None, peer: int | None, frame: Any, meta: tuple = (),
              behalf: tuple | None = None) -> tuple[CallSite, bool]:
        """The site of a collective called from ``frame`` whose ``key`` is not in
        :attr:`sites` yet, labelled and kept there (``key`` None, ``frame`` None: the site
        follows the main thread, not kept), and whether each of its calls counts as the next
        gradient bucket of the iteration. ``tensors``: ((shape, dtype), ...); ``meta``:
        ((field, value), ...) beyond them; ``behalf``: (label, name, stack) of the user's
        call a framework issues it for (:mod:`ddpdoctor.runtime.on_behalf`), which gives the
        label, the API and the site."""
        label, api, stack = behalf if behalf is not None else self.labeler.describe(frame)
        bucketed = False
        if label == BUCKET or label == "join.shadow_bucket":
            if tensors and not tensors[0][1].is_floating_point:
                label = UNUSED_PARAMS
            else:
                bucketed = True
        writer = self.writer
        assert writer is not None, "a site is learnt while the trace is open"
        known = writer.site(group, op, label, api, tensors, reduce_op, root, peer, stack,
                            meta), bucketed
        if key is not None:
            if len(self.sites) >= MAX_SITES:  # a program that never repeats a call
                self.sites.clear()
            self.sites[key] = known
        return known

    # -- DDP --------------------------------------------------------------------------------
    def next_iteration(self) -> None:
        """A DDP forward (or a join shadow iteration) began."""
        self.iteration += 1
        self.bucket_index = 0

    def ddp_constructed(self, flags: dict) -> int:
        """Record a DDP construction; returns its index in this process."""
        self._ddp_count += 1
        self.emit({"kind": schema.DDP_INIT, "t": _now(), "index": self._ddp_count - 1,
                   **flags})
        return self._ddp_count - 1

    def group_created(self, info: dict) -> None:
        self.emit({"kind": schema.GROUP, "t": _now(), **info})

    # -- endings ----------------------------------------------------------------------------
    def exception(self, exc: BaseException) -> None:
        """Record an exception escaping the script (or an mp.spawn worker function)."""
        tb = traceback.extract_tb(exc.__traceback__)
        frames = [{"file": f.filename, "line": f.lineno, "function": f.name,
                   "text": (f.line or "")[:240]} for f in tb]
        self.emit({"kind": schema.EXCEPTION, "t": _now(), "type": type(exc).__name__,
                   "message": str(exc)[:2000], "frames": kept_frames(frames),
                   "iteration": self.iteration,
                   "traceback": "".join(traceback.format_exception(exc))[-8000:]})
        self._exit_status = schema.EXIT_EXCEPTION

    def thread_exception(self, thread: str, exc: BaseException) -> None:
        """Record a thread of this rank that died of an exception (``threading`` prints it and
        goes on; the main thread may then wait forever for what that thread would have
        produced)."""
        frames = [{"file": f.filename, "line": f.lineno, "function": f.name,
                   "text": (f.line or "")[:240]}
                  for f in traceback.extract_tb(exc.__traceback__)]
        self.emit({"kind": schema.THREAD_EXCEPTION, "t": _now(), "thread": thread[:200],
                   "type": type(exc).__name__, "message": str(exc)[:2000],
                   "frames": kept_frames(frames)})
        self.flush()

    def warn(self, message: str, lost: bool = False) -> None:
        """A note for the report; ``lost``: collectives from here on go unrecorded, so the
        trace is incomplete (the analysis treats it as cut)."""
        record = {"kind": schema.WARNING, "t": _now(), "message": message}
        if lost:
            record["lost"] = True
        self.emit(record)

    @property
    def closed(self) -> bool:
        """The exit record is written: the rank records nothing more."""
        return self._closed

    def close(self, status: str | None = None, extra: dict | None = None) -> None:
        """Write the exit record (with ``extra`` fields) and stop the writer (atexit)."""
        if self._closed:
            return
        self._closed = True
        if status is None:
            status = self._exit_status or (
                schema.EXIT_FAILED if self.exit_code else schema.EXIT_FINISHED)
        if self.writer is not None:
            self.writer.close([{"kind": schema.EXIT, "t": _now(), "status": status,
                                "code": self.exit_code or 0, "iteration": self.iteration,
                                **(extra or {})}])

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()
