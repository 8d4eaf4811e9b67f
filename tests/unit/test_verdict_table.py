"""One verdict everywhere: for every verdict, in and out of CI mode, and however the job
ended, the exit code, the terminal's headline, JUnit, Markdown and JSON agree (the README's
table of verdicts and exit codes)."""

from __future__ import annotations

import itertools
import json
import xml.etree.ElementTree as ET

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis import report as rp
from ddpdoctor.launch.exits import EXIT_HANG, EXIT_OK, EXIT_UNTESTED
from ddpdoctor.launch.job import JobResult
from ddpdoctor.launch.session import outcome_of
from ddpdoctor.render.console import ConsoleReporter
from ddpdoctor.render.interface import render
from ddpdoctor.render.json_report import JsonReporter
from ddpdoctor.render.junit import JunitReporter
from ddpdoctor.render.markdown import MarkdownReporter
from ddpdoctor.render.run_info import RunInfo, failed
from ddpdoctor.render.view import ReportView
from ddpdoctor.trace.model import Run

from . import scenarios
from .factories import healthy_ddp, make_run


def _reports() -> dict[str, rp.Report]:
    bs = healthy_ddp()
    incomplete = make_run(bs[0], world_size=2)  # rank 1 left no trace
    return {
        rp.Verdict.CLEAN: diagnose(make_run(*healthy_ddp())),
        rp.Verdict.DIVERGED: diagnose(scenarios.checkpoint_barrier_on_rank0()),
        rp.Verdict.CRASHED: diagnose(scenarios.seed003_crash()),
        rp.Verdict.INCOMPLETE: diagnose(incomplete),
        rp.Verdict.UNTESTED: diagnose(Run(ranks={}, world_size=0)),
    }


REPORTS = _reports()
JOBS = {"exit 0": JobResult(0, "/logs", 1.0), "exit 1": JobResult(1, "/logs", 1.0),
        "hang": JobResult(1, "/logs", 1.0, hang=True)}


def test_each_verdict_has_its_scenario() -> None:
    assert {v: r.verdict for v, r in REPORTS.items()} == {v: v for v in REPORTS}


@pytest.mark.parametrize("verdict, job, ci", list(itertools.product(
    REPORTS, JOBS, [False, True])))
def test_every_output_tells_the_same_verdict(verdict: str, job: str, ci: bool) -> None:
    report = REPORTS[verdict]
    outcome = outcome_of(JOBS[job], report, None, ci)
    code = outcome.exit_code
    view = ReportView(report, RunInfo(name="train.py", exit_code=code, seconds=1.0))
    if ci:
        # A CI step fails exactly when its reports say it failed.
        assert (code != EXIT_OK) == failed(report, view.info), (verdict, job, code)
        if verdict in (rp.Verdict.INCOMPLETE, rp.Verdict.UNTESTED) and job == "exit 0":
            assert code == EXIT_UNTESTED
    if verdict == rp.Verdict.CLEAN and job == "exit 0":
        assert code == EXIT_OK
    if job == "hang":
        assert code == EXIT_HANG
    case = ET.fromstring(JunitReporter().render(view)).find("testsuite/testcase")
    assert case is not None
    assert (case.find("failure") is not None) == failed(report, view.info)
    assert json.loads(JsonReporter().render(view))["verdict"] == verdict
    assert f"ddpdoctor: {verdict.upper()}" in render(ConsoleReporter(), report)
    assert verdict.upper() in MarkdownReporter().render(view)


def test_when_every_rank_failed_the_headline_says_so() -> None:
    """An import error on every rank is no rank 'left waiting'."""
    from .factories import ranks

    bs = ranks(2)
    for b in bs:
        b.raise_("ModuleNotFoundError", "No module named 'transformers'", line=3)
    view = ReportView(diagnose(make_run(*bs)))
    assert view.verdict_word == "CRASHED" and view.verdict_text == "every rank failed"
    one = ranks(2)
    one[0].raise_("ValueError", "boom", line=3)
    assert "left waiting" in ReportView(diagnose(make_run(*one))).verdict_text


def test_a_stuck_rank_is_not_said_to_have_failed() -> None:
    from ddpdoctor.trace.schema import Stop

    from .factories import ranks

    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[1].forward().pend_last()
    bs[0].trace.hang = {"kind": "hang", "t": 2000.0, "pending": [], "threads": [
        {"thread": "MainThread", "main": True, "frames": [
            {"file": "/job/train.py", "line": 20, "function": "main"}]}]}
    run = make_run(*bs, stopped_for_hang=True)
    run.stop = Stop.STUCK
    view = ReportView(diagnose(run))
    assert view.report is not None and view.report.root is not None
    assert view.report.root.kind == "rank_stuck"
    assert view.verdict_text.startswith("a rank stayed blocked"), view.verdict_text
