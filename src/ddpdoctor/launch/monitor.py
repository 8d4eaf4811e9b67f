"""Live progress of a running job, read from the ranks' traces as they grow, and the hang rules.

The launcher tails each ``rank-*.jsonl`` (complete lines only) and keeps, per rank, the
collectives it issued and has not completed, how far it got in each group, what it does while
it issues no collective (the watchdog's ``activity`` records) and when it last made progress.

A rank is *waiting* when it has a collective pending and its main thread uses no CPU (a rank
with none pending, or one computing while an asynchronous collective runs, is *busy*). The
rules, applied by :meth:`JobProgress.verdict`:

* **hang** — every live rank has been waiting for ``timeout`` seconds and none progressed
  (completed or issued a collective) for as long;
* **deadlock** — every live rank is waiting and no pending collective can ever complete: each
  lacks a live group member that has not issued it (and is itself waiting), or meets
  a collective it provably cannot match (another op, shape, dtype, reduce op or root at the
  same position). Held for :data:`SETTLE` seconds, it is diagnosed at once, without waiting
  for the timeout;
* **stuck** — a live rank outside collectives has stayed at the same place in user code
  without using CPU or doing I/O (*blocked*) for ``timeout`` seconds while every other live
  rank waited in a collective as long (they wait for it), or for ``stuck_timeout`` seconds
  whoever waits.

A stack inside ``torch.distributed`` with nothing pending counts as waiting only where a group
is not recorded by ddpdoctor (flight-recorder mode); elsewhere it is a hole in the record
(shown in the live view), and the rank is busy, not waiting.

In a job of several nodes the ranks of the other nodes are known from the ``peers`` records
that local rank 0 copies from the job's c10d store (:mod:`ddpdoctor.runtime.peers`), so every
node's launcher applies the rules to the whole world.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.analysis.signature import hard_difference
from ddpdoctor.trace import schema
from ddpdoctor.trace.model import Collective, Site, site_from
from ddpdoctor.trace.records import collective_from, is_p2p

SETTLE = 0.2  # seconds a provable deadlock must hold before it is called
REMOTE_STALE = 5.0  # seconds after which a remote rank's last summary says nothing
BUSY_CPU = 0.3  # share of one core above which a rank with a collective pending is computing
STILL_CPU = 0.01  # share of one core below which a rank outside collectives is idle
STILL_IO = 16 * 1024  # bytes/s of reads and writes below which it is idle (a download is not)

HANG, DEADLOCK, STUCK = "hang", "deadlock", "stuck"
RUNNING = "running"


@dataclass
class Pending:
    """A collective a rank issued and has not completed (or ``init_process_group``)."""

    seen: float
    what: str
    coll: Collective | None = None  # None for init_process_group


@dataclass
class RankProgress:
    """What the launcher knows of one rank while the job runs."""

    rank: int
    completed: int = 0
    pending: dict[int, Pending] = field(default_factory=dict)  # id (0: init) -> what
    issued: dict[str, int] = field(default_factory=dict)  # group -> highest seq issued
    iteration: int = 0
    last_op: str = ""
    last_progress: float = 0.0
    last_issue: float = 0.0  # when the launcher saw the last collective issued
    status: str = RUNNING  # running | finished | exception | failed | max_steps
    activity: dict | None = None  # the last activity record (the rank outside collectives)
    cpu_rate: float | None = None  # main-thread CPU share between the last two activities
    still_since: float | None = None  # the activity's place and CPU unchanged since then
    world_size: int | None = None
    cut: bool = False  # the rank could no longer write its trace: what it does is unknown
    remote: bool = False  # on another node: known from the peers records of local ranks
    updated: float = 0.0  # when a peers record last described this remote rank
    round: int = 0  # the round of the process it follows (a second mp.spawn: round 1)
    hole: bool = False  # its main thread is inside torch.distributed with nothing recorded

    def oldest_pending(self) -> Pending | None:
        return min(self.pending.values(), key=lambda p: p.seen, default=None)

    def fresh_activity(self) -> dict | None:
        """The activity record, when it was written after the last collective."""
        act = self.activity
        return act if act is not None and act.get("t", 0) >= self.last_issue else None

    @property
    def waiting(self) -> bool:
        """In a collective: one pending and the main thread not known to be computing. A rank
        whose trace is cut is never known to wait, so no hang is declared while it runs."""
        if not self.pending or self.status != RUNNING or self.cut:
            return False
        return self.fresh_activity() is None or self.cpu_rate is None or \
            self.cpu_rate < BUSY_CPU

    @property
    def blocked(self) -> bool:
        """Waiting, and the watchdog has seen the main thread idle since the last collective."""
        return self.waiting and self.fresh_activity() is not None and self.cpu_rate is not None

    def place(self) -> str:
        """Where the main thread is, from the last activity record: 'save() at train.py:88'."""
        return frame_text(self.fresh_activity())


def frame_text(activity: dict | None) -> str:
    """'save() at train.py:88': the innermost user frame of an activity record ('' if none)."""
    frames = (activity or {}).get("frames") or []
    if not frames or not isinstance(frames[0], dict):
        return ""
    f = frames[0]
    name = Path(str(f.get("file", "?"))).name
    return f"{f.get('function', '?')}() at {name}:{f.get('line', '?')}"


_READ_BLOCK = 64 * 1024


class _Tail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.rank: int | None = None
        self.round = 0
        self.stacks: dict[int, list[Site]] = {}

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
                    prog.remote = False
                elif tail.rank is not None and tail.round == self.ranks[tail.rank].round:
                    try:
                        self._apply(self.ranks[tail.rank], tail, rec, now)
                    except (KeyError, TypeError, ValueError, AttributeError):
                        continue  # a malformed record: the diagnosis reports it

    def _apply(self, prog: RankProgress, tail: _Tail, rec: dict, now: float) -> None:
        kind = rec.get("kind")
        if kind == schema.COLLECTIVE:
            c = collective_from(prog.rank, rec, tail.stacks)
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
        elif kind == schema.GROUP:
            self.members[str(rec["group"])] = [int(r) for r in rec.get("ranks", [])]
        elif kind == schema.PROCESS_START:
            if isinstance(rec.get("world_size"), int):
                prog.world_size = rec["world_size"]
        elif kind == schema.ACTIVITY:
            self._activity(prog, rec)
        elif kind == schema.PEERS:
            for key, state in (rec.get("ranks") or {}).items():
                self._peer(int(key), state, now)
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

    def _peer(self, rank: int, state: dict, now: float) -> None:
        """A rank of another node, as its last summary in the store describes it."""
        prog = self.ranks.get(rank)
        if prog is None:
            prog = self.ranks[rank] = RankProgress(rank, last_progress=now, remote=True)
        if not prog.remote:
            return  # a local rank: its own trace is the better source
        prog.updated = now
        status = str(state.get("status", RUNNING))
        prog.status = status
        prog.iteration = int(state.get("iteration") or prog.iteration)
        if isinstance(state.get("world_size"), int):
            prog.world_size = state["world_size"]
        completed = int(state.get("completed") or 0)
        if completed > prog.completed:
            prog.completed, prog.last_progress = completed, now
        prog.issued = {str(g): int(q) for g, q in (state.get("issued") or {}).items()}
        pending: dict[int, Pending] = {}
        for item in state.get("pending") or []:
            site = item.get("site")
            c = Collective(rank=rank, id=int(item["id"]), group=str(item["group"]),
                           seq=item.get("seq"), op=str(item["op"]),
                           label=str(item.get("label", "user")), shapes=item.get("shapes", []),
                           dtypes=item.get("dtypes", []), numel=int(item.get("numel", 0)),
                           reduce_op=item.get("reduce_op"), root=item.get("root"),
                           peer=item.get("peer"),
                           stack=[Site(str(site[0]), int(site[1]), str(site[2]))] if site else [])
            old = prog.pending.get(c.id)
            pending[c.id] = Pending(old.seen if old else now, f"{c.op} ({c.label})"
                                    + _site_text(c), c)
        prog.pending = pending
        activity = state.get("activity")
        prog.activity = activity if isinstance(activity, dict) else None
        prog.last_issue = 0.0  # the summary's activity is already the one after the last op
        rate = (prog.activity or {}).get("cpu_rate")
        prog.cpu_rate = float(rate) if isinstance(rate, (int, float)) else None

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
        io = rec.get("io_rate")
        idle = prog.cpu_rate is not None and prog.cpu_rate < STILL_CPU and \
            not (isinstance(io, (int, float)) and io >= STILL_IO)
        if not (same_place and idle and isinstance(cpu, (int, float))):
            prog.still_since = t if idle else None
        elif prog.still_since is None:
            prog.still_since = t

    # -- verdicts ----------------------------------------------------------------------------
    def last_progress(self) -> float:
        return max((p.last_progress for p in self.ranks.values()), default=self.started)

    def live(self) -> list[RankProgress]:
        return [p for p in self.ranks.values() if p.status == RUNNING]

    def verdict(self, timeout: float, stuck_timeout: float | None,
                now: float | None = None) -> str | None:
        """``hang``, ``deadlock``, ``stuck`` or None (see the module's rules)."""
        now = now or time.time()
        live = self.live()
        # Another node's rank known only from an old summary (its node's ranks ended, or the
        # store went quiet) may be doing anything: no hang is called on it; and a node none of
        # whose own ranks still runs has nothing to stop.
        known = not any(p.remote and now - p.updated > REMOTE_STALE for p in live) and \
            any(not p.remote for p in live)
        if known and all(p.waiting for p in live):
            if all(p.blocked for p in live) and self._provably_stuck(live):
                self._deadlock_since = self._deadlock_since or now
                if now - self._deadlock_since >= SETTLE:
                    self.reason = "the pending collectives of every rank can never match"
                    return DEADLOCK
            else:
                self._deadlock_since = None
            oldest = min(pend.seen for p in live for pend in p.pending.values())
            if now - oldest >= timeout and now - self.last_progress() >= timeout:
                self.reason = f"every rank waited in a collective for {timeout:g}s"
                return HANG
        else:
            self._deadlock_since = None
        blocker = self._waited_for(live, timeout, now) if known else None
        if blocker is not None:
            self.reason = (f"rank {blocker.rank} stayed in {blocker.place() or 'user code'} "
                           f"without using CPU or doing I/O for {timeout:g}s, outside any "
                           f"collective, while every other rank waited for it")
            return STUCK
        if stuck_timeout is not None:
            for p in live:
                if not p.pending and p.still_since is not None and \
                        now - p.still_since >= stuck_timeout:
                    self.reason = (f"rank {p.rank} stayed in {p.place() or 'user code'} without "
                                   f"using CPU for {stuck_timeout:g}s, outside any collective")
                    return STUCK
        return None

    @staticmethod
    def _waited_for(live: list[RankProgress], timeout: float,
                    now: float) -> RankProgress | None:
        """The first rank idle at one place outside collectives for ``timeout`` seconds while
        every other live rank has waited in a collective as long: the rank they wait for."""
        idle = [p for p in live if not p.pending and not p.hole and p.still_since is not None
                and now - p.still_since >= timeout]
        waiting = [p for p in live if p not in idle]
        if not idle or not waiting or not all(p.waiting for p in waiting):
            return None
        oldest = min(pend.seen for p in waiting for pend in p.pending.values())
        return idle[0] if now - oldest >= timeout else None

    def _world(self) -> list[int]:
        sizes = [p.world_size for p in self.ranks.values() if p.world_size]
        return list(range(max(sizes))) if sizes else sorted(self.ranks)

    def _provably_stuck(self, live: list[RankProgress]) -> bool:
        """Every pending collective of every live rank lacks a peer for good, or meets one it
        cannot match. Needs every rank of the world to have a trace."""
        world = self._world()
        if any(r not in self.ranks for r in world):
            return False
        for p in live:
            for pend in p.pending.values():
                c = pend.coll
                if c is None or c.seq is None or is_p2p(c) or not self._blocked(p, c, world):
                    return False
        return True

    def _blocked(self, p: RankProgress, c: Collective, world: list[int]) -> bool:
        members = self.members.get(c.group) or world
        for q in members:
            if q == p.rank:
                continue
            peer = self.ranks.get(q)
            if peer is None or peer.status != RUNNING:
                # A peer that ended: the backend fails the collective by itself (gloo: the
                # connection closes), else the timeout rule applies.
                return False
            if peer.issued.get(c.group, 0) < (c.seq or 0):
                return True  # q never issued it, and is waiting elsewhere
            other = next((x.coll for x in peer.pending.values()
                          if x.coll is not None and x.coll.group == c.group
                          and x.coll.seq == c.seq), None)
            if other is not None and hard_difference(c, other) is not None:
                return True
        return False

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
