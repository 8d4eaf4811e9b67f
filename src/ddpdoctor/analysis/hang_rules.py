"""The hang rules: when the launcher stops a running job, as one pure function of what it
knows of each rank (:class:`RankProgress`, read from the ranks' progress blocks by
``launch/monitor.py``).

A rank is *waiting* when it has a collective pending and its main thread uses no CPU (a rank
with none pending, or one computing while an asynchronous collective runs, is not). Outside
collectives a rank is *busy* while its process uses CPU or does I/O, and *blocked* when it has
used neither at one place of its own code. :func:`decide` stops the job for

* **hang** — every live rank has been waiting for ``timeout`` seconds and none progressed
  (completed or issued a collective) for as long;
* **deadlock** — every live rank is waiting and no pending collective can ever complete: each
  lacks a live group member that has not issued it (and is itself waiting), or meets
  a collective it provably cannot match (another op, shape, dtype, reduce op or root at the
  same position). Held for :data:`SETTLE` seconds, it is called at once, without waiting
  for the timeout;
* **stuck** — a live rank has been blocked for ``timeout`` seconds while every other live
  rank waited in a collective as long (they wait for it), or for ``stuck_timeout`` seconds
  whoever waits.

A stack inside ``torch.distributed`` with nothing pending counts as waiting only where a group
is not recorded by ddpdoctor (flight-recorder mode); elsewhere it is a hole in the record, and
the rank is busy. The rules are written once, in :func:`decide_view`, over a
:class:`WorldView`: one node's ranks give it (:func:`view_of`), and in a job of several nodes
the merged node digests do (:mod:`ddpdoctor.analysis.digest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ddpdoctor.analysis.signature import hard_difference
from ddpdoctor.trace import schema
from ddpdoctor.trace.model import Collective
from ddpdoctor.trace.records import is_p2p
from ddpdoctor.trace.schema import Stop

SETTLE = 0.2  # seconds a provable deadlock must hold before it is called
BUSY_CPU = 0.3  # share of one core above which a rank with a collective pending is computing
STILL_CPU = 0.01  # share of one core below which a rank outside collectives is idle
STILL_IO = 16 * 1024  # bytes/s of reads and writes below which it is idle (a download is not)
# CPU share of the rank's whole process tree (its threads, ddpdoctor's included, and child
# processes) below which it is idle: ddpdoctor's own threads use well under 1 %.
STILL_TREE_CPU = 0.05


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
    status: str = schema.RUNNING  # running | finished | exception | failed | max_steps
    activity: dict | None = None  # the last activity record (the rank outside collectives)
    cpu_rate: float | None = None  # main-thread CPU share between the last two activities
    still_since: float | None = None  # the activity's place and CPU unchanged since then
    world_size: int | None = None
    cut: bool = False  # the rank could no longer write its trace: what it does is unknown
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
        if not self.pending or self.status != schema.RUNNING or self.cut:
            return False
        return self.fresh_activity() is None or self.cpu_rate is None or \
            self.cpu_rate < BUSY_CPU

    @property
    def idle(self) -> bool:
        """Running, with nothing pending, outside torch.distributed, and still at one place
        (no CPU, no I/O) since :attr:`still_since`."""
        return self.status == schema.RUNNING and not self.pending and not self.hole and \
            self.still_since is not None

    @property
    def blocked(self) -> bool:
        """Waiting, and the watchdog has seen the main thread idle since the last collective."""
        return self.waiting and self.fresh_activity() is not None and self.cpu_rate is not None

    def place(self) -> str:
        """Where the main thread is, from the last activity record: 'save() at train.py:88',
        or 'queue.get() in load() at train.py:26' when it is inside a library call."""
        act = self.fresh_activity()
        where, call = frame_text(act), (act or {}).get("call")
        return f"{str(call)[:80]} in {where}" if call and where else where


def frame_text(activity: dict | None) -> str:
    """'save() at train.py:88': the innermost user frame of an activity record ('' if none)."""
    frames = (activity or {}).get("frames") or []
    if not frames or not isinstance(frames[0], dict):
        return ""
    f = frames[0]
    name = Path(str(f.get("file", "?"))).name
    return f"{f.get('function', '?')}() at {name}:{f.get('line', '?')}"


class Idle(NamedTuple):
    """The rank idle longest at one place outside collectives: how long, and where."""

    rank: int
    seconds: float
    place: str


@dataclass(frozen=True)
class WorldView:
    """What the hang rules look at, the same whether it was read from one node's ranks
    (:func:`view_of`) or merged from the digests of several nodes (``digest.world_view``).

    ``live``, ``waiting``, ``blocked``: ranks running, waiting in a collective, and waiting
    with their main thread seen idle; ``quiet``: seconds since any rank progressed; ``wait``:
    the shortest time any waiting rank has waited (None when none waits); ``idle``: the rank
    idle longest at one place outside collectives, of ``idle_count`` such ranks;
    ``unmatched``: no pending collective of any rank can ever complete (each lacks a peer for
    good, or meets one it cannot match); ``known``: every rank of the world is accounted
    for (no node's digest missing)."""

    live: int
    waiting: int
    blocked: int
    quiet: float
    wait: float | None
    idle: Idle | None
    idle_count: int
    unmatched: bool
    known: bool = True


@dataclass
class Decision:
    """What :func:`decide` found: the stop (None: let the job run), why in words, since when
    every rank has provably been deadlocked (to pass to the next call), and, over several
    nodes, the ranks whose details every node fetches to diagnose it."""

    stop: Stop | None
    reason: str = ""
    deadlock_since: float | None = None
    named: tuple[int, ...] = ()


def view_of(ranks: dict[int, RankProgress], members: dict[str, list[int]],
            now: float) -> WorldView:
    """The view of one node's ranks. ``members``: group -> its ranks (the world when a group
    is not listed)."""
    live = [p for p in ranks.values() if p.status == schema.RUNNING]
    waiting = [p for p in live if p.waiting]
    blocked = [p for p in live if p.blocked]
    idle = [p for p in live if p.idle]
    longest = min(idle, key=lambda p: (p.still_since, p.rank), default=None)
    oldest = [p.oldest_pending() for p in waiting]
    return WorldView(
        live=len(live), waiting=len(waiting), blocked=len(blocked),
        quiet=now - max((p.last_progress for p in ranks.values()), default=now),
        wait=min((now - o.seen for o in oldest if o is not None), default=None),
        idle=Idle(longest.rank, now - (longest.still_since or now), longest.place())
        if longest is not None else None,
        idle_count=len(idle),
        unmatched=bool(live) and len(blocked) == len(live) and
        _provably_stuck(ranks, members, live))


def decide(ranks: dict[int, RankProgress], members: dict[str, list[int]], timeout: float,
           stuck_timeout: float | None, now: float,
           deadlock_since: float | None = None) -> Decision:
    """Whether to stop a job of one node now: :func:`decide_view` of its ranks' view."""
    return decide_view(view_of(ranks, members, now), timeout, stuck_timeout, now,
                       deadlock_since)


def decide_view(view: WorldView, timeout: float, stuck_timeout: float | None, now: float,
                deadlock_since: float | None = None) -> Decision:
    """Whether to stop the job now, by the module's rules: the one place they are written.
    Nothing is decided while a rank of the world is not accounted for."""
    if not view.known or not view.live:
        return Decision(None)
    everyone_waits = view.waiting == view.live
    if everyone_waits and view.blocked == view.live and view.unmatched:
        deadlock_since = deadlock_since or now
        if now - deadlock_since >= SETTLE:
            return Decision(Stop.DEADLOCK, "the pending collectives of every rank can "
                            "never match", deadlock_since)
    else:
        deadlock_since = None
    waited = view.wait is not None and view.wait >= timeout
    if everyone_waits and waited and view.quiet >= timeout:
        return Decision(Stop.HANG, f"every rank waited in a collective for {timeout:g}s",
                        deadlock_since)
    idle = view.idle
    if idle is not None and idle.seconds >= timeout and waited and \
            view.waiting == view.live - view.idle_count:
        return Decision(Stop.STUCK, f"rank {idle.rank} stayed in {idle.place or 'user code'} "
                        f"without using CPU or doing I/O for {timeout:g}s, outside any "
                        f"collective, while every other rank waited for it", deadlock_since)
    if idle is not None and stuck_timeout is not None and idle.seconds >= stuck_timeout:
        return Decision(Stop.STUCK, f"rank {idle.rank} stayed in {idle.place or 'user code'} "
                        f"without using CPU for {stuck_timeout:g}s, outside any collective",
                        deadlock_since)
    return Decision(None, "", deadlock_since)


def _world(ranks: dict[int, RankProgress]) -> list[int]:
    sizes = [p.world_size for p in ranks.values() if p.world_size]
    return list(range(max(sizes))) if sizes else sorted(ranks)


def _provably_stuck(ranks: dict[int, RankProgress], members: dict[str, list[int]],
                    live: list[RankProgress]) -> bool:
    """Every pending collective of every live rank lacks a peer for good, or meets one it
    cannot match. Needs every rank of the world to have a trace."""
    world = _world(ranks)
    if any(r not in ranks for r in world):
        return False
    for p in live:
        for pend in p.pending.values():
            c = pend.coll
            if c is None or c.seq is None or is_p2p(c) or \
                    not _blocked(ranks, members.get(c.group) or world, p, c):
                return False
    return True


def _blocked(ranks: dict[int, RankProgress], group: list[int], p: RankProgress,
             c: Collective) -> bool:
    for q in group:
        if q == p.rank:
            continue
        peer = ranks.get(q)
        if peer is None or peer.status != schema.RUNNING:
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
