"""Live progress of a running job, read from the ranks' traces as they grow.

The launcher tails each ``rank-*.jsonl`` (complete lines only) and keeps, per rank, the
collectives it issued and has not completed, how far it got in each group, what it does while
it issues no collective (the watchdog's ``activity`` records) and when it last made progress:
a :class:`~ddpdoctor.analysis.hang_rules.RankProgress`. Whether that is a hang is
:func:`~ddpdoctor.analysis.hang_rules.decide`'s to say (:meth:`JobProgress.verdict`).

In a job of several nodes this is one node's part: the nodes compare notes through the job's
store (:mod:`ddpdoctor.launch.coordination`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ddpdoctor.analysis.hang_rules import (
    RUNNING,
    STILL_CPU,
    STILL_IO,
    STILL_TREE_CPU,
    Pending,
    RankProgress,
    decide,
    frame_text,
)
from ddpdoctor.trace import schema
from ddpdoctor.trace.model import Collective, Site, site_from
from ddpdoctor.trace.records import collective_from, site_fields, with_site
from ddpdoctor.trace.schema import Stop

_READ_BLOCK = 64 * 1024


class _Tail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.rank: int | None = None
        self.round = 0
        self.stacks: dict[int, list[Site]] = {}
        self.sites: dict[int, dict] = {}  # format 9: static parts by site id

    def lines(self) -> list[bytes]:
        # A running rank's trace ends in the NUL bytes its writer has reserved (see
        # trace/padding.py): its data so far ends at the first of them.
        blocks: list[bytes] = []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                while True:
                    block = fh.read(_READ_BLOCK)
                    pad = block.find(b"\0")
                    blocks.append(block if pad < 0 else block[:pad])
                    if pad >= 0 or len(block) < _READ_BLOCK:
                        break
        except OSError:
            return []
        data = b"".join(blocks)
        self.offset += len(data)
        data = self.rest + data
        parts = data.split(b"\n")
        self.rest = parts.pop()
        return parts


def _site_text(c: Collective) -> str:
    site = c.site
    return f" at {Path(site.file).name}:{site.line}" if site else ""


class JobProgress:
    """Follows every rank trace in ``logdir``."""

    def __init__(self, logdir: str) -> None:
        self.logdir = Path(logdir)
        self.ranks: dict[int, RankProgress] = {}
        self.members: dict[str, list[int]] = {}  # group -> its ranks
        self._tails: dict[str, _Tail] = {}
        self.started = time.time()
        self._deadlock_since: float | None = None
        self.reason = ""  # why the last verdict fired, in words

    # -- reading -----------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> None:
        now = now or time.time()
        for path in self.logdir.glob(schema.TRACE_GLOB):
            tail = self._tails.get(path.name)
            if tail is None:
                tail = self._tails[path.name] = _Tail(path)
            if tail.rank is not None and not self.ranks[tail.rank].cut and \
                    os.path.exists(schema.cut_marker(str(path))):
                self.ranks[tail.rank].cut = True
            for raw in tail.lines():
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(rec, dict):
                    continue
                if rec.get("kind") == schema.HEADER:
                    try:
                        tail.rank = int(rec.get("rank", -1))
                        tail.round = int(rec.get("round", 0))
                    except (TypeError, ValueError):
                        continue
                    prog = self.ranks.get(tail.rank)
                    if prog is None or tail.round > prog.round:
                        # A rank's next round (its process group made again) starts afresh.
                        prog = self.ranks[tail.rank] = RankProgress(
                            tail.rank, last_progress=now, round=tail.round)
                elif tail.rank is not None and tail.round == self.ranks[tail.rank].round:
                    try:
                        self._apply(self.ranks[tail.rank], tail, rec, now)
                    except (KeyError, TypeError, ValueError, AttributeError):
                        continue  # a malformed record: the diagnosis reports it

    def _apply(self, prog: RankProgress, tail: _Tail, rec: dict, now: float) -> None:
        kind = rec.get("kind")
        if kind == schema.COLLECTIVE:
            c = collective_from(prog.rank, with_site(rec, tail.sites), tail.stacks)
            prog.last_op = f"{c.op} ({c.label})"
            prog.iteration = c.iteration or prog.iteration
            # Issuing is progress: a rank back from a long checkpoint that joins the barrier
            # its peers wait in must not read as a hang until its completion is seen.
            prog.last_issue = prog.last_progress = now
            prog.still_since = None
            prog.pending.pop(-1, None)
            if c.seq is not None:
                prog.issued[c.group] = max(prog.issued.get(c.group, 0), c.seq)
            if c.state == schema.PENDING:
                prog.pending[c.id] = Pending(now, prog.last_op + _site_text(c), c)
            else:
                self._complete(prog, now)
        elif kind == schema.DONE:
            upto, listed = int(rec["upto"]), set(rec.get("pending") or [])
            start = rec.get("pending_from")
            for cid in [i for i in prog.pending if 0 < i <= upto and i not in listed
                        and (start is None or i < start)]:
                del prog.pending[cid]
                self._complete(prog, now)
        elif kind == schema.STATE:
            if prog.pending.pop(rec.get("id", -1), None) is not None:
                self._complete(prog, now)
        elif kind == schema.STACK:
            tail.stacks[int(rec["id"])] = [site_from(f) for f in rec.get("frames", [])]
        elif kind == schema.SITE:
            static = site_fields(rec)
            if static is not None:
                tail.sites[rec["id"]] = static
        elif kind == schema.GROUP:
            self.members[str(rec["group"])] = [int(r) for r in rec.get("ranks", [])]
        elif kind == schema.PROCESS_START:
            if isinstance(rec.get("world_size"), int):
                prog.world_size = rec["world_size"]
        elif kind == schema.ACTIVITY:
            self._activity(prog, rec)
        elif kind == schema.INIT:
            # Waiting in init_process_group counts as waiting in a collective (key 0).
            if rec.get("state") == schema.PENDING:
                prog.pending[0] = Pending(now, "init_process_group")
            elif prog.pending.pop(0, None) is not None:
                prog.last_progress = now
        elif kind == schema.EXCEPTION:
            prog.status = "exception"
        elif kind == schema.EXIT:
            prog.status = str(rec.get("status", "finished"))
            prog.pending.clear()

    @staticmethod
    def _complete(prog: RankProgress, now: float) -> None:
        prog.completed += 1
        prog.last_progress = now

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
            prog.still_since = t

    def paths(self) -> dict[int, Path]:
        """Each rank's trace file (its latest round)."""
        return {t.rank: t.path for t in self._tails.values()
                if t.rank is not None and t.rank in self.ranks
                and t.round == self.ranks[t.rank].round}

    # -- verdicts ----------------------------------------------------------------------------
    def last_progress(self) -> float:
        return max((p.last_progress for p in self.ranks.values()), default=self.started)

    def live(self) -> list[RankProgress]:
        return [p for p in self.ranks.values() if p.status == RUNNING]

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
        if p.status != RUNNING:
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
