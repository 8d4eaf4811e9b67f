"""Every report format ``ddpdoctor`` writes, by name, with its reporter: one registry (memray's
reporter factory). A new format is its reporter module and one entry here: ``run --report
NAME=FILE`` writes it and ``diff --format NAME`` prints it, with no change to the command
line (``--json``, ``--junit`` and ``--markdown`` are shortcuts of ``--report``). Each reporter
is imported when asked for (``--junit`` alone needs ``xml.etree``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ddpdoctor.render.interface import Reporter


def _text() -> Reporter:
    from ddpdoctor.render.console import ConsoleReporter

    return ConsoleReporter()


def _json() -> Reporter:
    from ddpdoctor.render.json_report import JsonReporter

    return JsonReporter()


def _junit() -> Reporter:
    from ddpdoctor.render.junit import JunitReporter

    return JunitReporter()


def _markdown() -> Reporter:
    from ddpdoctor.render.markdown import MarkdownReporter

    return MarkdownReporter()


FORMATS: dict[str, Callable[[], Reporter]] = {
    "text": _text,  # the whole report as plain text (LOGDIR/report.txt)
    "json": _json,  # docs/report-format.md
    "junit": _junit,  # one test, failed with the diagnosis
    "markdown": _markdown,  # also $GITHUB_STEP_SUMMARY
}


# Formats that report a run which failed before any diagnosis too (bad usage): a CI check's.
CI_FORMATS = ("junit", "markdown")


def reporter(name: str) -> Reporter:
    """The reporter of format ``name`` (a key of :data:`FORMATS`)."""
    return FORMATS[name]()


def check_name(name: str) -> str:
    """``name`` when it is a format; else ValueError, in one line naming the known ones."""
    if name not in FORMATS:
        raise ValueError(f"unknown report format '{name}' (known: {', '.join(FORMATS)})")
    return name


def request(text: str) -> tuple[str, Path]:
    """(format, file) of one ``--report FORMAT=FILE``; ValueError, in one line, when it is
    not one."""
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--report takes FORMAT=FILE (e.g. json=report.json), not '{text}'")
    return check_name(name), Path(path)
