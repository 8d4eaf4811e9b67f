"""The console report, as a CI log shows it: no terminal, no colour, readable at a glance."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.knowledge import catalog
from ddpdoctor.render.console import ConsoleReporter
from ddpdoctor.render.interface import render

from . import scenarios
from .factories import TraceBuilder, healthy_ddp, make_run, ranks


def show(run, width: int = 100) -> str:
    return render(ConsoleReporter(width), diagnose(run))


def test_diverged_report_shows_verdict_ranks_lines_code_cause_and_fix(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text("\n".join(f"# line {i}" for i in range(1, 70)) + "\n")
    lines = script.read_text().splitlines()
    lines[62] = "            out = model(x)  # eval forward"
    lines[19] = "        out = model(x)  # train forward"
    script.write_text("\n".join(lines) + "\n")
    bs = [TraceBuilder(r, 2, file=str(script)) for r in range(2)]
    for b in bs:
        b.ddp_init().train(3)
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[0].backward()
    bs[1].step()
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[0].pend_last()
    bs[1].finish()
    text = show(make_run(*bs))
    assert "\x1b[" not in text  # no escape codes outside a terminal
    first = text.splitlines()[0]
    assert "DIVERGED" in first
    assert "Root cause: callsite_divergence" in text
    assert "train.py:63 in evaluate()" in text and "train.py:20 in main()" in text
    assert "out = model(x)  # eval forward" in text
    assert "out = model(x)  # train forward" in text
    assert catalog.get("rank_conditional_ddp_forward").title in text
    assert "Fix:" in text and "model.module(x)" in text
    assert "Also found" in text and "missing_collective" in text
    assert "Last matched before it: #15: DDP gradient bucket 0 of iteration 3 on ranks 0, 1" in text


@pytest.mark.parametrize("width", [60, 100, 400])
def test_follow_ons_are_never_cut_and_wrap_under_their_bullet(width: int) -> None:
    report = diagnose(scenarios.seed001_case2())
    text = show(scenarios.seed001_case2(), width=width)
    block = text.split("Also found (2):")[1].split("\n\n")[0].strip("\n").splitlines()
    bullets = [i for i, line in enumerate(block) if line.startswith("  • ")]
    assert len(bullets) == 2
    assert block[bullets[0]].startswith("  • rank_exited_early (follow-on)")
    assert block[bullets[1]].startswith("  • rank_crashed (follow-on)")
    assert "…" not in "\n".join(block)
    # continuation lines sit under the text, not under the bullet
    assert all(line.startswith("    ") for i, line in enumerate(block) if i not in bullets)
    joined = " ".join(line[4:].strip() for line in block)
    for f in report.findings[1:]:
        assert " ".join(f.summary.split()) in " ".join(joined.split())
    if width == 400:
        assert len(block) == 2  # a wide terminal: one line each


def test_crash_report_names_the_exception_and_the_line() -> None:
    text = show(scenarios.seed003_crash())
    assert "CRASHED" in text.splitlines()[0]
    assert "Root cause: rank_crashed" in text
    assert "ValueError: Simulated error in process 1" in text
    assert "train.py:8" in text


def test_clean_report_is_short_and_lists_warnings() -> None:
    text = show(make_run(*healthy_ddp()))
    assert "CLEAN" in text.splitlines()[0]
    assert "Root cause" not in text
    assert len(text.strip().splitlines()) == 2
    text = show(make_run(*healthy_ddp(), exit_codes={1: -6}))
    assert "CLEAN" in text and "teardown_abort [warning]" in text


def test_many_ranks_doing_the_same_share_one_row() -> None:
    bs = ranks(16)
    for b in bs:
        b.ddp_init().train(2)
    for b in bs:
        if b.rank == 9:
            b.user("barrier", line=77).pend_last()
        else:
            b.forward().pend_last()
    text = show(make_run(*bs, stopped_for_hang=True))
    rows = [line for line in text.splitlines() if "ddp.buffers" in line and "train.py:20" in line]
    assert len(rows) == 1 and rows[0].startswith("0-8, 10-15")
    assert any(line.startswith("9 ") and "barrier" in line for line in text.splitlines())
    assert "ranks 0-8, 10-15: 3; rank 9: 2" in text


def test_notes_are_shown() -> None:
    text = show(make_run(*healthy_ddp(), notes=["rank 1: last line cut off"]))
    assert "Notes:" in text and "rank 1: last line cut off" in text


def test_narrow_console_still_renders_every_part() -> None:
    text = show(scenarios.seed001_case4(), width=60)
    for part in ("DIVERGED", "Root cause: op_mismatch", "Cause:", "Fix:"):
        assert part in text


def test_incomplete_report_says_where_unfinished_ranks_were() -> None:
    bs = ranks(2)
    for b in bs:
        b.user("all_reduce", line=33)
    bs[0].finish()
    text = show(make_run(*bs))
    assert "INCOMPLETE" in text.splitlines()[0]
    assert "rank 1 (unfinished): user all_reduce() at train.py:33 in main()" in text


def test_a_report_for_a_log_has_long_lines_no_cuts_and_no_trailing_spaces() -> None:
    report = diagnose(scenarios.seed001_case2())
    text = render(ConsoleReporter(400), report)
    lines = text.splitlines()
    assert all(line == line.rstrip() for line in lines)
    assert "…" not in text  # nothing folded or cut at 400 columns
    for f in report.findings:  # every finding's summary whole, on one line
        assert any(f.summary in line for line in lines), f.summary
