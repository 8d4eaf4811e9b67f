"""Trace writer: each collective is kept *before* it is issued; lines, completions follow in bulk.

The training thread stores a collective's per-call fields into the rank's issue ring (a shared
mapping of ``<trace>.ring``, :mod:`ddpdoctor.trace.issue_ring`) before the backend runs the
collective; the part that repeats from call to call is written once per call site, as a
``site`` record that the lines name by its id. The collective's line is formatted into the
trace file (:mod:`ddpdoctor.runtime.trace_file`, also a shared mapping) at the next look, or
before any other record is written, so the file keeps the issue order.
Stored data lives in the kernel's page cache, so whatever way the rank dies afterwards — an
exception, ``os._exit``, SIGABRT from gloo, SIGSEGV, SIGKILL — the collective it was in, and
every one before it, can be read: from the trace, and for those the look had not yet written,
from the ring (the reader turns them into the lines the writer would have written).

Completion is the one thing known later. Every ``interval`` seconds a look (:meth:`TraceWriter.
look`, made by the writer's own daemon thread, or in a rank by its watchdog's thread, whose
wake-ups then serve both) writes the lines of the collectives issued since the last one,
polls the ``Work`` of every collective still running and, when some completed or were issued,
writes one
``done`` record for all of them: every collective up to ``upto`` has completed except the ids
it lists as ``pending`` (failures get a ``state`` record each), and the issue times of the
collectives written since the last one (``issued``). The collective line itself carries no
time and no rank, so identical ranks write identical lines (readers compare them by bytes).
With ``DDPDOCTOR_MAX_TRACE_MB`` set, a trace past that size keeps only the collectives that
break the rank's pattern (:mod:`ddpdoctor.runtime.trace_cap`). Standard library only: this
runs inside every rank.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ddpdoctor.runtime import source_capture
from ddpdoctor.runtime.hot_lock import HotLock
from ddpdoctor.runtime.issue_log import IssueLog
from ddpdoctor.runtime.launcher_wake import LauncherWake
from ddpdoctor.runtime.progress import ProgressBlock
from ddpdoctor.runtime.ring_file import RingFile
from ddpdoctor.runtime.trace_cap import Compressor, cap_from_env
from ddpdoctor.runtime.trace_file import TraceFile
from ddpdoctor.trace import issue_ring, progress_block, schema
from ddpdoctor.trace.basics import numel

_get_ident = threading.get_ident
_pack_slot = issue_ring.SLOT.pack_into
_SLOT_BYTES = issue_ring.SLOT.size
_RING_HEAD = issue_ring.HEAD.size
_RING_MASK = issue_ring.SLOTS - 1


class CallSite:
    """What repeats from call to call at one place: a collective's static fields (group, op,
    label, tensors, call stack, ...), written once as a ``site`` record that its lines name by
    id."""

    __slots__ = ("group", "op", "label", "api", "tensors", "reduce_op", "root", "peer", "stack",
                 "meta", "sid", "block")

    def __init__(self, group: str, op: str, label: str, api: str | None,
                 tensors: Sequence[tuple[Any, Any]], reduce_op: Any, root: int | None,
                 peer: int | None, stack: tuple, meta: tuple = ()) -> None:
        self.group, self.op, self.label, self.api = group, op, label, api
        self.tensors, self.reduce_op, self.root, self.peer = tensors, reduce_op, root, peer
        self.stack = stack
        self.meta = meta  # ((field, value), ...): sends, recvs, row, tag (schema version 7)
        self.sid = -1  # the id of its site record, which its lines name, once written
        self.block = ""  # its static part in a progress block (the writer thread fills it in)


class CollectiveRecord:
    """A collective still running, as :meth:`TraceWriter.pending` shows it: its per-call
    fields, and its :class:`CallSite` for the rest (read through as attributes)."""

    __slots__ = ("id", "seq", "p2p_seq", "iteration", "bucket", "t", "site", "work")

    def __init__(self, cid: int, seq: int | None, p2p_seq: int | None, iteration: int,
                 bucket: int | None, t: float, site: CallSite) -> None:
        self.id, self.seq, self.p2p_seq, self.iteration = cid, seq, p2p_seq, iteration
        self.bucket, self.t, self.site = bucket, t, site
        # ISSUING until the backend returned a Work; then the Work; a state string on error.
        self.work: Any = ISSUING

    group = property(lambda self: self.site.group)
    op = property(lambda self: self.site.op)
    label = property(lambda self: self.site.label)
    api = property(lambda self: self.site.api)
    tensors = property(lambda self: self.site.tensors)
    reduce_op = property(lambda self: self.site.reduce_op)
    root = property(lambda self: self.site.root)
    peer = property(lambda self: self.site.peer)
    stack = property(lambda self: self.site.stack)


ISSUING = object()
_ABSENT = object()
_COMPLETED = schema.COMPLETED


class IssueState(HotLock):
    """The writer's lock and what the issuing thread changes per collective, in one slotted
    object: in a rank whose threads share few cores, each object a collective touches after
    the thread comes back from a wait costs it cache misses (bench/RESULTS.md, session 42).

    ``next_id``: the last id numbered; ``collected``: the last whose ring slot the look read;
    ``ring``: the issue ring's mapping (None: none, or closed); ``works``: by id, the Work
    (or a state string, or ISSUING until the backend returns) of each collective not known
    to be complete. The hot thread's last collective is kept apart, as ``last_id`` and
    ``last`` (ISSUING, its Work, or a state string): its next collective releases it,
    storing it in ``works`` only when it has not completed, so a loop of collectives that
    complete in turn never touches the dict. An id neither in ``works`` nor the last has
    completed."""

    __slots__ = ("next_id", "collected", "ring", "works", "last_id", "last")

    def __init__(self, ring: Any) -> None:
        super().__init__()
        self.next_id = 0
        self.collected = 0
        self.ring = ring
        self.works: dict[int, Any] = {}
        self.last_id = 0  # no collective yet (ids start at 1)
        self.last: Any = _COMPLETED

    def work(self, cid: int) -> tuple[Any, bool]:
        """What is known of collective ``cid`` (a Work, ISSUING, or a state string), and
        whether it came from ``works`` (else it is the hot thread's last, or released)."""
        work = self.works.get(cid, _ABSENT)
        if work is not _ABSENT:
            return work, True
        return (self.last if cid == self.last_id else _COMPLETED), False


MAX_PENDING_LISTED = 1024  # ids a ``done`` record lists as still running, at most
MAX_SITES = 65536  # sites kept for reuse, at most


# How often the writer looks to record completions. A wake-up in a busy rank costs far
# more than its own work: ~300 µs of CPU on a 2-core VM, its code cold after the training
# loop's (bench/RESULTS.md, session 23: the CNN job's writer thread used 1.6 ms of CPU per
# second at 0.2 s, 0.9 at 0.5 s, 0.6 at 1 s, whatever it found to do). Hang detection works in
# seconds; the timeline's completion times are this coarse. In a rank the watchdog's thread,
# which wakes every 0.3 s while the rank is busy anyway, makes the looks: a thread of the
# writer's own cost two wake-ups a second more (session 38, the small-op loop: the two threads
# 5.3 µs of CPU per collective, the one 3.9).
DONE_SECONDS = 0.5
# While the rank issues collectives its watchdog looks this seldom instead, or once this many
# collectives wait in the ring for their lines (a quarter of it: the hot thread writes its
# own lines only when the ring would wrap); a quiet rank's looks come every DONE_SECONDS.
BUSY_LOOK_SECONDS = 2.0
BUSY_BACKLOG = issue_ring.SLOTS // 4
PREFAULT_BYTES = 64 * 1024  # the least a look faults in ahead of the data


# How a completed Work says whether it failed. ``Work.is_success()`` is torch's cheapest answer
# (0.2 µs) but prints a deprecation warning the first time a process calls it; the recording
# group makes that first call with stderr elsewhere and, when a second call prints nothing,
# switches it on here (pg_wrapper.quiet_failure_check). Otherwise, and while torch is set to
# repeat every warning, the future is asked: ``get_future().value()`` re-raises the error, but
# turns the collective's result into Python objects (1 µs, half the writer's work).
_is_success_quiet = False


def use_is_success(quiet: bool) -> None:
    """Whether ``Work.is_success()`` may be asked from now on (see above)."""
    global _is_success_quiet
    _is_success_quiet = quiet


def _quiet_check() -> bool:
    """Whether ``Work.is_success()`` can be asked now without printing anything."""
    if not _is_success_quiet:
        return False
    torch = sys.modules.get("torch")
    try:
        return not torch.is_warn_always_enabled()  # type: ignore[union-attr]
    except Exception:
        return False


def _work_state(work: Any, quiet: bool) -> str:
    """State of a c10d ``Work``: pending until it completes, then completed or failed
    (``quiet``: asked with ``is_success()``, see :func:`_quiet_check`). The common case (a
    Work that completed) is tried first, without checks; anything else falls to
    :func:`_other_state`."""
    try:
        if not work.is_completed():
            return schema.PENDING
        if quiet:
            return schema.COMPLETED if work.is_success() else schema.FAILED
        work.get_future().value()  # re-raises the collective's error
        return schema.COMPLETED
    except Exception:
        return _other_state(work)


def _other_state(work: Any) -> str:
    """:func:`_work_state` of anything but a Work that completed without error."""
    if work is ISSUING:
        return schema.PENDING
    if isinstance(work, str):
        return work
    try:
        if not work.is_completed():
            return schema.PENDING
        if _quiet_check():
            try:
                work.is_success()
            except Exception:  # a Work that does not say (NCCL's raises): futures from now on
                use_is_success(False)
        future = work.get_future()
    except Exception:  # a Work without a future: completed is all we can know
        return schema.COMPLETED
    try:
        future.value()  # re-raises the collective's error
    except Exception:
        return schema.FAILED
    return schema.COMPLETED


class TraceWriter:
    """Appends one rank's records to its JSON Lines file, collectives before they run.

    ``write_at(site, seq, p2p_seq, bucket, iteration, t)`` numbers a collective and stores
    it before it is issued, returning its id; ``returned(id, work)`` hands over the Work the
    backend returned for it. Both are closures each writer makes (:func:`_hot_path`)."""

    write_at: Callable[..., int]
    returned: Callable[[int, Any], None]

    def __init__(self, path: str, header: dict, rank: int, interval: float = DONE_SECONDS,
                 max_bytes: int | None = None, wake: str | None = None,
                 thread: bool = True) -> None:
        """``max_bytes``: the size cap (default: ``DDPDOCTOR_MAX_TRACE_MB``; None: no cap);
        ``wake``: the launcher's FIFO, written to when the rank starts to wait; ``thread``:
        a daemon thread of its own makes the looks (False: the owner calls :meth:`look`
        every ``interval``)."""
        if max_bytes is None:
            max_bytes = cap_from_env()
        self._cap = Compressor(max_bytes) if max_bytes is not None else None
        self.path = path
        self.rank = rank
        self.interval = interval
        self.failed = False  # a write failed: the trace is cut from there on
        self.completed = 0  # collectives known to have completed
        # Each collective written: its id, issue time, per-call fields and site, in the
        # issue log's columns, read back from the issue ring by the look (:meth:`_collect`;
        # appended by the issuing thread where there is no ring) and taken by the next look,
        # which keeps the fields of those still running in _open and _open_sites (by id, in
        # issue order). The issuing thread stores only what it knows of the Work, in the
        # IssueState (``_hot``). Nothing is made per collective that the garbage collector
        # tracks and that lives on (a full collection is ~75 ms in a process that imported
        # torch, and long-lived tracked objects make them frequent): the log's columns hold
        # numbers, a tuple of numbers is untracked at the first collection, dict entries are
        # no objects, and a Work is untracked.
        self._issued_log = IssueLog()
        self._folded: set[int] = set()  # ids in the log folded into a run (capped trace)
        self._open: dict[int, tuple] = {}
        self._open_sites: dict[int, CallSite] = {}
        self._settled_id = 0  # the last id written at the last look
        self._stacks: dict[tuple, int] = {}
        self._sites: dict[tuple, CallSite] = {}
        self._stop = threading.Event()
        self._closed = False
        # What the launcher watches (trace/progress_block.py), and per group the highest
        # sequence number issued, which the writer thread keeps up to date for it.
        self._block = ProgressBlock(path, header)
        self._issued_seq: dict[str, int] = {}
        self._wake = LauncherWake(wake) if wake else None
        self._woke_for = 0  # the collective whose wait last woke the launcher
        self._file = TraceFile(path)
        # The issue ring (trace/issue_ring.py): the issuing thread stores a collective's
        # fields there, and its line is formatted at the next look (or before any other
        # record). Without one, each line is written as its collective is issued.
        self._ring: RingFile | None = None
        try:
            self._ring = RingFile(path)
        except OSError:
            pass
        # Re-entrant: a Python signal handler may write a record while the main thread,
        # which it interrupted, holds the lock.
        # ``_lock`` where it is only taken, ``_hot`` where its state is read or written.
        self._lock = self._hot = IssueState(self._ring.map if self._ring is not None else None)
        self.write_at, self.returned = _hot_path(self)
        self.works = self._hot.works  # what is left for the look (the writer's tests read it)
        self._site_list: list[CallSite] = []  # the sites written, by their records' ids
        self._drained = 0  # how many of _issued_log's collectives have their lines written
        self._first_pos = self._file.pos
        self._looked_at = self._first_pos  # where the data ended at the last look
        self._write(json.dumps(header) + "\n")
        if thread:
            threading.Thread(target=self._run, name="ddpdoctor-writer", daemon=True).start()

    # -- caller side -------------------------------------------------------------------------
    def site(self, group: str, op: str, label: str, api: str | None, tensors: tuple,
             reduce_op: Any, root: int | None, peer: int | None, stack: tuple,
             meta: tuple = ()) -> CallSite:
        """The :class:`CallSite` of these static fields: the same object for the same fields (its
        line encoded once). ``tensors``: ((shape, dtype), ...); ``stack``: the labeler's cached
        tuple for a call stack (same places, same object); ``meta``: ((field, value), ...) of
        the fields that decide a match beyond the tensors (split sizes, a tag)."""
        # Keyed by id(stack): the labeler hands out one tuple per call stack and the site keeps
        # it alive, so the id cannot be reused while the key exists.
        key = (group, op, label, api, reduce_op, root, peer, id(stack), tensors, meta)
        with self._lock:
            site = self._sites.get(key)
            if site is None:
                if len(self._sites) >= MAX_SITES:  # a program that never repeats a call
                    self._sites.clear()
                site = self._sites[key] = CallSite(group, op, label, api, tensors, reduce_op, root,
                                               peer, stack, meta)
            return site

    def _write_at_locked(self, site: CallSite, seq: int | None, p2p_seq: int | None,
                         bucket: int | None, iteration: int, t: float) -> int:
        """:meth:`write_at` under the lock: another thread than the hot one, a new site (its
        record first, after the lines issued before it), or a look under way."""
        with self._hot as hs:
            hs.make_hot()
            if site.sid < 0:
                self._drain()
                self._write_site(site)
            return self.write_at(site, seq, p2p_seq, bucket, iteration, t, True)

    def _line_now(self, cid: int, t: float, seq: int | None, p2p_seq: int | None,
                  iteration: int, bucket: int | None, site: CallSite) -> int:
        """No ring, or it would wrap before the look: collective ``cid``'s line now."""
        self._collect(cid - 1)
        self._issued_log.append(cid, t, seq, p2p_seq, iteration, bucket, site.sid)
        self._hot.collected = cid
        self._drain()
        return cid

    def set_states(self, ids: Sequence[int], state: str) -> None:
        """Collectives ``ids`` are known to have ended in ``state`` (COMPLETED, FAILED)
        without their Works telling: DDP's callback waited for its buckets, a coalesced
        broadcast returned or raised."""
        with self._lock:
            hs = self._hot
            works = hs.works
            for cid in ids:
                if cid == hs.last_id:
                    hs.last = state
                elif state is not _COMPLETED or cid in works:  # absent: completed
                    works[cid] = state

    def put(self, record: dict) -> None:
        """Write a record that is not a collective (rare: process start, group, exit, ...)."""
        with self._lock:
            self._drain()
            self._write(json.dumps(record) + "\n")
            self._block.note(record)

    def pending(self) -> list[CollectiveRecord]:
        """Collectives issued and not yet known to be complete, in issue order."""
        with self._lock:
            out = []
            quiet = _quiet_check()
            self._collect(self._hot.next_id)
            log = self._issued_log
            entries: list[tuple[int, Sequence[Any], CallSite]] = [
                (cid, fields, self._open_sites[cid]) for cid, fields in self._open.items()]
            entries += [(cid, log.fields(i), self._site_list[log.sites[i]])
                        for i, cid in enumerate(log.ids)]
            for cid, (t, seq, p2p_seq, iteration, bucket), site in entries:
                work = self._hot.work(cid)[0]
                if _work_state(work, quiet) == schema.PENDING:
                    rec = CollectiveRecord(cid, seq, p2p_seq, iteration, bucket, t, site)
                    rec.work = work
                    out.append(rec)
            return out

    def flush(self) -> None:
        """Write what is known of completions and the open runs of a capped trace, now."""
        with self._lock:
            self._settle(final=True)

    def close(self, final: list[dict] | None = None) -> None:
        """Write the last completions and ``final`` records, and stop the thread."""
        self._stop.set()
        with self._lock:
            if self._closed:
                return
            self._settle(final=True)
            if final:
                self._write("".join(json.dumps(rec) + "\n" for rec in final))
                for rec in final:
                    self._block.note(rec)
            self._closed = True
            self._block.close()
            self._hot.ring = None  # a late collective: its line, to nowhere
            if self._ring is not None:
                self._ring.close()
            if self._wake is not None:
                self._wake.close()
            if not self.failed:
                self._file.close()

    # -- completions (the thread that looks) -------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.look()

    def backlog(self) -> int:
        """Collectives numbered whose ring slots no look has read yet."""
        hs = self._hot
        return hs.next_id - hs.collected

    def look(self) -> None:
        """Record what completed since the last look (see :meth:`_settle`) and fault in the
        pages the next lines will need. Any thread; a closed writer does nothing."""
        with self._lock:
            if self._closed:
                return
            self._settle()
            last, self._looked_at = self._looked_at, self._file.pos
        # The pages the next interval's lines will likely need, twice over.
        self._file.prefault(max(PREFAULT_BYTES, 2 * (self._looked_at - last)))

    def _settle(self, final: bool = False) -> None:
        """One ``done`` record when collectives completed since the last, a ``state`` record
        per failure; close the runs of a capped trace when the rank has gone quiet."""
        self._drain()
        lines: list[str] = []
        now = time.time()
        cap = self._cap
        if cap is not None:
            cap.begin(now, self.bytes_written, lines)
        hs = self._hot
        works, opened, sites = hs.works, self._open, self._open_sites
        log, self._issued_log = self._issued_log, IssueLog()
        self._drained = 0
        folded = self._folded
        if folded:
            self._folded = set()
        quiet = _quiet_check()
        settled = 0
        failed: list[tuple[int, str]] = []
        # Those still running at the last look first, then those issued since, in issue order
        # (so _open stays in issue order). What the look learns it takes out of ``works``;
        # it stores nothing there (the issuing thread may be storing a Work meanwhile).
        for cid in list(opened):
            work, listed = hs.work(cid)
            state = _work_state(work, quiet)
            if state == schema.PENDING:
                continue
            if listed:
                works.pop(cid, None)
            del opened[cid], sites[cid]
            settled += 1
            if state != schema.COMPLETED:
                failed.append((cid, state))
        self._issued_seq.update(log.last_by_group(self._site_list))
        ids = log.ids
        # Those issued since: an id neither in ``works`` nor the hot thread's last was
        # released by write_at, completed; where the ids run without a gap only the others
        # are looked at, one by one.
        if ids and log.consecutive():
            first = ids[0]
            # tuple(works): one step under the GIL (another thread may store a Work)
            asked = sorted(cid for cid in (*tuple(works), hs.last_id) if first <= cid <= ids[-1])
            settled += len(ids) - len(asked)
            at: Sequence[int] = [cid - first for cid in asked]
        else:
            at = range(len(ids))
        for i in at:
            cid = ids[i]
            work, listed = hs.work(cid)
            if work is _COMPLETED and not listed:  # released by write_at
                settled += 1
                continue
            state = _work_state(work, quiet)
            if state == schema.PENDING:
                opened[cid] = log.fields(i)
                sites[cid] = self._site_list[log.sites[i]]
                continue
            if listed:
                works.pop(cid, None)
            settled += 1
            if state != schema.COMPLETED:
                failed.append((cid, state))
        lines += [json.dumps({"kind": schema.STATE, "id": cid, "state": state,
                              "t": round(now, 6)}) for cid, state in failed]
        self.completed += settled
        times = log.times
        if folded:  # a capped trace's runs have their own times
            kept = [i for i, cid in enumerate(ids) if cid not in folded]
            ids, times = [ids[i] for i in kept], [times[i] for i in kept]
        if settled or ids:
            # Every id up to the last one written has completed, failed, or is listed.
            still = list(itertools.islice(opened, MAX_PENDING_LISTED + 1))
            done: dict[str, Any] = {"kind": schema.DONE, "t": round(now, 6),
                                    "upto": hs.next_id,
                                    "pending": still[:MAX_PENDING_LISTED]}
            if len(still) > MAX_PENDING_LISTED:
                done["pending_from"] = still[MAX_PENDING_LISTED]  # all later ids run too
            text = json.dumps(done)
            if ids:  # json.dumps's layout, with the times formatted directly
                text = f'{text[:-1]}, "{schema.ISSUED}": {issued_json(ids, times)}}}'
            lines.append(text)
        # The rank issued nothing since the writer last looked (an interval ago): it waits,
        # maybe for good, and what its runs hold must be on disk.
        if cap is not None and (final or hs.next_id == self._settled_id):
            cap.close_all(lines)
        self._settled_id = hs.next_id
        if lines:
            self._write("\n".join(lines) + "\n")
        if settled or log:
            self._tell_block(log)
        if self._wake is not None and opened:
            oldest = next(iter(opened))
            if oldest != self._woke_for and now - opened[oldest][0] >= progress_block.WAITED:
                self._woke_for = oldest  # once per wait: the launcher polls fast meanwhile
                self._wake.wake()

    def _tell_block(self, log: IssueLog) -> None:
        """The progress block's news after a look: the last collective written (when ``log``,
        those written since the last look, has any), the completions, the oldest running."""
        state = self._block.state
        iteration, last_op, issued_at = state["iteration"], state["last_op"], state["last_issue"]
        if log:
            site = self._site_list[log.sites[-1]]
            iteration, last_op = log.iterations[-1], f"{site.op} ({site.label})"
            issued_at = round(log.times[-1], 6)
        listed = [self._block_record(cid, fields, self._open_sites[cid]) for cid, fields in
                  itertools.islice(self._open.items(), progress_block.MAX_LISTED)]
        self._block.progressed(self._hot.next_id, self.completed, iteration, last_op, issued_at,
                               dict(self._issued_seq), listed, len(self._open))

    def _block_record(self, cid: int, fields: Sequence[Any], site: CallSite) -> str:
        """A collective still running as its progress block lists it: a ``collective`` record
        with its static part inline and its call stack as ``frames``."""
        t, seq, p2p_seq, iteration, bucket = fields
        if not site.block:
            frames = [{"file": f, "line": n, "function": fn} for f, n, fn in site.stack]
            site.block = json.dumps(self._static_dict(site, None) | {"frames": frames})[1:-1]
        extra = "" if p2p_seq is None else f', "p2p_seq": {p2p_seq}'
        if bucket is not None:
            extra += f', "bucket": {bucket}'
        return (f'{{"id": {cid}, "kind": "collective", "seq": {json.dumps(seq)}, '
                f'"iteration": {iteration}{extra}, "t": {t:.6f}, {site.block}}}')

    # -- encoding (under the lock) -----------------------------------------------------------
    def _collect(self, upto: int) -> None:
        """Read the fields of the collectives up to id ``upto`` that the ring holds into the
        issue log."""
        hs = self._hot
        ring = hs.ring
        first = hs.collected + 1
        if ring is None or first > upto:
            return
        self._issued_log.read_ring(ring, first, upto)
        hs.collected = upto

    def _drain(self) -> None:
        """Write the lines of the collectives issued since the last drain, in issue order (a
        capped trace folds repeats into runs here), and tell the ring how far they go."""
        self._collect(self._hot.next_id)
        log = self._issued_log
        start = self._drained
        if start == len(log):
            return
        self._drained = len(log)
        cap = self._cap
        if cap is None or not cap.active:
            text = log.text(start)
        else:
            lines: list[str] = []
            line, sites = issue_ring.collective_line, self._site_list
            for i in range(start, len(log)):
                cid, sid = log.ids[i], log.sites[i]
                t, seq, p2p_seq, iteration, bucket = log.fields(i)
                if seq is not None and cap.fold(sites[sid].group, cid, seq, iteration, bucket,
                                                t, sid, lines):
                    self._folded.add(cid)  # in a run, which has its time
                    continue
                lines.append(line(cid, seq, iteration, sid, p2p_seq, bucket))
            text = "\n".join(lines) + "\n" if lines else ""
        if text:
            self._write(text)
        if self._ring is not None:
            self._ring.lined(log.ids[-1])

    def _write_site(self, site: CallSite) -> None:
        """Write ``site``'s ``site`` record (its call stack's record before it, when new) and
        give the site its id, which its lines name (``"site": N``)."""
        site.sid = len(self._site_list)
        self._site_list.append(site)
        lines: list[str] = []
        lines.append(f'{{"kind": "{schema.SITE}", "id": {site.sid}, '
                     f'{self._static_fields(site, lines)}}}')
        self._write("\n".join(lines) + "\n")

    def _static_fields(self, site: CallSite, lines: list[str]) -> str:
        """The static part of ``site`` as JSON fields (no braces); its call stack's record
        appended to ``lines`` first, when new."""
        stack_id = self._stacks.get(site.stack)
        if stack_id is None:
            stack_id = self._stacks[site.stack] = len(self._stacks)
            frames = [source_capture.frame(f, n, fn) for f, n, fn in site.stack]
            lines.append(json.dumps({"kind": schema.STACK, "id": stack_id, "frames": frames}))
        return json.dumps(self._static_dict(site, stack_id))[1:-1]

    @staticmethod
    def _static_dict(site: CallSite, stack_id: int | None) -> dict[str, Any]:
        """The static part of ``site``: its fields in the order trace/schema.py declares
        (``stack``, the id of its call stack's record, left out when None)."""
        shapes = [list(shape) for shape, _ in site.tensors]
        dtypes = [str(dtype).replace("torch.", "") for _, dtype in site.tensors]
        out: dict[str, Any] = {"group": site.group, "op": site.op, "label": site.label,
                               "shapes": shapes, "dtypes": dtypes, "numel": numel(shapes)}
        if stack_id is not None:
            out["stack"] = stack_id
        if site.reduce_op is not None:
            out["reduce_op"] = getattr(site.reduce_op, "name", str(site.reduce_op))
        for name in ("api", "root", "peer"):
            value = getattr(site, name)
            if value is not None:
                out[name] = value
        out.update(site.meta)
        return out

    def _write(self, text: str) -> None:
        """Append ``text``: whole lines, each ending in a newline."""
        self._write_bytes(text.encode("utf-8", "replace"))

    def _write_bytes(self, data: bytes) -> None:
        if self.failed or self._closed:  # a late record (watchdog) after the exit record
            return
        try:
            self._file.append(data)
        except OSError as exc:
            self._cut(exc)

    @property
    def bytes_written(self) -> int:
        """Bytes this writer added to its trace."""
        return self._file.pos - self._first_pos

    def _cut(self, exc: OSError) -> None:
        """A write failed (full disk, file size limit): stop writing and leave a marker file
        next to the trace, so that readers know the trace is cut, not the job short."""
        self.failed = True
        self._block.cut()
        try:
            self._file.close()
        except OSError:
            pass
        try:  # an empty file needs no data block: it usually fits on a full disk
            os.close(os.open(schema.cut_marker(self.path), os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError:
            pass
        sys.stderr.write(f"ddpdoctor: rank {self.rank}: cannot write trace {self.path}: "
                         f"{exc.strerror or exc}; recording stopped, the job goes on\n")


def _hot_path(writer: TraceWriter) -> tuple[Callable[..., int], Callable[[int, Any], None]]:
    """``writer``'s ``write_at`` and ``returned``: closures over its IssueState and what the
    hot path uses, not methods. In a busy rank the training thread comes back from each wait
    to cold caches and pays for every instruction and object a collective touches: a method
    looked up on the writer (its type, its instance values) and each module global (an entry
    of the module's dict) are reads a closure's cell spares (bench/RESULTS.md, session 43:
    the recording's work as one closure over its state ran 1-2 µs a collective below the same
    work through methods and globals, blocks alternating in one job)."""
    hs = writer._hot
    locked_path, line_now = writer._write_at_locked, writer._line_now
    get_ident, pack, head, mask, slot_bytes = _get_ident, _pack_slot, _RING_HEAD, _RING_MASK, \
        _SLOT_BYTES
    issuing, completed = ISSUING, _COMPLETED

    def write_at(site: CallSite, seq: int | None, p2p_seq: int | None, bucket: int | None,
                 iteration: int, t: float, locked: bool = False) -> int:
        """Number a collective of ``site`` and write its line now, before it is issued; its
        id, which the caller hands to ``returned`` with the ``Work``. (``locked``: called
        back by ``_write_at_locked``.)"""
        # The hot path: every collective of the job passes here, on the training thread. What
        # repeats from call to call is the site's, encoded once; only the per-call fields are
        # stored. The lock's fast path (HotLock.fast_enter, inlined) for the thread that
        # issues the collectives; the lock for any other, and for a new site. Rare cases are
        # calls: in a busy rank the thread pays for each line of bytecode it runs, cold after
        # a wait (bench/RESULTS.md, session 42; bench/hot_path_code.py counts them).
        if not locked:
            if get_ident() != hs.hot or hs.busy or site.sid < 0:
                return locked_path(site, seq, p2p_seq, bucket, iteration, t)
            hs.busy = True
            if hs.others:
                hs.busy = False
                return locked_path(site, seq, p2p_seq, bucket, iteration, t)
        try:
            hs.next_id = cid = hs.next_id + 1
            if locked and get_ident() != hs.hot:
                hs.works[cid] = issuing
            else:
                # The hot thread's previous collective released: a synchronous collective's
                # (dist.all_reduce waits for it) has always completed. Kept for the look
                # instead, every Work of a small-op loop cost gloo's threads ~10 µs of CPU per
                # collective more than plain torch's (bench/RESULTS.md, session 38); DDP's
                # asynchronous bucket all-reduces still running stay for the look.
                last_id, last = hs.last_id, hs.last
                if last is not completed:
                    try:
                        done = _is_success_quiet and last.is_completed() and last.is_success()
                    except Exception:  # ISSUING, a state string: the look asks its own way
                        done = False
                    if not done:
                        hs.works[last_id] = last
                hs.last_id, hs.last = cid, issuing
            ring = hs.ring
            if ring is None or cid - hs.collected >= mask:
                return line_now(cid, t, seq, p2p_seq, iteration, bucket, site)
            # The fields stored, all else left to the look (which reads them back into the
            # issue log): formatting the line here cost the small-op loop's training thread
            # ~4 µs a collective (bench/RESULTS.md, session 39). The layout is
            # trace/issue_ring.py's.
            pack(ring, (cid & mask) * slot_bytes + head, cid, t, seq or 0, p2p_seq or 0,
                 iteration, 0 if bucket is None else bucket + 1, site.sid, cid)
            return cid
        finally:
            if not locked:
                hs.busy = False

    def returned(cid: int, work: Any) -> None:
        """The backend returned ``work`` for collective ``cid`` (any thread, no lock: one
        reference stored)."""
        if cid == hs.last_id:
            hs.last = work
        else:
            hs.works[cid] = work

    return write_at, returned


def _run_json(first: int, times: Sequence[float]) -> str:
    """One run of ``issued``: ``[first id, first issue time, [µs after it, ...]]``, every
    time taken to the microsecond before the differences (no error builds up)."""
    base = round(times[0] * 1e6)
    offsets = ", ".join([str(round(t * 1e6) - base) for t in times])
    return f"[{first}, {base // 1_000_000}.{base % 1_000_000:06d}, [{offsets}]]"


def issued_json(ids: Sequence[int], times: Sequence[float]) -> str:
    """The ``issued`` field of a ``done`` record as JSON: ``[first id, first issue time,
    [microseconds from it to each issue time, ...]]`` for each run of consecutive ids (``ids``
    grow; a capped trace leaves gaps where runs fold), ``times`` the issue time of each id.
    Formatted directly: each time rounded and encoded with json.dumps cost the writer thread
    1 µs per collective, half its work; integer offsets cost about half of formatting each
    time to the microsecond (0.20 µs a time against 0.36, single process), and 8 bytes
    instead of 19 (format 9)."""
    first = ids[0]
    if ids[-1] - first == len(ids) - 1:  # one run (ids only grow): the common case
        return f"[{_run_json(first, times)}]"
    runs: list[tuple[int, list[float]]] = []
    run: list[float] = []
    last = -2
    for cid, t in zip(ids, times):
        if cid != last + 1:
            run = []
            runs.append((cid, run))
        run.append(t)
        last = cid
    return "[" + ", ".join(_run_json(start, ts) for start, ts in runs) + "]"
