"""The report as Markdown: a CI summary (``--markdown FILE``, ``$GITHUB_STEP_SUMMARY``).

Same content as the console report, in GitHub-flavoured Markdown: the verdict headline, the
rank endings, the root finding with a table of what each rank was doing and each source line,
its cause, why and fix, the other findings folded to one line each, the stacks of a hang, the
notes, and :class:`RunInfo` problems found outside the diagnosis (a changed collective
schedule). Pure: a function of the :class:`~ddpdoctor.analysis.report.Report` and the
:class:`RunInfo`; source lines come from ``code_line`` (the console's by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.finding import Finding, RankDetail
from ddpdoctor.analysis.ranks import FINISHED
from ddpdoctor.analysis.report import Report
from ddpdoctor.analysis.terms import rank_list, site_text
from ddpdoctor.knowledge import catalog
from ddpdoctor.render.console import code_line as console_code_line
from ddpdoctor.render.run_info import RunInfo
from ddpdoctor.render.safe import clean_report, markdown_text
from ddpdoctor.trace.model import Site

MAX_ROWS = 8
MAX_FOLDED = 8

ICONS = {rp.CLEAN: "✅", rp.DIVERGED: "❌", rp.CRASHED: "❌", rp.INCOMPLETE: "⚠️"}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip() or "—"


def _code(text: str) -> str:
    tick = "``" if "`" in text else "`"
    return f"{tick}{text}{tick}" if text else "—"


def _short(site: Site | None) -> str:
    if site is None:
        return "—"
    return f"{site.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{site.line}"


def _rank_status(report: Report) -> str:
    by: dict[str, list[int]] = {}
    for r in report.ranks:
        by.setdefault(r.status, []).append(r.rank)
    parts = [f"{status}: {rank_list(ranks).split(' ', 1)[1]}" for status, ranks in by.items()]
    plural = "s" if report.world_size != 1 else ""
    return f"{report.world_size} rank{plural} — " + "; ".join(parts)


def _table(f: Finding) -> list[str]:
    rows: dict[tuple, list[int]] = {}
    first: dict[tuple, RankDetail] = {}
    for r, d in sorted(f.ranks.items()):
        key = (d.op, d.label, d.iteration, d.state, d.site)
        rows.setdefault(key, []).append(r)
        first.setdefault(key, d)
    out = ["| rank | op | label | iter | state | line |", "|---|---|---|---|---|---|"]
    items = list(rows.items())
    for key, ranks in items[:MAX_ROWS]:
        d = first[key]
        out.append(f"| {rank_list(ranks).split(' ', 1)[1]} | {_cell(d.op or '—')} | "
                   f"{_cell(d.label or '—')} | {'—' if d.iteration is None else d.iteration} | "
                   f"{_cell(d.state or '—')} | {_code(_short(d.site)) if d.site else '—'} |")
    if len(items) > MAX_ROWS:
        rest = sorted(r for _, ranks in items[MAX_ROWS:] for r in ranks)
        out.append(f"| {rank_list(rest).split(' ', 1)[1]} | … | | | | "
                   f"{len(items) - MAX_ROWS} more (see the JSON report) |")
    return out


def _sources(f: Finding, code_line: Callable[[Site], str]) -> list[str]:
    by_site: dict[Site, list[int]] = {}
    for r, d in sorted(f.ranks.items()):
        if d.site is not None:
            by_site.setdefault(d.site, []).append(r)
    if not by_site:
        return []
    lines = ["```text"]
    for site, ranks in list(by_site.items())[:MAX_ROWS]:
        lines.append(f"{rank_list(ranks)}: {site_text(site)}")
        code = code_line(site)
        if code:
            lines.append(f"    {site.line} | {code}")
    lines.append("```")
    return lines


def _root(f: Finding, code_line: Callable[[Site], str]) -> list[str]:
    where = []
    if f.group is not None:
        where.append("default group" if f.group == "0" else f"group {f.group}")
    if f.seq is not None:
        where.append(f"collective #{f.seq}")
    out = [f"### Root cause: `{f.kind}`" + (f" ({', '.join(where)})" if where else ""), "",
           f.summary, ""]
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
    for f in findings[:MAX_FOLDED]:
        tag = f.kind + (" (follow-on)" if f.follow_on else "") + \
            (" [warning]" if not f.is_error else "")
        out.append(f"- **{tag}**: {f.summary}")
    if len(findings) > MAX_FOLDED:
        out.append(f"- … and {len(findings) - MAX_FOLDED} more (see the JSON report)")
    return out + [""]


def _unfinished(report: Report) -> list[str]:
    rows = [r for r in report.ranks if r.status != FINISHED]
    if not rows:
        return []
    out = ["### Ranks that did not finish", ""]
    for r in rows[:MAX_ROWS]:
        where = r.last.note if r.last is not None else r.detail
        site = f" at `{site_text(r.last.site)}`" if r.last is not None and r.last.site else ""
        out.append(f"- rank {r.rank} ({r.status}): {where}{site}")
    return out + [""]


def _hang_stacks(report: Report) -> list[str]:
    rows = [r for r in report.ranks if r.hang_stack]
    if not rows:
        return []
    out = ["### Stacks at the hang (main thread, your code, innermost last)", "", "```text"]
    for r in rows[:MAX_ROWS]:
        out.append(f"rank {r.rank}:")
        out += [f"    {site_text(site)}" for site in reversed(r.hang_stack[:6])]
    return out + ["```", ""]


def render(report: Report | None, info: RunInfo,
           code_line: Callable[[Site], str] = console_code_line) -> str:
    """The Markdown summary of one ``ddpdoctor run`` (or ``diff``)."""
    if report is not None:
        report = clean_report(report, markdown_text)
    info = replace(info, name=markdown_text(info.name),
                               read_error=markdown_text(info.read_error or "") or None)
    if report is None:
        icon, word, text = "❌", "NO DIAGNOSIS", info.read_error or "the traces could not be read"
    else:
        icon = ICONS.get(report.verdict, "⚠️")
        word, text = report.verdict.upper(), rp.VERDICT_TEXT.get(report.verdict, "")
    out = [f"## {icon} ddpdoctor: {word} — {text}", ""]
    facts = [_code(info.name)]
    if report is not None:
        facts.append(_rank_status(report))
    if info.exit_code is not None:
        facts.append(f"exit {info.exit_code}")
    if info.seconds is not None:
        facts.append(f"{info.seconds:.1f} s")
    out += [" · ".join(facts), ""]
    if info.problems:
        out += ["### Collective schedule changed", "", "```text", *info.problems, "```", ""]
    if report is not None:
        if report.verdict == rp.INCOMPLETE:
            out += _unfinished(report)
        root = report.root
        if root is not None and (root.is_error or report.verdict != rp.CLEAN):
            out += _root(root, code_line)
            out += _folded(report.findings[1:])
        else:
            out += _folded(report.findings)
        out += _hang_stacks(report)
        if report.notes:
            out += ["### Notes", ""] + [f"- {note}" for note in report.notes] + [""]
    if info.logdir:
        out += [f"Traces: `{info.logdir}` (`ddpdoctor diff {info.logdir}` explains them again)",
                ""]
    return "\n".join(out).rstrip() + "\n"
