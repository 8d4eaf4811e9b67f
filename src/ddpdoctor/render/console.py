"""The console report: verdict, root finding with each rank's line of code, cause, fix.

Built to be read in ten seconds, in a terminal or in a CI log without colour: one headline,
one table of what each rank was doing at the root finding (ranks doing the same thing share a
row), the code of each source line (as the rank captured it; no file is opened), then
the cause's title, why and how to fix it; other findings folded to one line each.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.finding import Finding, RankDetail
from ddpdoctor.analysis.ranks import FINISHED
from ddpdoctor.analysis.report import Report
from ddpdoctor.analysis.terms import rank_list, site_text
from ddpdoctor.knowledge import catalog
from ddpdoctor.render.safe import clean, clean_report
from ddpdoctor.trace.model import Site

MAX_ROWS = 8
MAX_FOLDED = 8

_COLOURS = {rp.CLEAN: "green", rp.DIVERGED: "red", rp.CRASHED: "red", rp.INCOMPLETE: "yellow"}


def code_line(site: Site | None) -> str:
    """The source text of ``site`` as its rank captured it ('' when it could not): a report
    never opens a file a trace names."""
    return clean(site.text) if site is not None else ""


def _rank_status_line(report: Report) -> str:
    by_status: dict[str, list[int]] = {}
    for r in report.ranks:
        by_status.setdefault(r.status, []).append(r.rank)
    parts = [f"{status}: {rank_list(ranks).split(' ', 1)[1]}" for status, ranks in
             by_status.items()]
    return f"{report.world_size} rank{'s' if report.world_size != 1 else ''} — " + \
        "; ".join(parts)


def _headline(report: Report, console: Console) -> None:
    colour = _COLOURS.get(report.verdict, "yellow")
    word, text = report.verdict.upper(), rp.VERDICT_TEXT.get(report.verdict, "")
    line = Text()
    line.append(f"ddpdoctor: {word}", style=f"bold {colour}")
    line.append(f" — {text}")
    console.print(line)
    console.print(_rank_status_line(report), markup=False, highlight=False)


def _row_key(d: RankDetail) -> tuple:
    return (d.op, d.label, d.iteration, d.state, d.site)


def _short_site(site: Site | None) -> str:
    if site is None:
        return "—"
    return f"{site.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{site.line}"


def _rank_table(f: Finding) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    for name in ("rank", "op", "label", "iter", "state", "line"):
        table.add_column(name, overflow="fold")
    rows: dict[tuple, list[int]] = {}
    details: dict[tuple, RankDetail] = {}
    for r, d in sorted(f.ranks.items()):
        key = _row_key(d)
        rows.setdefault(key, []).append(r)
        details.setdefault(key, d)
    items = list(rows.items())
    for key, ranks in items[:MAX_ROWS]:
        d = details[key]
        table.add_row(rank_list(ranks).split(" ", 1)[1], d.op or "—", d.label or "—",
                      "—" if d.iteration is None else str(d.iteration), d.state or "—",
                      _short_site(d.site))
    if len(items) > MAX_ROWS:
        rest = sorted(r for _, ranks in items[MAX_ROWS:] for r in ranks)
        table.add_row(rank_list(rest).split(" ", 1)[1], "…", "", "", "",
                      f"{len(items) - MAX_ROWS} more (see --json)")
    return table


def _source_block(f: Finding, console: Console) -> None:
    """Each distinct source line of the root finding, with the ranks there and its code."""
    by_site: dict[Site, list[int]] = {}
    for r, d in sorted(f.ranks.items()):
        if d.site is not None:
            by_site.setdefault(d.site, []).append(r)
    for site, ranks in list(by_site.items())[:MAX_ROWS]:
        line = Text(f"  {rank_list(ranks)}: ", style="bold")
        line.append(site_text(site))
        console.print(line)
        code = code_line(site)
        if code:
            console.print(Text(f"      {site.line} | ", style="dim") + Text(code, style="cyan"))


def _context_line(f: Finding) -> str | None:
    if not f.context:
        return None
    parts: dict[tuple, list[int]] = {}
    for r, d in sorted(f.context.items()):
        parts.setdefault((d.op, d.label, d.note, _short_site(d.site)), []).append(r)
    shown = "; ".join(f"{note} on {rank_list(rs_)} ({site})"
                      for (_op, _label, note, site), rs_ in list(parts.items())[:3])
    return f"Last matched before it: #{f.context_seq}: {shown}"


def _labelled(rows: list[tuple[str, Text | str, str]]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for label, value, style in rows:
        grid.add_row(Text(label, style=style), value)
    return grid


def _root(f: Finding, console: Console) -> None:
    console.print()
    where = []
    if f.group is not None:
        where.append("default group" if f.group == "0" else f"group {f.group}")
    if f.seq is not None:
        where.append(f"collective #{f.seq}")
    title = Text("Root cause: ", style="bold")
    title.append(f.kind, style="bold")
    if where:
        title.append(f"  ({', '.join(where)})")
    console.print(title)
    console.print(f.summary, markup=False, highlight=False)
    console.print(_rank_table(f))
    _source_block(f, console)
    context = _context_line(f)
    if context:
        console.print(context, markup=False, highlight=False, style="dim")
    cause = catalog.get(f.cause)
    rows: list[tuple[str, Text | str, str]] = []
    if cause is not None:
        rows.append(("Cause:", Text(cause.title) + Text(f"  [{cause.id}]", style="dim"),
                     "bold"))
        rows.append(("Why:", Text(cause.explanation), "bold"))
    for item in f.evidence:
        rows.append(("", Text(f"• {item}"), ""))
    if f.advice:
        rows.append(("Fix:", Text(f.advice), "bold green"))
    if rows:
        console.print()
        console.print(_labelled(rows))


def _folded(findings: list[Finding], console: Console) -> None:
    if not findings:
        return
    console.print()
    console.print(Text(f"Also found ({len(findings)}):", style="bold"))
    # A grid wraps a long summary under its own first word, never cut: the bullet stands alone.
    grid = Table.grid(padding=0)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for f in findings[:MAX_FOLDED]:
        tag = f"{f.kind}" + (" (follow-on)" if f.follow_on else "") + \
            (" [warning]" if not f.is_error else "")
        grid.add_row("  • ", Text(tag, style="bold") + Text(f": {f.summary}"))
    console.print(grid)
    if len(findings) > MAX_FOLDED:
        console.print(f"  … and {len(findings) - MAX_FOLDED} more (see --json)", markup=False)


def _unfinished(report: Report, console: Console) -> None:
    """For an incomplete run: where each rank that did not finish was left."""
    rows = [r for r in report.ranks if r.status != FINISHED]
    if not rows:
        return
    console.print()
    console.print(Text("Ranks that did not finish:", style="bold"))
    for r in rows[:MAX_ROWS]:
        where = r.last.note if r.last is not None else r.detail
        site = f" at {site_text(r.last.site)}" if r.last is not None and r.last.site else ""
        console.print(f"  • rank {r.rank} ({r.status}): {where}{site}", markup=False,
                      highlight=False)
    if len(rows) > MAX_ROWS:
        console.print(f"  … and {len(rows) - MAX_ROWS} more (see --json)", markup=False)


def _hang_stacks(report: Report, console: Console) -> None:
    """Where each rank's main thread was when the hang was detected (user frames)."""
    rows = [r for r in report.ranks if r.hang_stack]
    if not rows:
        return
    console.print()
    console.print(Text("Stacks at the hang (main thread, your code, innermost last):",
                       style="bold"))
    for r in rows[:MAX_ROWS]:
        console.print(Text(f"  rank {r.rank}:", style="bold"))
        for site in reversed(r.hang_stack[:6]):
            console.print(f"      {site_text(site)}", markup=False, highlight=False)
        code = code_line(r.hang_stack[0])
        if code:
            console.print(Text(f"      {r.hang_stack[0].line} | ", style="dim")
                          + Text(code, style="cyan"))
    if len(rows) > MAX_ROWS:
        console.print(f"  … and {len(rows) - MAX_ROWS} more (see --json)", markup=False)


def plain_text(report: Report, width: int = 100) -> str:
    """The report as plain text for a log (CI): no colour, lines up to ``width`` wide instead
    of wrapped at 80 columns, no trailing spaces."""
    buffer = io.StringIO()
    render(report, Console(file=buffer, width=width, color_system=None, force_terminal=False,
                           highlight=False, emoji=False))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def render(report: Report, console: Console) -> None:
    """Print ``report`` on ``console`` (works without a terminal and without colour)."""
    report = clean_report(report)
    _headline(report, console)
    if report.verdict == rp.INCOMPLETE:
        _unfinished(report, console)
    root = report.root
    if root is not None and (root.is_error or report.verdict != rp.CLEAN):
        _root(root, console)
        _folded(report.findings[1:], console)
    else:
        _folded(report.findings, console)
    _hang_stacks(report, console)
    if report.notes:
        console.print()
        console.print(Text("Notes:", style="bold"))
        for note in report.notes:
            console.print(f"  • {note}", markup=False, highlight=False)
