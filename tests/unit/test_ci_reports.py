"""The CI reports: JUnit XML a CI server shows as one test, and the Markdown summary."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ddpdoctor.analysis import diagnose
from ddpdoctor.knowledge import catalog
from ddpdoctor.render import markdown, run_info
from ddpdoctor.render.interface import render
from ddpdoctor.render.junit import JunitReporter
from ddpdoctor.render.markdown import MarkdownReporter
from ddpdoctor.render.run_info import RunInfo
from ddpdoctor.trace.model import Site

from . import scenarios
from .factories import healthy_ddp, make_run


def _clean():
    return diagnose(make_run(*healthy_ddp()))


def _barrier():
    return diagnose(scenarios.checkpoint_barrier_on_rank0())


def _case(xml: str) -> ET.Element:
    root = ET.fromstring(xml.encode("utf-8"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    cases = suites[0].findall("testcase")
    assert len(cases) == 1
    return cases[0]


def test_clean_run_is_one_passing_test_with_the_report_as_output() -> None:
    xml = render(JunitReporter(), _clean(),
                 RunInfo(name="train.py --epochs 1", exit_code=0, seconds=4.25))
    root = ET.fromstring(xml)
    assert root.get("tests") == "1" and root.get("failures") == "0"
    case = _case(xml)
    assert case.get("name") == "train.py --epochs 1"
    assert case.get("classname") == "ddpdoctor.run" and case.get("time") == "4.250"
    assert case.find("failure") is None
    assert "CLEAN" in case.find("system-out").text
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["verdict"] == "clean" and props["exit_code"] == "0"


def test_divergence_is_a_failure_naming_the_finding_cause_and_line() -> None:
    report = _barrier()
    root_finding = report.root
    xml = render(JunitReporter(), report, RunInfo(name="train.py", exit_code=3, seconds=9.0,
                                       logdir="/tmp/logs"))
    assert ET.fromstring(xml).get("failures") == "1"
    failure = _case(xml).find("failure")
    assert failure is not None
    assert failure.get("type") == root_finding.kind
    message = failure.get("message")
    assert message.startswith(f"{report.verdict.upper()}: {root_finding.kind}")
    assert f"[{root_finding.cause}]" in message and "\n" not in message
    text = failure.text
    assert f"Root cause: {root_finding.kind}" in text
    assert "train.py:70" in text
    assert catalog.get(root_finding.cause).title in text
    assert "Fix:" in text and "Traces: /tmp/logs" in text
    assert "\x1b[" not in text


def test_junit_survives_control_characters_and_markup_in_names() -> None:
    name = "train.py --tag '<a&b>' \x1b[31mred\x1b[0m \x07bell"
    xml = render(JunitReporter(), _barrier(), RunInfo(name=name, exit_code=1))
    case = _case(xml)
    assert case.get("name") == "train.py --tag '<a&b>' red bell"


def test_no_diagnosis_and_schedule_change_are_failures_too() -> None:
    xml = render(JunitReporter(), None,
                 RunInfo(name="t.py", exit_code=1, read_error="no traces in x"))
    failure = _case(xml).find("failure")
    assert failure.get("type") == "no_diagnosis" and "no traces in x" in failure.get("message")
    info = RunInfo(name="t.py", exit_code=1,
                   problems=("rank 0:", "  iteration 2 #5: added all_reduce user float32[1]"))
    failure = _case(render(JunitReporter(), _clean(), info)).find("failure")
    assert failure.get("type") == "schedule_changed"
    assert "added all_reduce user" in failure.text
    assert "schedule changed" in failure.get("message")


def test_failed_is_not_clean_or_non_zero_exit_or_a_problem() -> None:
    clean = _clean()
    assert not run_info.failed(clean, RunInfo(name="x", exit_code=0))
    assert run_info.failed(clean, RunInfo(name="x", exit_code=3))
    assert run_info.failed(clean, RunInfo(name="x", problems=("changed",)))
    assert run_info.failed(None, RunInfo(name="x"))
    assert run_info.failed(_barrier(), RunInfo(name="x", exit_code=0))


def test_markdown_summary_has_headline_table_code_cause_fix_and_notes() -> None:
    report = _barrier()
    f = report.root
    code = {70: "dist.barrier()  # only rank 0"}
    text = render(MarkdownReporter(code_line=lambda site: code.get(site.line, "")), report,
                  RunInfo(name="train.py", exit_code=3, seconds=9.5, logdir="/tmp/logs"))
    lines = text.splitlines()
    assert lines[0].startswith("## ❌ ddpdoctor: DIVERGED")
    assert "`train.py` · 2 ranks" in text and "exit 3" in text and "9.5 s" in text
    assert f"### Root cause: `{f.kind}`" in text
    assert "| rank | op | label | iter | state | line |" in text
    assert "`train.py:70`" in text
    assert "70 | dist.barrier()  # only rank 0" in text
    assert f"`[{f.cause}]`" in text and "**Fix:**" in text
    assert "### Stacks at the hang" not in text  # no hang record in this run
    assert "Traces: `/tmp/logs`" in text
    assert text.endswith("\n")


def test_markdown_clean_and_schedule_problems() -> None:
    text = render(MarkdownReporter(code_line=lambda site: ""), _clean(),
                  RunInfo(name="t.py", exit_code=1,
                          problems=("rank 0:", "  iteration 2 #5: added x")))
    assert text.startswith("## ✅ ddpdoctor: CLEAN")
    assert "### Collective schedule changed" in text and "added x" in text
    none = render(MarkdownReporter(), None, RunInfo(name="t.py", read_error="cannot read"))
    assert none.startswith("## ❌ ddpdoctor: NO DIAGNOSIS — cannot read")


def test_markdown_escapes_table_cells() -> None:
    assert markdown._cell("a|b\nc") == "a\\|b c"
    assert Site("C:\\work\\train.py", 3, "main").short == "train.py:3"
