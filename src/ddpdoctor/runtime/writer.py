"""Off-hot-path trace writer: a daemon thread that encodes records and appends them to disk.

The training thread only appends a small object to a deque (atomic under the GIL). Every
``interval`` seconds the writer thread drains the deque, polls the ``Work`` objects of
collectives that were still running, encodes JSON lines and writes them with one ``os.write``
on an ``O_APPEND`` descriptor, so everything older than one interval survives a SIGKILL.
With ``DDPDOCTOR_MAX_TRACE_MB`` set, a trace past that size keeps only the collectives that
break the rank's pattern (:mod:`ddpdoctor.runtime.trace_cap`).
Standard library only: this runs inside every rank.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from typing import Any

from ddpdoctor.runtime.trace_cap import Compressor, cap_from_env
from ddpdoctor.trace import schema


class CollectiveRecord:
    """One collective as seen on the caller's thread; encoded later by the writer."""

    __slots__ = ("id", "group", "seq", "p2p_seq", "op", "api", "tensors", "reduce_op",
                 "root", "peer", "label", "bucket", "iteration", "t", "stack", "work")

    def __init__(self) -> None:
        # ISSUING until the backend returned a Work; then the Work; a state string on error.
        self.work: Any = ISSUING


ISSUING = object()
_YIELD_EVERY = 64  # records encoded between two releases of the GIL to the training thread


def _work_state(work: Any) -> str:
    """State of a c10d ``Work``: pending until it completes, then completed or failed."""
    if work is ISSUING:
        return schema.PENDING
    if isinstance(work, str):
        return work
    try:
        if not work.is_completed():
            return schema.PENDING
        future = work.get_future()
    except Exception:  # a Work without a future: completed is all we can know
        return schema.COMPLETED
    try:
        future.value()  # re-raises the collective's error; Work.exception() is deprecated
    except Exception:
        return schema.FAILED
    return schema.COMPLETED


class TraceWriter:
    """Appends one rank's records to its JSON Lines file from a background thread."""

    def __init__(self, path: str, header: dict, rank: int, interval: float = 0.02,
                 max_bytes: int | None = None) -> None:
        """``max_bytes``: the size cap (default: ``DDPDOCTOR_MAX_TRACE_MB``; None: no cap)."""
        if max_bytes is None:
            max_bytes = cap_from_env()
        self._cap = Compressor(max_bytes) if max_bytes is not None else None
        self.bytes_written = 0
        self.path = path
        self.rank = rank
        self.interval = interval
        self._queue: collections.deque = collections.deque()
        self._pending: list[CollectiveRecord] = []
        self._stacks: dict[tuple, int] = {}
        self._static: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failed = False
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._write_lines([json.dumps(header)])
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-writer", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------------
    def put(self, item: CollectiveRecord | dict) -> None:
        """Queue a record; cheap and safe from any thread."""
        self._queue.append(item)

    def pending(self) -> list[CollectiveRecord]:
        """Collectives issued and not yet known to be complete (queued or polled)."""
        with self._lock:
            queued = [r for r in self._queue if isinstance(r, CollectiveRecord)]
            return [r for r in self._pending + queued if _work_state(r.work) == schema.PENDING]

    def flush(self) -> None:
        """Write everything queued so far, now, from the calling thread."""
        with self._lock:
            self._drain(final=True)

    def close(self, final: list[dict] | None = None) -> None:
        """Write ``final`` records after a last drain and stop the thread."""
        self._stop.set()
        with self._lock:
            for rec in final or []:
                self._queue.append(rec)
            self._drain(final=True)
            if not self._failed:
                os.close(self._fd)
                self._failed = True

    # -- writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                self._drain()

    def _drain(self, final: bool = False) -> None:
        if self._failed:
            self._queue.clear()
            return
        lines: list[str] = []
        queue = self._queue
        now = time.time()
        cap = self._cap
        if cap is not None:
            cap.begin(now, self.bytes_written, lines)
        n = 0
        while queue:
            item = queue.popleft()
            if isinstance(item, dict):
                lines.append(json.dumps(item))
            else:
                self._encode_collective(item, lines, now)
            n += 1
            if n % _YIELD_EVERY == 0:
                time.sleep(0)  # let the training thread have the GIL back
        still: list[CollectiveRecord] = []
        for rec in self._pending:
            state = _work_state(rec.work)
            if state == schema.PENDING:
                still.append(rec)
            else:
                rec.work = state
                lines.append(json.dumps({"kind": schema.STATE, "id": rec.id, "state": state,
                                         "t": round(now, 6)}))
        self._pending = still
        if cap is not None and final:
            cap.close_all(lines)
        if lines:
            self._write_lines(lines)

    def _encode_collective(self, rec: CollectiveRecord, lines: list[str], now: float) -> None:
        # What repeats from iteration to iteration (group, op, label, shapes, call stack, ...)
        # is encoded once and cached; only the per-call fields are formatted each time.
        key = (rec.group, rec.op, rec.label, rec.api, rec.reduce_op, rec.root, rec.peer,
               rec.stack, tuple(rec.tensors))
        static = self._static.get(key)
        if static is None:
            static = self._static[key] = self._encode_static(rec, lines)
        state = _work_state(rec.work)
        if self._cap is not None and rec.seq is not None and \
                self._cap.fold(rec, static, state, lines):
            rec.work = state  # covered by a repeat record
            return
        extra = ""
        if rec.p2p_seq is not None:
            extra += f', "p2p_seq": {rec.p2p_seq}'
        if rec.bucket is not None:
            extra += f', "bucket": {rec.bucket}'
        lines.append(f'{{"kind": "collective", "id": {rec.id}, "rank": {self.rank}, '
                     f'"seq": {"null" if rec.seq is None else rec.seq}, '
                     f'"iteration": {rec.iteration}, "t": {rec.t:.6f}, "state": "{state}"'
                     f'{extra}, {static}}}')
        if state == schema.PENDING:
            self._pending.append(rec)
        else:
            rec.work = state

    def _encode_static(self, rec: CollectiveRecord, lines: list[str]) -> str:
        stack_id = self._stacks.get(rec.stack)
        if stack_id is None:
            stack_id = self._stacks[rec.stack] = len(self._stacks)
            frames = [{"file": f, "line": n, "function": fn} for f, n, fn in rec.stack]
            lines.append(json.dumps({"kind": schema.STACK, "id": stack_id, "frames": frames}))
        shapes, dtypes, numel = [], [], 0
        for shape, dtype in rec.tensors:
            shapes.append(list(shape))
            dtypes.append(str(dtype).replace("torch.", ""))
            n = 1
            for d in shape:
                n *= d
            numel += n
        out = {"group": rec.group, "op": rec.op, "label": rec.label, "shapes": shapes,
               "dtypes": dtypes, "numel": numel, "stack": stack_id}
        if rec.reduce_op is not None:
            out["reduce_op"] = getattr(rec.reduce_op, "name", str(rec.reduce_op))
        for name in ("api", "root", "peer"):
            value = getattr(rec, name)
            if value is not None:
                out[name] = value
        return json.dumps(out)[1:-1]

    def _write_lines(self, lines: list[str]) -> None:
        data = ("\n".join(lines) + "\n").encode("utf-8", "replace")
        self.bytes_written += len(data)
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except OSError as exc:
            self._failed = True
            sys.stderr.write(f"ddpdoctor: rank {self.rank}: cannot write trace {self.path}: "
                             f"{exc}; recording stopped, the job goes on\n")
