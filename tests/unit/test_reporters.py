"""Every report format is a Reporter over one shared view: same sections, same decisions."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.console import ConsoleReporter
from ddpdoctor.render.interface import Reporter
from ddpdoctor.render.json_report import JsonReporter
from ddpdoctor.render.junit import JunitReporter
from ddpdoctor.render.markdown import MarkdownReporter
from ddpdoctor.render.run_info import RunInfo
from ddpdoctor.render.view import ReportView, rows, sources

from . import scenarios
from .factories import healthy_ddp, make_run

REPORTERS: list[Reporter] = [ConsoleReporter(), JsonReporter(), JunitReporter(),
                             MarkdownReporter()]
INFO = RunInfo(name="train.py", exit_code=1, seconds=2.5, logdir="/tmp/logs-x")


@pytest.mark.parametrize("reporter", REPORTERS, ids=lambda r: type(r).__name__)
def test_every_reporter_shows_the_root_finding_its_lines_and_its_cause(
        reporter: Reporter) -> None:
    view = ReportView(diagnose(scenarios.checkpoint_barrier_on_rank0()), INFO)
    root = view.root
    assert root is not None and root.cause and view.folded == view.report.findings[1:]
    text = reporter.render(view)
    assert root.kind in text and root.cause in text
    for site, _ranks in sources(root):  # each distinct source line of the root finding
        assert f"{site.short}" in text or f'"line": {site.line}' in text


@pytest.mark.parametrize("reporter", REPORTERS, ids=lambda r: type(r).__name__)
def test_every_reporter_says_why_there_is_no_diagnosis(reporter: Reporter) -> None:
    text = reporter.render(ReportView(None, RunInfo(name="t.py", read_error="no traces in x")))
    assert "no traces in x" in text


def test_a_clean_run_shows_no_root_and_folds_its_warnings() -> None:
    view = ReportView(diagnose(make_run(*healthy_ddp())), INFO)
    assert view.report.verdict == "clean" and view.root is None
    assert view.folded == view.report.findings and view.unfinished == []


def test_rows_group_ranks_doing_the_same_thing() -> None:
    root = diagnose(scenarios.checkpoint_barrier_on_rank0()).root
    found = rows(root)
    assert sorted(r for row in found for r in row.ranks) == sorted(root.ranks)
    assert len({(row.detail.op, row.detail.site) for row in found}) == len(found) >= 2


def test_the_json_reporter_carries_what_the_run_adds() -> None:
    data = json.loads(JsonReporter().render(
        ReportView(diagnose(scenarios.checkpoint_barrier_on_rank0()), INFO)))
    assert (data["exit_code"], data["duration_s"], data["logdir"]) == (1, 2.5, "/tmp/logs-x")
    assert data["verdict"] == "diverged" and data["findings"][0]["cause"]
    none = json.loads(JsonReporter().render(ReportView(None, RunInfo(name="t", read_error="x"))))
    assert none["verdict"] is None and none["error"] == "x"


class _Csv:
    """A format that is only a reporter and a registry entry (issue 57: two places)."""

    def render(self, view: ReportView) -> str:
        root = view.root
        return f"verdict,{view.report.verdict if view.report else ''}\n" + (
            f"root,{root.kind}\n" if root is not None else "")


def test_a_new_format_is_a_reporter_and_one_entry_and_every_command_takes_it(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app
    from ddpdoctor.cli import run as run_cli
    from ddpdoctor.render import formats

    monkeypatch.setitem(formats.FORMATS, "csv", _Csv)
    logs = tmp_path / "logs"
    logs.mkdir()
    # diff prints it
    from .test_damaged_corpus import _folder

    _folder(logs)
    result = CliRunner().invoke(app, ["diff", "--format", "csv", str(logs)])
    assert result.output.startswith("verdict,"), result.output
    # run writes it (--report FORMAT=FILE), as it writes its shortcuts' formats
    view = ReportView(diagnose(scenarios.checkpoint_barrier_on_rank0()), INFO)
    out, js = tmp_path / "r.csv", tmp_path / "r.json"
    run_cli._write_reports(view, [formats.request(f"csv={out}"), ("json", js)])
    assert out.read_text().startswith("verdict,diverged\nroot,")
    assert json.loads(js.read_text())["verdict"] == "diverged"
    # Refused in one line: an unknown format, a request without its file
    for bad in (["diff", "--format", "nope", str(logs)], ["run", "--report", "nope=x", "t.py"],
                ["run", "--report", "csv", "t.py"]):
        result = CliRunner().invoke(app, bad)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "nope" in result.output or "FORMAT=FILE" in result.output


def test_ddpdoctor_yaml_takes_report_files_as_a_list() -> None:
    from ddpdoctor.cli import config
    from ddpdoctor.cli.run import run_command

    options = config.options_of(run_command)
    assert options["report"].kind == "list"
    parsed = config.parse("run:\n  report: [json=a.json, junit=b.xml]\n", options)
    assert parsed["run"]["report_files"] == ["json=a.json", "junit=b.xml"]
    assert config.parse("run:\n  report: json=a.json\n", options)["run"]["report_files"] == \
        ["json=a.json"]
    with pytest.raises(config.ConfigError, match="must be a string"):
        config.parse("run:\n  report: [{a: 1}]\n", options)
