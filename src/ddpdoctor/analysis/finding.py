"""The result types of the analysis: a :class:`Finding` and its per-rank :class:`RankDetail`.

A finding is one thing that went wrong (or looks wrong): its ``kind`` (one of :data:`KINDS`),
severity, where (group and sequence number), a one-sentence summary in DDP terms, the known
cause and advice, and for every rank involved what that rank was doing there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal

from ddpdoctor.trace.model import Collective, Site

OP_MISMATCH: Final = "op_mismatch"
SHAPE_MISMATCH: Final = "shape_mismatch"
DTYPE_MISMATCH: Final = "dtype_mismatch"
REDUCE_OP_MISMATCH: Final = "reduce_op_mismatch"
ROOT_MISMATCH: Final = "root_mismatch"
GROUP_MISMATCH: Final = "group_mismatch"
MISSING_COLLECTIVE: Final = "missing_collective"
CALLSITE_DIVERGENCE: Final = "callsite_divergence"
WAIT_CYCLE: Final = "wait_cycle"
RANK_CRASHED: Final = "rank_crashed"
RANK_EXITED_EARLY: Final = "rank_exited_early"
TEARDOWN_ABORT: Final = "teardown_abort"
INIT_INCOMPLETE: Final = "init_incomplete"
RANK_STUCK: Final = "rank_stuck"  # stopped by the launcher: a rank idle at one place in user code

MISMATCH_KINDS = (OP_MISMATCH, SHAPE_MISMATCH, DTYPE_MISMATCH, REDUCE_OP_MISMATCH,
                  ROOT_MISMATCH)
# Findings at one position of a group's sequence (a later one there follows from the first).
POSITION_KINDS = MISMATCH_KINDS + (MISSING_COLLECTIVE, CALLSITE_DIVERGENCE)
KINDS = MISMATCH_KINDS + (GROUP_MISMATCH, MISSING_COLLECTIVE, CALLSITE_DIVERGENCE, WAIT_CYCLE,
                          RANK_CRASHED, RANK_EXITED_EARLY, TEARDOWN_ABORT, INIT_INCOMPLETE,
                          RANK_STUCK)

FindingKind = Literal["op_mismatch", "shape_mismatch", "dtype_mismatch", "reduce_op_mismatch",
                      "root_mismatch", "group_mismatch", "missing_collective",
                      "callsite_divergence", "wait_cycle", "rank_crashed", "rank_exited_early",
                      "teardown_abort", "init_incomplete", "rank_stuck"]
Severity = Literal["error", "warning"]
ERROR: Final = "error"
WARNING: Final = "warning"


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
        return self.severity == ERROR
