"""Every report format ``ddpdoctor`` writes to a file, by name, with its reporter: one registry
(memray's reporter factory). A new format is its reporter class and one entry here; the
command line asks :func:`reporter` for it by name. Each reporter is imported when asked for
(``--junit`` alone needs ``xml.etree``)."""

from __future__ import annotations

from collections.abc import Callable

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


def reporter(name: str) -> Reporter:
    """The reporter of format ``name`` (a key of :data:`FORMATS`)."""
    return FORMATS[name]()
