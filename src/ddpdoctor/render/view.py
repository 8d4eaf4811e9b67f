"""The shared view every reporter lays out: the sections of a diagnosis, decided once.

A :class:`ReportView` pairs the :class:`~ddpdoctor.analysis.report.Report` (None when the
traces could not be read) with the :class:`~ddpdoctor.render.run_info.RunInfo` of the run, and
answers what each output shows: the headline, whether the root finding is shown and which
findings fold under "Also found", the ranks that did not finish, the stacks of a hang, the
rows of a finding's table (ranks doing the same thing share a row), its distinct source lines,
and whether CI counts the run as failed. Reporters (:mod:`ddpdoctor.render.interface`) only
lay these out, each in its own format.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.finding import Finding, FindingKind, RankDetail
from ddpdoctor.analysis.ranks import RankStatus
from ddpdoctor.analysis.report import RankSummary, Report
from ddpdoctor.analysis.terms import rank_list, rank_numbers
from ddpdoctor.render.run_info import RunInfo, failed
from ddpdoctor.trace.model import Site

MAX_ROWS = 8  # rows of a table, ranks listed, source lines: the rest is in the JSON report
MAX_FOLDED = 8  # other findings listed one line each


@dataclass(frozen=True)
class Row:
    """One row of a finding's table: the ranks doing the same thing, and what that is."""

    ranks: list[int]
    detail: RankDetail

    @property
    def rank_text(self) -> str:
        """'0-3, 7' (the ranks, without the word)."""
        return rank_numbers(self.ranks)


@dataclass(frozen=True)
class ReportView:
    """A report and its run, as every reporter sees them."""

    report: Report | None
    info: RunInfo = field(default_factory=lambda: RunInfo(name=""))

    @property
    def verdict_word(self) -> str:
        return "NO DIAGNOSIS" if self.report is None else self.report.verdict.upper()

    @property
    def verdict_text(self) -> str:
        if self.report is None:
            return self.info.read_error or "the traces could not be read"
        report = self.report
        if report.verdict == rp.Verdict.CRASHED and report.ranks and \
                all(r.status.crashed for r in report.ranks):
            return "every rank failed"  # none was left waiting: no rank still ran
        if report.root is not None and report.root.kind == "rank_stuck":
            return "a rank stayed blocked in its own code, and the others waited for it"
        return rp.VERDICT_TEXT.get(report.verdict, "")

    @property
    def failed(self) -> bool:
        """Whether CI counts the run as a failure (:func:`~ddpdoctor.render.run_info.failed`)."""
        return failed(self.report, self.info)

    @property
    def root(self) -> Finding | None:
        """The root finding when it is shown in full: an error, or any finding of a run that
        is not clean (a lone warning of a clean run folds with the others)."""
        report = self.report
        if report is None or report.root is None:
            return None
        root = report.root
        return root if root.is_error or report.verdict != rp.Verdict.CLEAN else None

    @property
    def folded(self) -> list[Finding]:
        """The findings listed one line each under "Also found"."""
        if self.report is None:
            return []
        return self.report.findings[1:] if self.root is not None else self.report.findings

    @property
    def unfinished(self) -> list[RankSummary]:
        """For an incomplete run: the ranks that did not finish."""
        report = self.report
        if report is None or report.verdict != rp.Verdict.INCOMPLETE:
            return []
        return [r for r in report.ranks if r.status != RankStatus.FINISHED]

    @property
    def hang_ranks(self) -> list[RankSummary]:
        """The ranks whose main-thread stack was taken at the hang."""
        return [r for r in self.report.ranks if r.hang_stack] if self.report else []

    @property
    def rank_status(self) -> str:
        """'4 ranks — finished: ranks 0-2; crashed: rank 3' (rank numbers, not counts)."""
        report = self.report
        if report is None:
            return ""
        by_status: dict[str, list[int]] = {}
        for r in report.ranks:
            by_status.setdefault(r.status, []).append(r.rank)
        parts = [f"{status}: {rank_list(ranks)}"
                 for status, ranks in by_status.items()]
        plural = "s" if report.world_size != 1 else ""
        return f"{report.world_size} rank{plural} — " + "; ".join(parts)


def rows(f: Finding) -> list[Row]:
    """The rows of ``f``'s table, ranks in order; ranks doing the same thing share one."""
    found: dict[tuple, Row] = {}
    # Ranks at one line reached from different callers are the point of a call-site finding.
    callers = f.kind == FindingKind.CALLSITE_DIVERGENCE
    for r, d in sorted(f.ranks.items()):
        key = (d.op, d.label, d.iteration, d.state, d.site, tuple(d.stack) if callers else ())
        row = found.get(key)
        if row is None:
            found[key] = Row([r], d)
        else:
            row.ranks.append(r)
    return list(found.values())


def overflow(items: list[Row]) -> list[int]:
    """The ranks of the rows beyond :data:`MAX_ROWS`, sorted."""
    return sorted(r for row in items[MAX_ROWS:] for r in row.ranks)


def sources(f: Finding) -> list[tuple[Site, list[int]]]:
    """Each distinct source line of ``f`` with the ranks there (at most :data:`MAX_ROWS`)."""
    by_site: dict[Site, list[int]] = {}
    for r, d in sorted(f.ranks.items()):
        if d.site is not None:
            by_site.setdefault(d.site, []).append(r)
    return list(by_site.items())[:MAX_ROWS]


def where(f: Finding) -> str:
    """'default group, collective #12' (empty when the finding has neither)."""
    parts = []
    if f.group is not None:
        parts.append("default group" if f.group == "0" else f"group {f.group}")
    if f.seq is not None:
        parts.append(f"collective #{f.seq}")
    return ", ".join(parts)


def tag(f: Finding) -> str:
    """The kind of a folded finding, marked when it is a follow-on or a warning."""
    return f.kind + (" (follow-on)" if f.follow_on else "") + \
        (" [warning]" if not f.is_error else "")
