"""What the CI reports (JUnit, Markdown) say about a run besides the diagnosis, and the CI
failure policy they share."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.report import Report


@dataclass(frozen=True)
class RunInfo:
    """What the CI reports say about the run besides the diagnosis."""

    name: str  # what ran: the script and its arguments
    exit_code: int | None = None  # ddpdoctor's exit code (launch/exits.py)
    seconds: float | None = None
    logdir: str | None = None
    problems: tuple[str, ...] = field(default_factory=tuple)  # e.g. a schedule difference
    read_error: str | None = None  # why there is no report, when there is none


def failed(report: Report | None, info: RunInfo) -> bool:
    """Whether CI should count this run as a failure: not clean, a non-zero exit, or a problem
    found outside the diagnosis."""
    return (report is None or report.verdict != rp.Verdict.CLEAN or bool(info.problems)
            or info.exit_code not in (None, 0))
