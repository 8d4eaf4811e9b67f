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

A digest is a JSON object of counts and bounded lists, never per rank::

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
from typing import NamedTuple

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


def _entries(digest: dict) -> list[PendingEntry]:
    """A digest's pending entries, typed (a malformed entry is left out)."""
    out = []
    for e in digest.get("pending") or []:
        if isinstance(e, (list, tuple)) and len(e) == len(PendingEntry._fields):
            out.append(PendingEntry(*e))
    return out


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


def node_digest(ranks: Mapping[int, RankProgress], now: float) -> dict:
    """The digest of one node's own ranks (``RankProgress`` as the launcher's monitor reads
    them from the ranks' progress blocks); its counts are the node's :class:`WorldView`."""
    view = view_of(dict(ranks), {}, now)
    live = [p for p in ranks.values() if p.status == schema.RUNNING]
    pending: dict[tuple[str, int, str], PendingEntry] = {}
    issued: dict[str, list[int]] = {}
    for p in live:
        for pend in p.pending.values():
            c = pend.coll
            if c is None or c.seq is None or is_p2p(c):
                continue
            _add(pending, PendingEntry(c.group, c.seq, signature(c), p.rank, 1,
                                       pend.what[:WHAT_CHARS]))
        for group, seq in p.issued.items():
            low = issued.get(group)
            if low is None or (seq, p.rank) < (low[0], low[1]):
                issued[group] = [seq, p.rank]
    sizes = [p.world_size for p in ranks.values() if p.world_size]
    idle = view.idle
    return {
        "nodes": 1, "unknown": 0, "ranks": len(ranks), "world": max(sizes, default=0),
        "live": view.live, "waiting": view.waiting, "blocked": view.blocked,
        "quiet": round(view.quiet, 3),
        "wait": round(view.wait, 3) if view.wait is not None else None,
        "idle": [idle.rank, round(idle.seconds, 3), idle.place[:WHAT_CHARS]] if idle else None,
        "idle_count": view.idle_count,
        "pending": _bounded(list(pending.values())),
        "issued": dict(sorted(issued.items())[:MAX_GROUPS]),
        "ended": sorted([p.rank, p.status] for p in ranks.values()
                        if p.status != schema.RUNNING)[:MAX_ENDED],
    }


def _bounded(entries: list[PendingEntry]) -> list[PendingEntry]:
    """At most :data:`MAX_PENDING` entries: positions with two signatures first, then the
    lowest positions."""
    sigs: dict[tuple[str, int], set[str]] = {}
    for e in entries:
        sigs.setdefault((e.group, e.seq), set()).add(e.signature)
    entries.sort(key=lambda e: (len(sigs[(e.group, e.seq)]) < 2, e.seq, e.group, e.rank))
    return entries[:MAX_PENDING]


def aged(digest: dict, seconds: float) -> dict:
    """The digest as it reads ``seconds`` after it was written: its ages grown."""
    out = dict(digest)
    for name in ("quiet", "wait"):
        if isinstance(out.get(name), (int, float)):
            out[name] = round(out[name] + seconds, 3)
    idle = _idle(out)
    if idle is not None:
        out["idle"] = [idle.rank, round(idle.seconds + seconds, 3), idle.place]
    return out


def merge(own: dict, others: Iterable[dict], unknown: int = 0) -> dict:
    """One digest for a node and the subtrees below it; ``unknown``: nodes below that sent no
    fresh digest (nothing about the world can be decided while any is unknown)."""
    parts = [own, *others]
    waits = [d["wait"] for d in parts if d.get("wait") is not None]
    idles: list[Idle] = [i for i in map(_idle, parts) if i is not None]
    longest = max(idles, key=lambda i: (i.seconds, -i.rank), default=None)
    pending: dict[tuple[str, int, str], PendingEntry] = {}
    for d in parts:
        for e in _entries(d):
            _add(pending, e)
    issued: dict[str, list[int]] = {}
    for d in parts:
        for group, low in (d.get("issued") or {}).items():
            if group not in issued or tuple(low) < tuple(issued[group]):
                issued[group] = list(low)
    return {
        "nodes": sum(d.get("nodes", 1) for d in parts),
        "unknown": unknown + sum(d.get("unknown", 0) for d in parts),
        "ranks": sum(d.get("ranks", 0) for d in parts),
        "world": max(d.get("world", 0) for d in parts),
        **{name: sum(d.get(name, 0) for d in parts)
           for name in ("live", "waiting", "blocked", "idle_count")},
        "quiet": min(d.get("quiet", 0.0) for d in parts),
        "wait": min(waits) if waits else None,
        "idle": list(longest) if longest is not None else None,
        "pending": _bounded(list(pending.values())),
        "issued": dict(sorted(issued.items())[:MAX_GROUPS]),
        "ended": sorted(e for d in parts for e in d.get("ended") or [])[:MAX_ENDED],
    }


def _conflict(pending: list[PendingEntry]) -> list[PendingEntry] | None:
    """The entries of the lowest position with two signatures (they can never match)."""
    sigs: dict[tuple[str, int], list[PendingEntry]] = {}
    for e in pending:
        sigs.setdefault((e.group, e.seq), []).append(e)
    clashes = [es for es in sigs.values() if len({e.signature for e in es}) > 1]
    return min(clashes, key=lambda es: (es[0].seq, es[0].group)) if clashes else None


def named_ranks(world: dict, stop: Stop) -> tuple[int, ...]:
    """The ranks whose details every node fetches to diagnose ``stop``: both sides of a
    position that cannot match, the lowest pending positions, a rank that never issued them,
    the rank idle outside collectives, ranks that ended."""
    pending = _entries(world)
    out: list[int] = []
    conflict = _conflict(pending)
    idle = _idle(world)
    if stop == Stop.STUCK and idle is not None:
        out.append(idle.rank)
    for e in conflict or sorted(pending, key=lambda e: (e.seq, e.group))[:2]:
        out.append(int(e.rank))
    lowest: dict[str, int] = {}
    for e in pending:
        lowest[e.group] = min(lowest.get(e.group, e.seq), e.seq)
    for group, (seq, rank) in (world.get("issued") or {}).items():
        if group in lowest and seq < lowest[group]:
            out.append(int(rank))  # never issued what the others wait in
    out.extend(int(e[0]) for e in world.get("ended") or [])
    return tuple(dict.fromkeys(out))[:MAX_NAMED]


def _idle(digest: dict) -> Idle | None:
    """A digest's ``idle``, typed: [rank, seconds, place] on the wire."""
    idle = digest.get("idle")
    if not isinstance(idle, (list, tuple)) or len(idle) != len(Idle._fields):
        return None
    return Idle(int(idle[0]), float(idle[1]), str(idle[2]))


def world_view(world: dict) -> WorldView:
    """The hang rules' view of a merged digest: nothing is known while a node is unknown or
    a rank of the world has not been seen; two signatures at one position can never match."""
    return WorldView(
        live=world.get("live", 0), waiting=world.get("waiting", 0),
        blocked=world.get("blocked", 0), quiet=world.get("quiet", 0.0),
        wait=world.get("wait"),
        idle=_idle(world), idle_count=world.get("idle_count", 0),
        unmatched=_conflict(_entries(world)) is not None,
        known=not world.get("unknown") and world.get("ranks", 0) >= world.get("world", 0))


def world_decision(world: dict, timeout: float, stuck_timeout: float | None, now: float,
                 deadlock_since: float | None = None) -> Decision:
    """The hang rules (:func:`~ddpdoctor.analysis.hang_rules.decide_view`) over the whole
    world's digest, with the ranks a verdict names."""
    decision = decide_view(world_view(world), timeout, stuck_timeout, now, deadlock_since)
    if decision.stop is not None:
        decision.named = named_ranks(world, decision.stop)
    return decision
