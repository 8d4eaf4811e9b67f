"""Analysis of loaded traces (pure functions; no torch, no processes).

:func:`diagnose` turns a :class:`~ddpdoctor.trace.model.Run` into a
:class:`~ddpdoctor.analysis.report.Report`: the verdict, each rank's ending, and the findings
with the root cause first.
"""

from ddpdoctor.analysis.diagnosis import diagnose
from ddpdoctor.analysis.report import Report

__all__ = ["diagnose", "Report"]
