"""What the ranks' traces prove of one another: a collective that completed on one rank was
issued by every member of its group.

An all-reduce, all-gather, reduce-scatter, all-to-all or barrier completes on a rank only once
every member of the group has entered it. A trace whose rank holds fewer collectives in a
group than a peer saw complete there is therefore short of what the rank did: lines were
lost, or the file was cut (a deleted tail, a copy taken mid-write). Such a rank's record is
incomplete; nothing that rests on what it did *not* write may become a finding. Pure
functions of an :class:`~ddpdoctor.analysis.align.Alignment`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ddpdoctor.analysis.align import Alignment, GroupAlignment
from ddpdoctor.trace import ops, schema

# Ops whose completion on one rank needs every member to have entered them. A rooted op
# (broadcast, reduce, gather, scatter) may complete on its root once the data is handed to
# the transport; a point-to-point op involves two ranks only.
PROVING = frozenset(op.name for op in ops.OPS if not (op.rooted or op.p2p))
# Positions looked at from the end of each rank's sequence for its last completed op that
# proves: the writer reports completions in order, so the last ones are near the end.
WINDOW = 64


@dataclass(frozen=True)
class Shortfall:
    """Rank ``rank``'s trace holds ``issued`` collectives of ``group``, yet ``peer`` saw
    collective #``seq`` there (``op``) complete: the rank issued at least that many."""

    rank: int
    group: str
    seq: int
    op: str
    peer: int
    issued: int

    def words(self, group_words: str) -> str:
        """'rank 1 completed collective #5 of the default group (all_reduce), ...'."""
        return (f"rank {self.peer} completed collective #{self.seq} of {group_words} "
                f"({self.op}), which completes only once every member has issued it, yet "
                f"this trace holds {self.issued} collective{'' if self.issued == 1 else 's'} "
                f"of that group: its record is incomplete (lines lost, or the file cut)")


def _last_proof(g: GroupAlignment) -> tuple[int, int, str] | None:
    """(seq, rank, op) of the highest position of ``g`` that some rank saw complete with an
    op that needs every member."""
    best: tuple[int, int, str] | None = None
    for rank, seq_list in g.sequences.items():
        n = len(seq_list)
        for i in range(n - 1, max(-1, n - 1 - WINDOW), -1):
            if best is not None and i + 1 <= best[0]:
                break
            c = seq_list[i]
            if c is not None and c.state == schema.COMPLETED and c.op in PROVING:
                best = (i + 1, rank, c.op)
                break
    return best


def shortfalls(alignment: Alignment, ranks: Collection[int]) -> dict[int, Shortfall]:
    """Per rank among ``ranks`` (those whose whole trace was read), the first group (in the
    alignment's order) where its trace is shorter than what a peer's completed collective
    proves. Groups whose members the ranks recorded differently prove nothing here (which
    ranks a collective needed is itself in question)."""
    out: dict[int, Shortfall] = {}
    for g in alignment.groups.values():
        if g.membership:
            continue
        proof = _last_proof(g)
        if proof is None:
            continue
        seq, peer, op = proof
        for r in g.members:
            if r in ranks and r not in out and g.length(r) < seq:
                out[r] = Shortfall(r, g.name, seq, op, peer, g.length(r))
    return out
