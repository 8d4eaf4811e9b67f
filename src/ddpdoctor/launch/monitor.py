"""Live progress of a running job, read from the ranks' progress blocks.

Each rank keeps a small block next to its trace that says how far it got
(:mod:`ddpdoctor.trace.progress_block`); the launcher reads every block's head a poll
and reads and parses only those that changed, so its cost follows the number of ranks, not of
collectives. From them it keeps, per rank, the collectives it issued and has not completed,
how far it got in each group, what it does while it issues no collective (the watchdog's
``activity`` records) and when it last made progress: a
:class:`~ddpdoctor.analysis.hang_rules.RankProgress`. Whether that is a hang is
:func:`~ddpdoctor.analysis.hang_rules.decide`'s to say (:meth:`JobProgress.verdict`). The
traces are read only to diagnose.

In a job of several nodes this is one node's part: the nodes compare notes through the job's
store (:mod:`ddpdoctor.launch.coordination`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from ddpdoctor.analysis.hang_rules import (
    STILL_CPU,
    STILL_IO,
    STILL_TREE_CPU,
    Pending,
    RankProgress,
    decide,
    frame_text,
)
from ddpdoctor.trace import progress_block, schema
from ddpdoctor.trace.model import Collective, site_from
from ddpdoctor.trace.progress_block import field
from ddpdoctor.trace.records import collective_from
from ddpdoctor.trace.schema import Stop

PIDS_READ = 16384  # bytes of a trace's start that hold its process_start record

BLOCK_GLOB = schema.TRACE_GLOB + progress_block.SUFFIX
_is_block = re.compile(fnmatch.translate(BLOCK_GLOB)).match
MORE = -2  # the key of the collectives a block counts beyond those it lists
RELIST_SECONDS = 10.0  # the log folder is listed again at least this often (JobProgress._names)
FRESH_MTIME = 2.0  # and at every poll while its mtime is this recent (a change in the same tick)


class _Block:
    """One rank's progress block, followed from poll to poll."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.trace = Path(progress_block.trace_of(str(path)))
        self.generation: int | None = None
        self.key: tuple[int, int] = (-1, -1)  # (round, attempt)
        self.rank: int | None = None
        self.issued_id = 0
        self.activity_n = 0
        self._fd: int | None = None

    def read(self) -> dict[str, Any] | None:
        """What the block says, when it changed since the last read."""
        if self._fd is None:
            try:
                # Non-blocking: a FIFO by that name must not stop the watch.
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                return None
        got = progress_block.read(self._fd, self.generation)
        if got is None:
            return None
        try:
            state = json.loads(got[1])
        except ValueError:
            return None
        if not isinstance(state, dict) or not isinstance(state.get("rank"), int):
            return None
        self.generation = got[0]
        return state

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _site_text(c: Collective) -> str:
    site = c.site
    return f" at {Path(site.file).name}:{site.line}" if site else ""


def _listed(rank: int, entry: Any) -> Collective | None:
    """A pending collective as a block lists it (None when the entry is damaged)."""
    if not isinstance(entry, dict):
        return None
    frames = entry.get("frames")
    try:
        stack = [site_from(f) for f in frames] if isinstance(frames, list) else []
        return collective_from(rank, {**entry, "stack": 0}, {0: stack})
    except (KeyError, TypeError, ValueError):
        return None


class JobProgress:
    """Follows every rank's progress block in ``logdir``."""

    def __init__(self, logdir: str) -> None:
        self.logdir = Path(logdir)
        self.ranks: dict[int, RankProgress] = {}
        self.members: dict[str, list[int]] = {}  # group -> its ranks
        self._blocks: dict[str, _Block] = {}
        self._current: dict[int, _Block] = {}  # rank -> the block of its latest round
        self.started = time.time()
        self._deadlock_since: float | None = None
        self.reason = ""  # why the last verdict fired, in words
        self._listing: set[str] = set()  # the folder's names (_names)
        self._listed = (-1.0, -1.0)  # the folder's mtime when listed, and when that was

    # -- reading -----------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> None:
        now = now or time.time()
        names = self._names()
        for name in sorted(filter(_is_block, names)):
            block = self._blocks.get(name)
            if block is None:
                block = self._blocks[name] = _Block(self.logdir / name)
            if block.rank is not None and self._current.get(block.rank) is block:
                prog = self.ranks[block.rank]
                if not prog.cut and schema.cut_marker(block.trace.name) in names:
                    prog.cut = True
            state = block.read()
            if state is not None:
                self._apply(block, state, now)

    def _names(self) -> set[str]:
        """The names in the log folder: the blocks and the cut markers alike. Listed again
        only when the folder changed (its mtime; and while that is :data:`FRESH_MTIME`
        recent, since a second change in the same clock tick leaves it as it was) or
        :data:`RELIST_SECONDS` after the last listing: on a 2-core VM a listing after the
        launcher's second of sleep costs 1.5-3.5 ms of CPU, a ``stat`` 0.2-0.4
        (bench/RESULTS.md, session 37)."""
        try:
            mtime = os.stat(self.logdir).st_mtime
        except OSError:
            return set()
        clock = time.time()
        if mtime != self._listed[0] or clock - mtime < FRESH_MTIME or \
                clock - self._listed[1] >= RELIST_SECONDS:
            try:
                with os.scandir(self.logdir) as entries:
                    self._listing = {entry.name for entry in entries}
            except OSError:
                return set()
            self._listed = (mtime, clock)
        return self._listing

    def _apply(self, block: _Block, state: dict[str, Any], now: float) -> None:
        rank = state["rank"]
        key = (field(state, "round", int, 0), field(state, "attempt", int, 0))
        current = self._current.get(rank)
        if current is not block:
            if current is not None and current.key >= key:
                return  # an earlier round's or attempt's block
            # A rank's next round (its process group made again) starts afresh.
            block.rank, block.key = rank, key
            self._current[rank] = block
            self.ranks[rank] = RankProgress(rank, last_progress=now, round=key[0])
        prog = self.ranks[rank]
        issued_id = field(state, "issued_id", int, 0)
        if issued_id > block.issued_id:
            # Issuing is progress: a rank back from a long checkpoint that joins the barrier
            # its peers wait in must not read as a hang until its completion is seen.
            block.issued_id = issued_id
            prog.last_op = field(state, "last_op", str, prog.last_op)
            prog.iteration = field(state, "iteration", int, 0) or prog.iteration
            # When the rank issued it (the block says so up to an interval later): an activity
            # record written after that is about the rank outside this collective.
            at = state.get("last_issue")
            prog.last_issue = min(now, float(at)) if isinstance(at, (int, float)) and \
                not isinstance(at, bool) and at > 0 else now
            prog.last_progress = now
            prog.still_since = None
            prog.pending.pop(-1, None)
        completed = field(state, "completed", int, 0)
        if completed > prog.completed:
            prog.completed, prog.last_progress = completed, now
        self._pending(prog, state, now)
        issued = field(state, "issued", dict, {})
        prog.issued = {str(g): s for g, s in issued.items() if isinstance(s, int)}
        for group, ranks in field(state, "groups", dict, {}).items():
            if isinstance(ranks, list) and all(isinstance(r, int) for r in ranks):
                self.members[str(group)] = list(ranks)
        prog.world_size = field(state, "world_size", int, prog.world_size)
        # Waiting in init_process_group counts as waiting in a collective (key 0).
        if state.get("init") == schema.PENDING:
            prog.pending.setdefault(0, Pending(now, "init_process_group"))
        elif prog.pending.pop(0, None) is not None:
            prog.last_progress = now
        activity_n = field(state, "activity_n", int, 0)
        if activity_n != block.activity_n and isinstance(state.get("activity"), dict):
            # Two since the last poll (a slow poll): the earlier one tells since when the rank
            # has been still.
            if activity_n - block.activity_n >= 2 and \
                    isinstance(state.get("activity_before"), dict):
                self._activity(prog, state["activity_before"])
            block.activity_n = activity_n
            self._activity(prog, state["activity"])
        prog.cut = prog.cut or state.get("cut") is True
        status = field(state, "status", str, schema.RUNNING)
        if status != schema.RUNNING:
            prog.status = status
        if state.get("exited") is True:
            prog.pending.clear()

    @staticmethod
    def _pending(prog: RankProgress, state: dict[str, Any], now: float) -> None:
        """The block's running collectives into ``prog.pending``: those it no longer lists
        completed, those new to it waited in since the rank issued them."""
        entries = field(state, "pending", list, [])
        listed: dict[Any, dict] = {e.get("id"): e for e in entries if isinstance(e, dict)}
        for cid in [i for i in prog.pending if i > 0 and i not in listed]:
            del prog.pending[cid]
        for cid, entry in listed.items():
            if not isinstance(cid, int) or cid <= 0 or cid in prog.pending:
                continue
            c = _listed(prog.rank, entry)
            what = f"{c.op} ({c.label}){_site_text(c)}" if c is not None else "a collective"
            # Waiting since the rank issued it (the block tells it up to an interval later).
            t = entry.get("t")
            seen = min(now, float(t)) if isinstance(t, (int, float)) and t > 0 else now
            prog.pending[cid] = Pending(seen, what, c)
        more = field(state, "pending_count", int, 0) - len(listed)
        if more > 0:
            # Not listed, so never known to be unmatched: no deadlock is proved on them.
            prog.pending.setdefault(MORE, Pending(now, f"{more} more collectives"))
        else:
            prog.pending.pop(MORE, None)

    @staticmethod
    def _activity(prog: RankProgress, rec: dict) -> None:
        previous = prog.activity
        prog.activity = rec
        # A rank whose collectives ddpdoctor does not record (flight-recorder mode, NCCL) is
        # known to wait in one only from where its main thread is: key -1 stands for it.
        # Only then: where ddpdoctor records every group, such a stack with nothing pending is
        # a call the record does not hold (a store-based barrier, a monitored barrier), not a
        # wait in a collective, and a rank there is never counted as waiting.
        inside = bool(rec.get("in_collective")) and not rec.get("pending") and \
            0 not in prog.pending
        prog.hole = inside and not rec.get("unrecorded")
        if inside and rec.get("unrecorded"):
            where = frame_text(rec)
            prog.pending.setdefault(-1, Pending(float(rec.get("quiet_since", 0.0)),
                                                f"a collective called from {where or '?'}"))
        elif not rec.get("in_collective"):
            prog.pending.pop(-1, None)
        cpu, t = rec.get("cpu"), float(rec.get("t", 0.0))
        rate = rec.get("cpu_rate")
        prog.cpu_rate = float(rate) if isinstance(rate, (int, float)) else None
        frames = rec.get("frames")
        same_place = previous is not None and previous.get("frames") == frames and \
            previous.get("t", 0) >= prog.last_issue
        io, tree = rec.get("io_rate"), rec.get("tree_cpu_rate")
        # The first record after a collective has no I/O figure yet (it needs two readings):
        # judged by its main thread alone, a rank writing a checkpoint at no CPU looks idle.
        measured = isinstance(io, (int, float)) or isinstance(tree, (int, float))
        idle = measured and prog.cpu_rate is not None and prog.cpu_rate < STILL_CPU and \
            not (isinstance(io, (int, float)) and io >= STILL_IO) and \
            not (isinstance(tree, (int, float)) and tree >= STILL_TREE_CPU)
        if not (same_place and idle and isinstance(cpu, (int, float))):
            prog.still_since = t if idle else None
        elif prog.still_since is None:
            # Still at the place the previous record found it: since then, when its main
            # thread was idle up to it too (that record, the first after a collective, had
            # no I/O figure to judge it by alone).
            before = (previous or {}).get("cpu_rate")
            prog.still_since = float((previous or {}).get("t", t)) if isinstance(
                before, (int, float)) and before < STILL_CPU else t

    def paths(self) -> dict[int, Path]:
        """Each rank's trace file (its latest round)."""
        return {rank: block.trace for rank, block in self._current.items()}

    def pids(self) -> set[int]:
        """The process ids of the ranks, from each trace's ``process_start`` record (its
        first lines; a process of every round)."""
        out: set[int] = set()
        for block in self._blocks.values():
            try:
                with open(block.trace, "rb") as fh:
                    head = fh.read(PIDS_READ).split(b"\n")[:4]
            except OSError:
                continue
            for line in head:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("kind") == schema.PROCESS_START and \
                        isinstance(rec.get("pid"), int):
                    out.add(rec["pid"])
        return out

    def close(self, remove: bool = False) -> None:
        """Let go of the blocks' files (``remove``: and delete them: the job has ended)."""
        for block in self._blocks.values():
            block.close()
        if remove:
            for path in self.logdir.glob(BLOCK_GLOB):
                try:
                    path.unlink()
                except OSError:
                    pass

    # -- verdicts ----------------------------------------------------------------------------
    def last_progress(self) -> float:
        return max((p.last_progress for p in self.ranks.values()), default=self.started)

    def live(self) -> list[RankProgress]:
        return [p for p in self.ranks.values() if p.status == schema.RUNNING]

    def verdict(self, timeout: float, stuck_timeout: float | None,
                now: float | None = None) -> Stop | None:
        """Whether to stop the job now (:func:`ddpdoctor.analysis.hang_rules.decide`); the
        reason is kept in :attr:`reason`."""
        decision = decide(self.ranks, self.members, timeout, stuck_timeout,
                          now or time.time(), self._deadlock_since)
        self._deadlock_since = decision.deadlock_since
        if decision.stop is not None:
            self.reason = decision.reason
        return decision.stop

    # -- words ---------------------------------------------------------------------------------
    def rank_line(self, p: RankProgress, now: float) -> str:
        """'waiting 12s in all_reduce (ddp.bucket) at train.py:33', 'busy 45s in save() at
        train.py:88', 'running', or how the rank ended."""
        if p.status != schema.RUNNING:
            return p.status
        if p.cut:
            return "running, its trace cut (a write failed)"
        oldest = p.oldest_pending()
        if p.waiting and oldest is not None:
            return f"waiting {now - oldest.seen:.0f}s in {oldest.what}"
        act = p.fresh_activity()
        if act is not None:
            where = p.place()
            if p.still_since is not None:  # no CPU, no I/O, the same place
                return f"blocked {now - p.still_since:.0f}s" + (f" in {where}" if where else "")
            quiet = now - float(act.get("quiet_since", now))
            text = f"busy {quiet:.0f}s" + (f" in {where}" if where else "")
            if p.hole:
                text += " (inside a torch.distributed call ddpdoctor does not record)"
            return text
        return "running"

    def summary_line(self, now: float | None = None) -> str:
        now = now or time.time()
        parts = [f"r{r}: iter {self.ranks[r].iteration}, {self.ranks[r].completed} done, "
                 f"{self.rank_line(self.ranks[r], now)}" for r in sorted(self.ranks)]
        return "; ".join(parts) or "waiting for ranks to start"
