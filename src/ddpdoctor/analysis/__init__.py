"""Analysis of loaded traces (pure functions; no torch, no processes).

:func:`diagnose` turns a :class:`~ddpdoctor.trace.model.Run` into a
:class:`~ddpdoctor.analysis.report.Report`: the verdict, each rank's ending, and the findings
with the root cause first; :func:`diagnose_rounds` does it for each round of a script that
made its process group several times.
"""

from ddpdoctor.analysis.diagnosis import diagnose, diagnose_rounds
from ddpdoctor.analysis.report import Report

__all__ = ["diagnose", "diagnose_rounds", "Report"]
