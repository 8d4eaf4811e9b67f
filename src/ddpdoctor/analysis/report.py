"""The diagnosis of one run: verdict, per-rank summary, findings (root cause first), notes."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.analysis.details import left_detail
from ddpdoctor.analysis.finding import Finding, RankDetail
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankState, RankStatus
from ddpdoctor.trace.model import Site
from ddpdoctor.trace.words import Word


class Verdict(Word):
    """The one word a report opens with."""

    CLEAN = "clean"
    DIVERGED = "diverged"
    CRASHED = "crashed"
    INCOMPLETE = "incomplete"
    UNTESTED = "untested"
    RUNNING = "running"  # ddpdoctor attach: every rank seen outside collectives

    @property
    def unverified(self) -> bool:
        """Nothing wrong was found, but not because the ranks were compared to the end: CI
        mode fails such a run (exit 4)."""
        return self in (Verdict.UNTESTED, Verdict.INCOMPLETE)


# What each verdict means, in the words every reporter shows.
VERDICT_TEXT = {
    Verdict.CLEAN: "every rank issued the same collectives and finished",
    Verdict.DIVERGED: "the ranks stopped issuing the same collectives",
    Verdict.CRASHED: "a rank failed, and any rank still running was left waiting for it",
    Verdict.INCOMPLETE: "the traces do not hold enough to compare the ranks to the end",
    Verdict.UNTESTED: "no two ranks' collectives could be compared: nothing was tested",
    Verdict.RUNNING: "no rank waits in a collective: no distributed hang seen",
}


@dataclass
class RankSummary:
    """How one rank ended and how far it got."""

    rank: int
    status: RankStatus
    iterations: int = 0
    collectives: int = 0
    last: RankDetail | None = None
    exit_code: int | None = None
    detail: str = ""
    hang_stack: list[Site] = field(default_factory=list)  # user frames, innermost first

    @classmethod
    def of(cls, state: RankState) -> RankSummary:
        last = left_detail(state) if state.where is not None else None
        return cls(rank=state.rank, status=state.status, iterations=state.iterations,
                   collectives=state.collectives, last=last, exit_code=state.exit_code,
                   detail=state.crash_text, hang_stack=list(state.hang_stack))


@dataclass
class Report:
    """What ``ddpdoctor diff`` found in one run."""

    verdict: Verdict
    world_size: int
    ranks: list[RankSummary]
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def root(self) -> Finding | None:
        """The root-cause finding (the first), or None when nothing was found."""
        return self.findings[0] if self.findings else None

    @property
    def has_errors(self) -> bool:
        return any(f.is_error for f in self.findings)

    @property
    def all_finished(self) -> bool:
        """Every rank of the world ran its script to the end (teardown aborts aside)."""
        return bool(self.ranks) and all(r.status.ended_well for r in self.ranks)


def verdict_of(findings: list[Finding], states: dict[int, RankState],
               world_size: int = 0) -> Verdict:
    """clean / diverged / crashed / incomplete / untested, from the ordered findings and rank
    endings. Clean needs every rank finished with its whole trace; untested means every rank
    finished and none recorded a collective, or the world was one rank."""
    if any(f.is_error for f in findings):
        return Verdict.CRASHED if findings[0].kind in (
            fk.RANK_CRASHED, fk.RANK_STUCK, fk.TEARDOWN_ABORT) else Verdict.DIVERGED
    # A rank that did not finish (a hang, even one before any collective), a cut trace, or a
    # damaged line (it may be a lost collective): what was compared is not all there was.
    if any(not s.status.ended_well or s.cut
           or (s.trace is not None and s.trace.damaged_lines) for s in states.values()):
        return Verdict.INCOMPLETE
    # Every rank finished and none recorded a collective (a group set up and never used, or
    # used only on a backend ddpdoctor leaves to PyTorch's flight recorder): nothing compared.
    if not any(s.collectives for s in states.values()):
        return Verdict.UNTESTED
    # A world of one rank cannot diverge: "every rank issued the same collectives" would be
    # true of nothing.
    if max(world_size, len(states)) == 1:
        return Verdict.UNTESTED
    return Verdict.CLEAN
