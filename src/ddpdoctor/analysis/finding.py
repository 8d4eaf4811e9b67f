"""The result types of the analysis: a :class:`Finding` and its per-rank :class:`RankDetail`.

A finding is one thing that went wrong (or looks wrong): its ``kind`` (a :class:`FindingKind`),
severity, where (group and sequence number), a one-sentence summary in DDP terms, the known
cause and advice, and for every rank involved what that rank was doing there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ddpdoctor.trace.model import Collective, Site
from ddpdoctor.trace.words import Word


class FindingKind(Word):
    """What a finding is about; its value is the ``kind`` every report shows."""

    OP_MISMATCH = "op_mismatch"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    REDUCE_OP_MISMATCH = "reduce_op_mismatch"
    ROOT_MISMATCH = "root_mismatch"
    SPLIT_MISMATCH = "split_mismatch"  # all_to_all / gather / scatter amounts disagree
    TAG_MISMATCH = "tag_mismatch"  # a receive waits for a tag its sender did not use
    GROUP_MISMATCH = "group_mismatch"
    MISSING_COLLECTIVE = "missing_collective"
    CALLSITE_DIVERGENCE = "callsite_divergence"
    WAIT_CYCLE = "wait_cycle"
    RANK_CRASHED = "rank_crashed"
    RANK_EXITED_EARLY = "rank_exited_early"
    TEARDOWN_ABORT = "teardown_abort"
    INIT_INCOMPLETE = "init_incomplete"
    RANK_STUCK = "rank_stuck"  # stopped by the launcher: a rank idle at one place in user code


MISMATCH_KINDS = (FindingKind.OP_MISMATCH, FindingKind.SHAPE_MISMATCH,
                  FindingKind.DTYPE_MISMATCH, FindingKind.REDUCE_OP_MISMATCH,
                  FindingKind.ROOT_MISMATCH, FindingKind.SPLIT_MISMATCH,
                  FindingKind.TAG_MISMATCH)
# Findings at one position of a group's sequence (a later one there follows from the first).
POSITION_KINDS = MISMATCH_KINDS + (FindingKind.MISSING_COLLECTIVE,
                                   FindingKind.CALLSITE_DIVERGENCE)

class Severity(Word):
    """How bad a finding is: an error fails a run, a warning is shown."""

    ERROR = "error"
    WARNING = "warning"



@dataclass
class RankDetail:
    """What one rank was doing at a finding's position.

    ``op`` is None when the rank never issued the collective in question; ``state`` then says
    where the rank was instead (``finished``, ``exception``, ``killed``, ``blocked``,
    ``running``, ``no trace``), and ``site`` points at that place when it is known.
    """

    rank: int
    op: str | None = None
    label: str | None = None
    site: Site | None = None
    state: str = ""
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    iteration: int | None = None
    group: str | None = None
    seq: int | None = None
    note: str = ""
    stack: list[Site] = field(default_factory=list)

    @classmethod
    def of(cls, c: Collective, note: str = "") -> RankDetail:
        """The detail of rank ``c.rank`` issuing collective ``c``."""
        return cls(rank=c.rank, op=c.op, label=c.label, site=c.site, state=c.state,
                   shapes=c.shapes, dtypes=c.dtypes, iteration=c.iteration, group=c.group,
                   seq=c.seq if c.seq is not None else c.p2p_seq, note=note, stack=c.stack)


@dataclass
class Finding:
    """One diagnosed problem. ``t`` orders findings in time; ``follow_on`` marks consequences."""

    kind: FindingKind
    severity: Severity
    group: str | None
    seq: int | None
    summary: str
    ranks: dict[int, RankDetail] = field(default_factory=dict)
    cause: str | None = None
    advice: str = ""
    context: dict[int, RankDetail] = field(default_factory=dict)
    context_seq: int | None = None
    evidence: list[str] = field(default_factory=list)
    follow_on: bool = False
    explained_by: str | None = None
    p2p: bool = False
    t: float = math.inf

    @property
    def is_error(self) -> bool:
        return self.severity == Severity.ERROR

    def issued(self) -> dict[int, RankDetail]:
        """The ranks that issued the finding's collective (their detail has an op)."""
        return {r: d for r, d in self.ranks.items() if d.op is not None}
