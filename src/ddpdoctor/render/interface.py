"""The one interface every report format implements: render a :class:`ReportView` as text.

Every format written to a file is named in one registry (``render/formats.py``: text,
``--json``, ``--junit``, ``--markdown`` and ``$GITHUB_STEP_SUMMARY``); the command line asks
it for a reporter by name and hands each the same view, and the terminal gets a
``ConsoleReporter`` of its width. A new format is a class with a ``render`` method and its
entry there. (The timeline and the live view draw a run and a running job, not a report:
they are not reporters.)
"""

from __future__ import annotations

from typing import Protocol

from ddpdoctor.analysis.report import Report
from ddpdoctor.render.run_info import RunInfo
from ddpdoctor.render.view import ReportView


class Reporter(Protocol):
    """One output format of the diagnosis."""

    def render(self, view: ReportView) -> str:
        """The whole output for ``view``."""


def render(reporter: Reporter, report: Report | None, info: RunInfo | None = None) -> str:
    """``reporter``'s output for ``report`` (and the run ``info`` describes)."""
    return reporter.render(ReportView(report, info or RunInfo(name="")))
