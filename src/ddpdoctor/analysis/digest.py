"""Node digests: what one node's launcher tells the others, and the world verdict drawn from them.

In a job of several nodes each node's launcher sees its own ranks only. Rather than every rank
publishing its state to the job's store (traffic growing as nodes x ranks), each launcher
publishes one compact *digest* of its ranks, merged with the digests of the nodes below it in
a tree of fan-out :data:`FANOUT` (node ``k``'s children are ``16k+1 .. 16k+16``), so that a
node reads at most 16 digests and node 0 holds the whole world's. Node 0 decides with
:func:`world_decision` — the hang rules of :mod:`ddpdoctor.analysis.hang_rules`, the same
engine a single node uses, over the merged digest's :class:`WorldView` — and publishes the
verdict; every node reads it (``launch/coordination.py`` moves the digests;
docs/architecture.md has the arithmetic).

A digest (:class:`Digest`) is counts and bounded lists, never per rank; on the wire
(:meth:`Digest.wire`, :meth:`Digest.from_wire`) a JSON object::

    {"nodes": 3, "unknown": 0, "ranks": 6, "world": 6, "live": 6, "waiting": 6,
     "blocked": 6, "quiet": 12.5, "wait": 11.9, "idle": null, "idle_count": 0,
     "pending": [["0", 9, "3f1c...", 0, 1, "barrier (user) at train.py:30"], ...],
     "issued": {"0": [9, 2]}, "ended": [[5, "finished"]]}

``quiet``: seconds since any rank below last progressed; ``wait``: the shortest time any
waiting rank has waited; ``pending``: ``[group, seq, signature, lowest rank, ranks, what]``
per distinct pending collective, positions with two signatures (which can never match) and
the lowest positions kept first. Ages are as of the moment a digest was written; a reader adds
the time since it received it. Pure functions, no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from ddpdoctor.analysis.hang_rules import (
    Decision,
    Idle,
    RankProgress,
    WorldView,
    decide_view,
    view_of,
)
from ddpdoctor.analysis.signature import match_key
from ddpdoctor.trace import schema
from ddpdoctor.trace.model import Collective
from ddpdoctor.trace.records import is_p2p
from ddpdoctor.trace.schema import Stop

FANOUT = 16
MAX_PENDING = 12  # distinct pending collectives a digest lists
MAX_ENDED = 4  # ended ranks a digest names
MAX_GROUPS = 16  # groups whose lowest issued position a digest lists
MAX_NAMED = 8  # ranks a verdict names (their details are fetched by every node)
WHAT_CHARS = 100


def parent(node: int) -> int | None:
    """The node whose digest includes this node's (None for node 0)."""
    return None if node <= 0 else (node - 1) // FANOUT


def children(node: int, nnodes: int) -> list[int]:
    """The nodes whose digests this node reads and merges."""
    first = node * FANOUT + 1
    return list(range(first, min(first + FANOUT, nnodes)))


def depth(node: int) -> int:
    """Hops from ``node`` up to node 0."""
    hops = 0
    while node > 0:
        node, hops = (node - 1) // FANOUT, hops + 1
    return hops


def height(nnodes: int) -> int:
    """Hops from the farthest node of a job of ``nnodes`` to node 0 (the last is deepest)."""
    return depth(nnodes - 1)


def subtree_size(node: int, nnodes: int) -> int:
    """Nodes in the subtree of ``node``: itself and every node below it."""
    return 1 + sum(subtree_size(c, nnodes) for c in children(node, nnodes))


def signature(c: Collective) -> str:
    """A short hash of the match key (two differ: they can never match)."""
    return hashlib.blake2b(repr(match_key(c)).encode(), digest_size=8).hexdigest()


class PendingEntry(NamedTuple):
    """One distinct pending collective of a digest (a JSON list on the wire): its position,
    its match key's hash, the lowest rank waiting in it, how many ranks do, and in words."""

    group: str
    seq: int
    signature: str
    rank: int
    ranks: int
    what: str


class Issued(NamedTuple):
    """The lowest position issued in a group, and the lowest rank that issued no more."""

    seq: int
    rank: int


class Ended(NamedTuple):
    """A rank that ended, and how (its progress block's status)."""

    rank: int
    status: str


def _typed(raw: Any, kind: Any, types: tuple) -> Any:
    """``raw`` (a JSON list) as the named tuple ``kind`` of fields of ``types``; None where it
    does not fit (a digest is read from another node: a malformed entry is left out)."""
    if not isinstance(raw, (list, tuple)) or len(raw) != len(types):
        return None
    try:
        return kind(*(t(v) for t, v in zip(types, raw)))
    except (TypeError, ValueError):
        return None


def _typed_all(raws: list, kind: Any, types: tuple) -> tuple:
    """The entries of ``raws`` that fit ``kind`` (:func:`_typed`), as named tuples."""
    return tuple(e for e in (_typed(raw, kind, types) for raw in raws) if e is not None)


PENDING_TYPES = (str, int, str, int, int, str)  # the fields of a PendingEntry


@dataclass(frozen=True)
class Digest:
    """One node's ranks, or a subtree's merged: counts, and the few entries a verdict names."""

    nodes: int = 1
    unknown: int = 0  # nodes below whose digest is missing or stale
    ranks: int = 0
    world: int = 0
    live: int = 0
    waiting: int = 0
    blocked: int = 0
    idle_count: int = 0
    quiet: float = 0.0
    wait: float | None = None
    idle: Idle | None = None
    pending: tuple[PendingEntry, ...] = ()
    issued: Mapping[str, Issued] = field(default_factory=dict)
    ended: tuple[Ended, ...] = ()

    def wire(self) -> dict[str, Any]:
        """The digest as JSON values (named tuples become lists)."""
        return {"nodes": self.nodes, "unknown": self.unknown, "ranks": self.ranks,
                "world": self.world, "live": self.live, "waiting": self.waiting,
                "blocked": self.blocked, "idle_count": self.idle_count, "quiet": self.quiet,
                "wait": self.wait, "idle": list(self.idle) if self.idle else None,
                "pending": [list(e) for e in self.pending],
                "issued": {g: list(i) for g, i in self.issued.items()},
                "ended": [list(e) for e in self.ended]}

    @classmethod
    def from_wire(cls, raw: Any) -> Digest | None:
        """A digest read from another node's JSON; None where it is not one. A malformed
        entry is left out."""
        if not isinstance(raw, dict):
            return None
        try:
            wait = raw.get("wait")
            counts = {name: int(raw.get(name, default) or 0) for name, default in
                      (("nodes", 1), ("unknown", 0), ("ranks", 0), ("world", 0), ("live", 0),
                       ("waiting", 0), ("blocked", 0), ("idle_count", 0))}
            quiet = float(raw.get("quiet", 0.0) or 0.0)
            wait = None if wait is None else float(wait)
            issued = raw.get("issued") or {}
            pending, ended = raw.get("pending") or [], raw.get("ended") or []
            if not isinstance(issued, dict) or not isinstance(pending, list) or \
                    not isinstance(ended, list):
                return None
        except (TypeError, ValueError):
            return None
        lows = {str(g): _typed(low, Issued, (int, int)) for g, low in issued.items()}
        return cls(**counts, quiet=quiet, wait=wait,
                   idle=_typed(raw.get("idle"), Idle, (int, float, str)),
                   pending=_typed_all(pending, PendingEntry, PENDING_TYPES),
                   issued={g: low for g, low in lows.items() if low is not None},
                   ended=_typed_all(ended, Ended, (int, str)))


def _add(entries: dict[tuple[str, int, str], PendingEntry], e: PendingEntry) -> None:
    """Count ``e`` into ``entries``: one per position and signature, named by its lowest
    rank."""
    key = (e.group, e.seq, e.signature)
    have = entries.get(key)
    if have is None:
        entries[key] = e
        return
    lowest = e if e.rank < have.rank else have
    entries[key] = have._replace(ranks=have.ranks + e.ranks, rank=lowest.rank,
                                 what=lowest.what)


def node_digest(ranks: Mapping[int, RankProgress], now: float) -> Digest:
    """The digest of one node's own ranks (``RankProgress`` as the launcher's monitor reads
    them from the ranks' progress blocks); its counts are the node's :class:`WorldView`."""
    view = view_of(dict(ranks), {}, now)
    live = [p for p in ranks.values() if p.status == schema.RUNNING]
    pending: dict[tuple[str, int, str], PendingEntry] = {}
    issued: dict[str, Issued] = {}
    for p in live:
        for pend in p.pending.values():
            c = pend.coll
            if c is None or c.seq is None or is_p2p(c):
                continue
            _add(pending, PendingEntry(c.group, c.seq, signature(c), p.rank, 1,
                                       pend.what[:WHAT_CHARS]))
        for group, seq in p.issued.items():
            mine = Issued(seq, p.rank)
            if group not in issued or mine < issued[group]:
                issued[group] = mine
    sizes = [p.world_size for p in ranks.values() if p.world_size]
    idle = view.idle
    return Digest(
        nodes=1, unknown=0, ranks=len(ranks), world=max(sizes, default=0),
        live=view.live, waiting=view.waiting, blocked=view.blocked,
        quiet=round(view.quiet, 3),
        wait=round(view.wait, 3) if view.wait is not None else None,
        idle=Idle(idle.rank, round(idle.seconds, 3), idle.place[:WHAT_CHARS]) if idle else None,
        idle_count=view.idle_count,
        pending=_bounded(list(pending.values())),
        issued=dict(sorted(issued.items())[:MAX_GROUPS]),
        ended=tuple(sorted(Ended(p.rank, p.status) for p in ranks.values()
                           if p.status != schema.RUNNING)[:MAX_ENDED]),
    )


def _bounded(entries: list[PendingEntry]) -> tuple[PendingEntry, ...]:
    """At most :data:`MAX_PENDING` entries: positions with two signatures first, then the
    lowest positions."""
    sigs: dict[tuple[str, int], set[str]] = {}
    for e in entries:
        sigs.setdefault((e.group, e.seq), set()).add(e.signature)
    entries.sort(key=lambda e: (len(sigs[(e.group, e.seq)]) < 2, e.seq, e.group, e.rank))
    return tuple(entries[:MAX_PENDING])


def aged(digest: Digest, seconds: float) -> Digest:
    """The digest as it reads ``seconds`` after it was written: its ages grown."""
    idle = digest.idle
    return replace(
        digest, quiet=round(digest.quiet + seconds, 3),
        wait=None if digest.wait is None else round(digest.wait + seconds, 3),
        idle=None if idle is None else idle._replace(seconds=round(idle.seconds + seconds, 3)))


def merge(own: Digest, others: Iterable[Digest], unknown: int = 0) -> Digest:
    """One digest for a node and the subtrees below it; ``unknown``: nodes below that sent no
    fresh digest (nothing about the world can be decided while any is unknown)."""
    parts = [own, *others]
    waits = [d.wait for d in parts if d.wait is not None]
    idles = [d.idle for d in parts if d.idle is not None]
    pending: dict[tuple[str, int, str], PendingEntry] = {}
    for d in parts:
        for e in d.pending:
            _add(pending, e)
    issued: dict[str, Issued] = {}
    for d in parts:
        for group, low in d.issued.items():
            if group not in issued or low < issued[group]:
                issued[group] = low
    return Digest(
        nodes=sum(d.nodes for d in parts), unknown=unknown + sum(d.unknown for d in parts),
        ranks=sum(d.ranks for d in parts), world=max(d.world for d in parts),
        live=sum(d.live for d in parts), waiting=sum(d.waiting for d in parts),
        blocked=sum(d.blocked for d in parts), idle_count=sum(d.idle_count for d in parts),
        quiet=min(d.quiet for d in parts), wait=min(waits) if waits else None,
        idle=max(idles, key=lambda i: (i.seconds, -i.rank), default=None),
        pending=_bounded(list(pending.values())),
        issued=dict(sorted(issued.items())[:MAX_GROUPS]),
        ended=tuple(sorted(e for d in parts for e in d.ended)[:MAX_ENDED]))


def _conflict(pending: Iterable[PendingEntry]) -> list[PendingEntry] | None:
    """The entries of the lowest position with two signatures (they can never match)."""
    sigs: dict[tuple[str, int], list[PendingEntry]] = {}
    for e in pending:
        sigs.setdefault((e.group, e.seq), []).append(e)
    clashes = [es for es in sigs.values() if len({e.signature for e in es}) > 1]
    return min(clashes, key=lambda es: (es[0].seq, es[0].group)) if clashes else None


def named_ranks(world: Digest, stop: Stop) -> tuple[int, ...]:
    """The ranks whose details every node fetches to diagnose ``stop``: both sides of a
    position that cannot match, the lowest pending positions, a rank that never issued them,
    the rank idle outside collectives, ranks that ended."""
    pending = world.pending
    out: list[int] = []
    conflict = _conflict(pending)
    if stop == Stop.STUCK and world.idle is not None:
        out.append(world.idle.rank)
    for e in conflict or sorted(pending, key=lambda e: (e.seq, e.group))[:2]:
        out.append(e.rank)
    lowest: dict[str, int] = {}
    for e in pending:
        lowest[e.group] = min(lowest.get(e.group, e.seq), e.seq)
    for group, low in world.issued.items():
        if group in lowest and low.seq < lowest[group]:
            out.append(low.rank)  # never issued what the others wait in
    out.extend(e.rank for e in world.ended)
    return tuple(dict.fromkeys(out))[:MAX_NAMED]


def world_view(world: Digest) -> WorldView:
    """The hang rules' view of a merged digest: nothing is known while a node is unknown or
    a rank of the world has not been seen; two signatures at one position can never match."""
    return WorldView(
        live=world.live, waiting=world.waiting, blocked=world.blocked, quiet=world.quiet,
        wait=world.wait, idle=world.idle, idle_count=world.idle_count,
        unmatched=_conflict(world.pending) is not None,
        known=not world.unknown and world.ranks >= world.world)


def world_decision(world: Digest, timeout: float, stuck_timeout: float | None, now: float,
                   deadlock_since: float | None = None) -> Decision:
    """The hang rules (:func:`~ddpdoctor.analysis.hang_rules.decide_view`) over the whole
    world's digest, with the ranks a verdict names."""
    decision = decide_view(world_view(world), timeout, stuck_timeout, now, deadlock_since)
    if decision.stop is not None:
        decision.named = named_ranks(world, decision.stop)
    return decision
