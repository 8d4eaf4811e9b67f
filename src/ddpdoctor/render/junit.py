"""The report as JUnit XML (``--junit FILE``): one test case per run, for CI servers.

A CI server (GitHub Actions test reporters, GitLab, Jenkins) shows the file as one test named
after the script; when the run is not clean (see :func:`ddpdoctor.render.run_info.failed`) the
test case holds a ``failure`` whose ``message`` is a one-line verdict with the root finding and
its cause, ``type`` the finding kind, and whose text is the full plain-text diagnosis (the
console report without colour) plus any schedule difference. :class:`JunitReporter` is the
:class:`~ddpdoctor.render.interface.Reporter`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ddpdoctor.render.console import ConsoleReporter
from ddpdoctor.render.view import ReportView

SUITE = "ddpdoctor"
CLASSNAME = "ddpdoctor.run"
MESSAGE_LIMIT = 400
# XML 1.0 cannot carry most control characters; terminal colour codes (and C1 controls such
# as U+009B, a terminal's CSI) are noise in CI.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_INVALID = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff]")


def clean_text(text: str) -> str:
    """``text`` without colour codes and without characters XML 1.0 cannot hold; a lone
    surrogate (a file name that is not UTF-8) is written as its escape (``\\udcff``)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return _INVALID.sub("", _ANSI.sub("", text))


def failure_message(view: ReportView) -> str:
    """One line: verdict, root finding and cause, its summary (or the other problem)."""
    report, info, root = view.report, view.info, view.root
    if report is None:
        text = f"no diagnosis: {view.verdict_text}"
    else:
        text = report.verdict.upper()
        if root is not None:
            text += f": {root.kind}" + (f" [{root.cause}]" if root.cause else "") + \
                f": {root.summary}"
        elif info.problems:
            text += f" run, but the collective schedule changed: {info.problems[0].strip()}"
        elif info.exit_code:
            text += f" diagnosis, but ddpdoctor exited with code {info.exit_code}"
    text = " ".join(clean_text(text).split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"


def _failure_type(view: ReportView) -> str:
    if view.report is None:
        return "no_diagnosis"
    if view.root is not None:
        return view.root.kind
    if view.info.problems:
        return "schedule_changed"
    return view.report.verdict


class JunitReporter:
    """The JUnit XML document (one ``testsuite`` holding one ``testcase``)."""

    def render(self, view: ReportView) -> str:
        return _document(view)


def _document(view: ReportView) -> str:
    report, info = view.report, view.info
    is_failure = view.failed
    seconds = f"{info.seconds or 0.0:.3f}"
    suites = ET.Element("testsuites", name=SUITE, tests="1",
                        failures="1" if is_failure else "0", errors="0", time=seconds)
    suite = ET.SubElement(suites, "testsuite", name=SUITE, tests="1",
                          failures="1" if is_failure else "0", errors="0", skipped="0",
                          time=seconds)
    properties = ET.SubElement(suite, "properties")
    for name, value in (("verdict", report.verdict if report else "none"),
                        ("exit_code", "" if info.exit_code is None else str(info.exit_code)),
                        ("logdir", info.logdir or "")):
        ET.SubElement(properties, "property", name=name, value=clean_text(value))
    case = ET.SubElement(suite, "testcase", classname=CLASSNAME, name=clean_text(info.name),
                         time=seconds)
    body: list[str] = []
    if report is not None:
        body.append(ConsoleReporter().render(view))
    if info.problems:
        body.append("Collective schedule changed:\n" + "\n".join(info.problems) + "\n")
    if info.logdir:
        body.append(f"Traces: {info.logdir}\n")
    text = clean_text("\n".join(body))
    if is_failure:
        failure = ET.SubElement(case, "failure", message=failure_message(view),
                                type=_failure_type(view))
        failure.text = text
    else:
        out = ET.SubElement(case, "system-out")
        out.text = text
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + \
        ET.tostring(suites, encoding="unicode") + "\n"
