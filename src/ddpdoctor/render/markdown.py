"""The report as Markdown: a CI summary (``--markdown FILE``, ``$GITHUB_STEP_SUMMARY``).

Same content as the console report, in GitHub-flavoured Markdown: the verdict headline, the
rank endings, the root finding with a table of what each rank was doing and each source line,
its cause, why and fix, the other findings folded to one line each, the stacks of a hang, the
notes, and the run's problems found outside the diagnosis (a changed collective schedule).
:class:`MarkdownReporter` is the :class:`~ddpdoctor.render.interface.Reporter`; source lines
come from ``code_line`` (the console's by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.finding import Finding
from ddpdoctor.analysis.terms import rank_list, rank_numbers, site_text
from ddpdoctor.knowledge import catalog
from ddpdoctor.render import view as sections
from ddpdoctor.render.console import code_line as console_code_line
from ddpdoctor.render.safe import clean_report, markdown_text
from ddpdoctor.render.view import ReportView
from ddpdoctor.trace.model import Site

ICONS = {rp.Verdict.CLEAN: "✅", rp.Verdict.DIVERGED: "❌", rp.Verdict.CRASHED: "❌",
         rp.Verdict.INCOMPLETE: "⚠️"}


class MarkdownReporter:
    """The Markdown summary of one ``ddpdoctor run`` (or ``diff``)."""

    def __init__(self, code_line: Callable[[Site], str] = console_code_line) -> None:
        self.code_line = code_line

    def render(self, view: ReportView) -> str:
        info = view.info
        view = ReportView(clean_report(view.report, markdown_text) if view.report else None,
                          replace(info, name=markdown_text(info.name),
                                  read_error=markdown_text(info.read_error or "") or None))
        report, info = view.report, view.info
        icon = "❌" if report is None else ICONS.get(report.verdict, "⚠️")
        out = [f"## {icon} ddpdoctor: {view.verdict_word} — {view.verdict_text}", ""]
        facts = [_code(info.name)]
        if view.rank_status:
            facts.append(view.rank_status)
        if info.exit_code is not None:
            facts.append(f"exit {info.exit_code}")
        if info.seconds is not None:
            facts.append(f"{info.seconds:.1f} s")
        out += [" · ".join(facts), ""]
        if info.problems:
            out += ["### Collective schedule changed", "", "```text", *info.problems, "```", ""]
        out += _unfinished(view)
        if view.root is not None:
            out += _root(view.root, self.code_line)
        out += _folded(view.folded)
        out += _hang_stacks(view)
        if report is not None and report.notes:
            out += ["### Notes", ""] + [f"- {note}" for note in report.notes] + [""]
        if info.logdir:
            out += [f"Traces: `{info.logdir}` (`ddpdoctor diff {info.logdir}` explains them "
                    f"again)", ""]
        return "\n".join(out).rstrip() + "\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip() or "—"


def _code(text: str) -> str:
    tick = "``" if "`" in text else "`"
    return f"{tick}{text}{tick}" if text else "—"


def _table(f: Finding) -> list[str]:
    out = ["| rank | op | label | iter | state | line |", "|---|---|---|---|---|---|"]
    items = sections.rows(f)
    for row in items[:sections.MAX_ROWS]:
        d = row.detail
        out.append(f"| {row.rank_text} | {_cell(d.op or '—')} | "
                   f"{_cell(d.label or '—')} | {'—' if d.iteration is None else d.iteration} | "
                   f"{_cell(d.state or '—')} | {_code(d.site.short) if d.site else '—'} |")
    rest = sections.overflow(items)
    if rest:
        out.append(f"| {rank_numbers(rest)} | … | | | | "
                   f"{len(items) - sections.MAX_ROWS} more (see the JSON report) |")
    return out


def _sources(f: Finding, code_line: Callable[[Site], str]) -> list[str]:
    found = sections.sources(f)
    if not found:
        return []
    lines = ["```text"]
    for site, ranks in found:
        lines.append(f"{rank_list(ranks)}: {site_text(site)}")
        code = code_line(site)
        if code:
            lines.append(f"    {site.line} | {code}")
    lines.append("```")
    return lines


def _root(f: Finding, code_line: Callable[[Site], str]) -> list[str]:
    at = sections.where(f)
    out = [f"### Root cause: `{f.kind}`" + (f" ({at})" if at else ""), "", f.summary, ""]
    out += _table(f) + [""]
    source = _sources(f, code_line)
    if source:
        out += source + [""]
    cause = catalog.get(f.cause)
    if cause is not None:
        out += [f"**Cause:** {cause.title} `[{cause.id}]`", "", f"**Why:** {cause.explanation}",
                ""]
    out += [f"- {item}" for item in f.evidence]
    if f.evidence:
        out.append("")
    if f.advice:
        out += [f"**Fix:** {f.advice}", ""]
    return out


def _folded(findings: list[Finding]) -> list[str]:
    if not findings:
        return []
    out = [f"### Also found ({len(findings)})", ""]
    for f in findings[:sections.MAX_FOLDED]:
        out.append(f"- **{sections.tag(f)}**: {f.summary}")
    if len(findings) > sections.MAX_FOLDED:
        out.append(f"- … and {len(findings) - sections.MAX_FOLDED} more (see the JSON report)")
    return out + [""]


def _unfinished(view: ReportView) -> list[str]:
    out = []
    for r in view.unfinished[:sections.MAX_ROWS]:
        at = r.last.note if r.last is not None else r.detail
        site = f" at `{site_text(r.last.site)}`" if r.last is not None and r.last.site else ""
        out.append(f"- rank {r.rank} ({r.status}): {at}{site}")
    return ["### Ranks that did not finish", "", *out, ""] if out else []


def _hang_stacks(view: ReportView) -> list[str]:
    out = []
    for r in view.hang_ranks[:sections.MAX_ROWS]:
        out.append(f"rank {r.rank}:")
        out += [f"    {site_text(site)}" for site in reversed(r.hang_stack[:6])]
    if not out:
        return []
    return ["### Stacks at the hang (main thread, your code, innermost last)", "", "```text",
            *out, "```", ""]
