"""``--help`` of every command: the usual usage line, no typer type tags, nothing cut."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from ddpdoctor.cli import app


@pytest.mark.parametrize("argv, usage", [
    (["run"], "Usage: ddpdoctor run [OPTIONS] SCRIPT [ARGS...]"),
    (["attach"], "Usage: ddpdoctor attach [OPTIONS] [PID...]"),
    (["diff"], "Usage: ddpdoctor diff [OPTIONS] LOGDIR..."),
    (["timeline"], "Usage: ddpdoctor timeline [OPTIONS] LOGDIR..."),
    (["schedule", "save"], "Usage: ddpdoctor schedule save [OPTIONS] LOGDIR FILE"),
    (["schedule", "compare"], "Usage: ddpdoctor schedule compare [OPTIONS] FILE LOGDIR..."),
])
def test_help_reads_like_a_unix_command(argv: list[str], usage: str) -> None:
    result = CliRunner().invoke(app, [*argv, "--help"], prog_name="ddpdoctor",
                                env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == usage
    assert not re.search(r"<(str|int|float|path|list\[[^]]*\]|[a-z]+ range)>", result.output,
                         re.I), result.output
    assert "{" not in result.output.splitlines()[0]
    assert not any(line.endswith(" ") for line in result.output.splitlines())


def test_run_help_is_short_and_names_no_file_the_installed_package_lacks() -> None:
    """--help is read in a terminal, from an installed package: no docs/ paths (not
    installed), no words of ddpdoctor's internals, and every option within about two
    screens (it was 118 lines)."""
    result = CliRunner().invoke(app, ["run", "--help"], prog_name="ddpdoctor",
                                env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert "docs/" not in result.output and "trace format" not in result.output
    assert "member file" not in result.output
    assert len(result.output.splitlines()) <= 90, len(result.output.splitlines())
    for option in ("--cpu", "--epoch-steps", "--max-steps", "--verbose", "--hang-timeout"):
        assert option in result.output
