"""The report as plain JSON-able data, in the shape ``docs/report-format.md`` documents.

Top level: ``format``, ``version``, ``verdict``, ``world_size``, ``ranks``, ``findings`` (root
cause first), ``notes``. Ranks are keyed by their number as a string. Everything here is
derived from the :class:`~ddpdoctor.analysis.report.Report`; nothing is computed anew.
:class:`JsonReporter` is the :class:`~ddpdoctor.render.interface.Reporter`: what ``ddpdoctor
run`` adds (its exit code, the job's duration, the log folder) comes from the view's run.
"""

from __future__ import annotations

import json
from typing import Any

from ddpdoctor import __version__
from ddpdoctor.analysis.finding import Finding, RankDetail
from ddpdoctor.analysis.report import RankSummary, Report
from ddpdoctor.knowledge import catalog
from ddpdoctor.render.view import ReportView
from ddpdoctor.trace.model import Site

FORMAT = "ddpdoctor-report"
VERSION = 2  # 2: the ddpdoctor version, and run's exit_code, duration_s and logdir


def _site(site: Site | None) -> dict[str, Any] | None:
    if site is None:
        return None
    return {"file": site.file, "line": site.line, "function": site.function}


def _detail(d: RankDetail) -> dict[str, Any]:
    return {"op": d.op, "label": d.label, "site": _site(d.site), "state": d.state,
            "shapes": [list(s) for s in d.shapes], "dtypes": list(d.dtypes),
            "iteration": d.iteration, "group": d.group, "seq": d.seq, "note": d.note,
            "stack": [_site(s) for s in d.stack]}


def _finding(f: Finding) -> dict[str, Any]:
    cause = catalog.get(f.cause)
    return {
        "kind": f.kind,
        "severity": f.severity,
        "group": f.group,
        "seq": f.seq,
        "cause": f.cause,
        "cause_title": cause.title if cause else None,
        "summary": f.summary,
        "explanation": cause.explanation if cause else None,
        "evidence": list(f.evidence),
        "advice": f.advice,
        "follow_on": f.follow_on,
        "explained_by": f.explained_by,
        "ranks": {str(r): _detail(d) for r, d in sorted(f.ranks.items())},
        "context": ({"seq": f.context_seq,
                     "ranks": {str(r): _detail(d) for r, d in sorted(f.context.items())}}
                    if f.context else None),
    }


def _rank(r: RankSummary) -> dict[str, Any]:
    return {"status": r.status, "iterations": r.iterations, "collectives": r.collectives,
            "exit_code": r.exit_code, "detail": r.detail,
            "last": _detail(r.last) if r.last is not None else None,
            "hang_stack": [_site(s) for s in r.hang_stack]}


def to_dict(report: Report, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report as a JSON-able dict (see docs/report-format.md); ``run``: what ``ddpdoctor
    run`` adds (its exit code, the job's duration, the log folder)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "ddpdoctor": __version__,
        **(run or {}),
        "verdict": report.verdict,
        "world_size": report.world_size,
        "ranks": {str(r.rank): _rank(r) for r in report.ranks},
        "findings": [_finding(f) for f in report.findings],
        "notes": list(report.notes),
    }


class JsonReporter:
    """The report as indented JSON (``--json``); a run with no report is an error object."""

    def render(self, view: ReportView) -> str:
        info = view.info
        run: dict[str, Any] = {}
        if info.exit_code is not None:
            run["exit_code"] = info.exit_code
        if info.seconds is not None:
            run["duration_s"] = round(info.seconds, 3)
        if info.logdir is not None:
            run["logdir"] = info.logdir
        if view.report is None:
            data = {"format": FORMAT, "version": VERSION, "ddpdoctor": __version__, **run,
                    "verdict": None, "error": view.verdict_text}
        else:
            data = to_dict(view.report, run)
        return json.dumps(data, indent=2) + "\n"
