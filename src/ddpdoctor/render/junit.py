"""The report as JUnit XML (``--junit FILE``): one test case per run, for CI servers.

A CI server (GitHub Actions test reporters, GitLab, Jenkins) shows the file as one test named
after the script; when the run is not clean (see :func:`ddpdoctor.render.run_info.failed`) the
test case holds a ``failure`` whose ``message`` is a one-line verdict with the root finding and
its cause, ``type`` the finding kind, and whose text is the full plain-text diagnosis (the
console report without colour) plus any schedule difference. Pure: a function of the
:class:`~ddpdoctor.analysis.report.Report` and the
:class:`~ddpdoctor.render.run_info.RunInfo`.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ddpdoctor.analysis.report import Report
from ddpdoctor.render import console as console_report
from ddpdoctor.render.run_info import RunInfo, failed

SUITE = "ddpdoctor"
CLASSNAME = "ddpdoctor.run"
MESSAGE_LIMIT = 400
# XML 1.0 cannot carry most control characters; terminal colour codes are noise in CI.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_INVALID = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def clean_text(text: str) -> str:
    """``text`` without colour codes and without characters XML 1.0 cannot hold."""
    return _INVALID.sub("", _ANSI.sub("", text))


def plain_report(report: Report, width: int = 100) -> str:
    """The console report as plain text (no colour, no terminal)."""
    return console_report.plain_text(report, width)


def failure_message(report: Report | None, info: RunInfo) -> str:
    """One line: verdict, root finding and cause, its summary (or the other problem)."""
    if report is None:
        text = f"no diagnosis: {info.read_error or 'the traces could not be read'}"
    else:
        root = report.root
        text = report.verdict.upper()
        if root is not None and (root.is_error or report.verdict != "clean"):
            text += f": {root.kind}" + (f" [{root.cause}]" if root.cause else "") + \
                f": {root.summary}"
        elif info.problems:
            text += f" run, but the collective schedule changed: {info.problems[0].strip()}"
        elif info.exit_code:
            text += f" diagnosis, but ddpdoctor exited with code {info.exit_code}"
    text = " ".join(clean_text(text).split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"


def _failure_type(report: Report | None, info: RunInfo) -> str:
    if report is None:
        return "no_diagnosis"
    root = report.root
    if root is not None and (root.is_error or report.verdict != "clean"):
        return root.kind
    if info.problems:
        return "schedule_changed"
    return report.verdict


def render(report: Report | None, info: RunInfo) -> str:
    """The JUnit XML document (one ``testsuite`` holding one ``testcase``)."""
    is_failure = failed(report, info)
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
        body.append(plain_report(report))
    if info.problems:
        body.append("Collective schedule changed:\n" + "\n".join(info.problems) + "\n")
    if info.logdir:
        body.append(f"Traces: {info.logdir}\n")
    text = clean_text("\n".join(body))
    if is_failure:
        failure = ET.SubElement(case, "failure", message=failure_message(report, info),
                                type=_failure_type(report, info))
        failure.text = text
    else:
        out = ET.SubElement(case, "system-out")
        out.text = text
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + \
        ET.tostring(suites, encoding="unicode") + "\n"
