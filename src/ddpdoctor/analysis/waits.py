"""The wait-for graph of blocked ranks, and the cycle in it when ranks deadlock across groups.

A rank that did not finish and has a collective that never completed waits for every member
of that collective's group that has not issued it yet (for point-to-point: the peer that has
not posted the matching send or receive). Inside one group no cycle is possible; across
groups, two ranks can each wait for the other: rank 0 in group A for rank 1, rank 1 in group B
for rank 0 (the two groups were entered in opposite orders).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.analysis.align import Alignment
from ddpdoctor.analysis.ranks import RankState, RankStatus
from ddpdoctor.trace.model import Collective


@dataclass(frozen=True)
class Wait:
    """Rank ``rank`` waits in ``collective`` for rank ``on``."""

    rank: int
    on: int
    collective: Collective


def wait_edges(alignment: Alignment, states: dict[int, RankState]) -> dict[int, list[Wait]]:
    """Who waits for whom, from every unfinished rank's incomplete collectives."""
    p2p = _p2p_index(alignment)
    edges: dict[int, list[Wait]] = {}
    for rank, state in states.items():
        if state.status == RankStatus.FINISHED or state.trace is None:
            continue
        for c in state.pending:
            for on in _waited_for(alignment, p2p, c):
                if on != rank and on in states and states[on].trace is not None:
                    edges.setdefault(rank, []).append(Wait(rank, on, c))
    return edges


def _p2p_index(alignment: Alignment) -> dict[int, int | None]:
    """id of each send/recv -> the peer it waits for (None when its partner was posted)."""
    index: dict[int, int | None] = {}
    for (_group, src, dst), (sends, recvs) in alignment.pairs.items():
        for k, c in enumerate(sends):
            index[id(c)] = dst if k >= len(recvs) else None
        for k, c in enumerate(recvs):
            index[id(c)] = src if k >= len(sends) else None
    return index


def _waited_for(alignment: Alignment, p2p: dict[int, int | None], c: Collective) -> list[int]:
    if c.seq is not None:
        g = alignment.groups.get(c.group)
        if g is None:
            return []
        return [m for m in g.members if g.length(m) < c.seq]
    peer = p2p.get(id(c))
    return [] if peer is None else [peer]


def find_cycle(edges: dict[int, list[Wait]]) -> list[Wait] | None:
    """A cycle of waits (each rank waits for the next; a two-rank cycle when there is one)."""
    for rank in sorted(edges):
        for wait in edges[rank]:
            back = next((w for w in edges.get(wait.on, []) if w.on == rank), None)
            if back is not None:
                return [wait, back]
    done: set[int] = set()
    for start in sorted(edges):
        if start in done:
            continue
        path: list[Wait] = []
        on_path: dict[int, int] = {start: 0}
        stack = [(start, iter(edges.get(start, [])))]
        while stack:
            node, it = stack[-1]
            step = next(it, None)
            if step is None:
                stack.pop()
                on_path.pop(node, None)
                done.add(node)
                if path:
                    path.pop()
                continue
            if step.on in on_path:
                return path[on_path[step.on]:] + [step]
            if step.on in done or step.on not in edges:
                continue
            on_path[step.on] = len(path) + 1
            path.append(step)
            stack.append((step.on, iter(edges[step.on])))
    return None
