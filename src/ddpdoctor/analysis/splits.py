"""Split sizes: whether what each rank sends to each other rank is what that rank expects.

``all_to_all`` / ``all_to_all_single``, ``gather`` and ``scatter`` carry per-peer amounts that
differ from rank to rank by design, so their tensors are not compared across ranks
(:data:`~ddpdoctor.analysis.signature.FREE_SHAPE_OPS`). What must hold instead is pairwise:
rank *i*'s amount for rank *j* (``sends[j]``) equals rank *j*'s amount from rank *i*
(``recvs[i]``). gloo aborts a rank on a mismatch ("Received data size doesn't match expected
size"), NCCL reads past or short of a buffer. This module finds the first position of a group
where the recorded amounts disagree, and words each disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ddpdoctor.trace.index import index_of
from ddpdoctor.trace.model import Collective, Run


class Group(Protocol):
    """What this module reads of a group's alignment (``align.GroupAlignment``, which calls
    this module): its name, its members, and a member's collective at a position."""

    name: str
    members: list[int]

    def at(self, rank: int, seq: int) -> Collective | None: ...


@dataclass(frozen=True)
class Disagreement:
    """Rank ``src`` (global) sends ``sent`` elements to rank ``dst``, which expects
    ``expected``; ``row``: elements per row when both sides split the same rows."""

    src: int
    dst: int
    sent: int
    expected: int
    row: int | None = None

    def text(self) -> str:
        """'rank 0 sends 3 rows to rank 1, which expects 2'."""
        unit, sent, expected = "elements", self.sent, self.expected
        if self.row and sent % self.row == 0 and expected % self.row == 0:
            unit, sent, expected = "rows", sent // self.row, expected // self.row
        if self.src == self.dst:
            return f"rank {self.src} keeps {sent} {unit} of its own input, but expects {expected}"
        return f"rank {self.src} sends {sent} {unit} to rank {self.dst}, which expects {expected}"


def disagreements(at: dict[int, Collective | None], members: list[int]) -> list[Disagreement]:
    """Every (sender, receiver) pair whose recorded amounts differ at one position (``at``:
    global rank -> its collective there). Pairs with an amount not recorded are skipped."""
    n = len(members)
    by_group_rank = {i: at.get(r) for i, r in enumerate(members)}
    out = []
    for i, a in by_group_rank.items():
        if a is None or a.sends is None or len(a.sends) != n:
            continue
        for j, b in by_group_rank.items():
            if b is None or b.recvs is None or len(b.recvs) != n or b.op != a.op:
                continue
            if a.sends[j] != b.recvs[i]:
                row = a.row if a.row is not None and a.row == b.row else None
                out.append(Disagreement(members[i], members[j], a.sends[j], b.recvs[i], row))
    return out


def _positions(run: Run, group: str, ranks: list[int]) -> list[int]:
    """Positions (seq) in ``group`` where some rank issued an op that recorded amounts."""
    found: set[int] = set()
    for r in ranks:
        trace = run.ranks.get(r)
        if trace is None:
            continue
        index = index_of(trace.collectives)
        codes_with = {k for k, p in enumerate(index.protos)
                      if p.group == group and (p.sends is not None or p.recvs is not None)}
        if not codes_with:
            continue
        positions = index.by_group().get(group)
        if positions is not None:
            found.update(k + 1 for k, code in enumerate(positions.codes) if code in codes_with)
    return sorted(found)


def first_split_mismatch(run: Run, g: Group,
                         before: int | None) -> tuple[int, dict[int, Collective | None]] | None:
    """(seq, every member's collective there) of the first position of group ``g`` before
    ``before`` where every member issued the same op and their amounts disagree."""
    traced = [r for r in g.members if r in run.ranks]
    if len(traced) < 2:
        return None
    for seq in _positions(run, g.name, traced):
        if before is not None and seq >= before:
            break
        at = {r: g.at(r, seq) for r in g.members}
        present = [c for c in at.values() if c is not None]
        if len(present) < 2 or len({c.op for c in present}) != 1:
            continue
        if disagreements(at, g.members):
            return seq, at
    return None
