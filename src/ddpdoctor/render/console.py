"""The console report: verdict, root finding with each rank's line of code, cause, fix.

Built to be read in ten seconds, in a terminal or in a CI log without colour: one headline,
one table of what each rank was doing at the root finding (ranks doing the same thing share a
row), the code of each source line (as the rank captured it; no file is opened), then
the cause's title, why and how to fix it; other findings folded to one line each.
:class:`ConsoleReporter` is the :class:`~ddpdoctor.render.interface.Reporter`.

The *brief* form is what a terminal shows at the end of ``ddpdoctor run``: the headline, the
root finding's table and lines of code, the cause's title and its fix, then one line saying
where the rest (why, the other findings, stacks, notes) is: it fits a 30-row terminal's last
screen.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import replace

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.finding import Finding
from ddpdoctor.analysis.report import RankSummary
from ddpdoctor.analysis.terms import rank_list, rank_numbers, site_text
from ddpdoctor.knowledge import catalog
from ddpdoctor.render.safe import clean, clean_report
from ddpdoctor.render.view import (
    MAX_FOLDED,
    MAX_ROWS,
    ReportView,
    overflow,
    rows,
    sources,
    tag,
    where,
)
from ddpdoctor.trace.model import Site

_COLOURS = {rp.Verdict.CLEAN: "green", rp.Verdict.DIVERGED: "red", rp.Verdict.CRASHED: "red",
            rp.Verdict.INCOMPLETE: "yellow"}


def _colour(report: rp.Report | None) -> str:
    """The colour of a report's verdict (yellow for no report)."""
    return "yellow" if report is None else _COLOURS.get(report.verdict, "yellow")


class ConsoleReporter:
    """The report as a terminal shows it: ``color_system`` None for plain text (a log, CI),
    lines up to ``width`` wide and no trailing spaces."""

    def __init__(self, width: int = 100, color_system: str | None = None,
                 brief: str | None = None) -> None:
        self.width = width
        self.color_system = color_system
        self.brief = brief  # the brief form, the whole report being in this file

    def render(self, view: ReportView) -> str:
        buffer = io.StringIO()
        console = Console(file=buffer, width=self.width, color_system=self.color_system,  # type: ignore[arg-type]
                          force_terminal=self.color_system is not None, highlight=False,
                          emoji=False)
        if self.brief is None:
            _print(view, console)
        else:
            _print_brief(view, console, self.brief)
        return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()) + "\n"


def code_line(site: Site | None) -> str:
    """The source text of ``site`` as its rank captured it ('' when it could not): a report
    never opens a file a trace names."""
    return clean(site.text) if site is not None else ""


def _print(view: ReportView, console: Console) -> None:
    if view.report is not None:
        view = replace(view, report=clean_report(view.report))
    _headline(view, console)
    _unfinished(view, console)
    if view.root is not None:
        _root(view.root, console)
    _folded(view.folded, console)
    _hang_stacks(view, console)
    _notes(view, console)


def _notes(view: ReportView, console: Console) -> None:
    if view.report is not None and view.report.notes:
        console.print()
        console.print(Text("Notes:", style="bold"))
        for note in view.report.notes:
            console.print(f"  • {note}", markup=False, highlight=False)


def _print_brief(view: ReportView, console: Console, whole: str) -> None:
    if view.report is not None:
        view = replace(view, report=clean_report(view.report))
    left: list[str] = []
    if view.root is not None:
        _root(view.root, console, brief=view)
        if catalog.get(view.root.cause) is not None or view.root.evidence:
            left.append("why")
        if view.hang_ranks:
            left.append("the stacks")
    else:  # no finding to explain: the notes are the answer (what ran, what was not reached)
        _headline(view, console)
        _unfinished(view, console)
        _hang_stacks(view, console)
        _notes(view, console)
    if view.folded:
        left.append(f"{len(view.folded)} other finding{'s' if len(view.folded) > 1 else ''}")
    notes = len(view.report.notes) if view.report is not None and view.root is not None else 0
    if notes:
        left.append(f"{notes} note{'s' if notes > 1 else ''}")
    if left:
        console.print(Text(f"More ({', '.join(left)}): {whole}, or run with --verbose",
                           style="dim"))


def closing_line(view: ReportView) -> str:
    """The verdict again in one line, for the very end: 'DIVERGED — root cause
    callsite_divergence [rank_conditional_ddp_forward]'."""
    root = view.root
    if root is None:
        return f"{view.verdict_word} — {view.verdict_text}"
    return f"{view.verdict_word} — root cause {root.kind}" + \
        (f" [{root.cause}]" if root.cause else "")


def _headline(view: ReportView, console: Console) -> None:
    line = Text()
    line.append(f"ddpdoctor: {view.verdict_word}", style=f"bold {_colour(view.report)}")
    line.append(f" — {view.verdict_text}")
    console.print(line)
    if view.rank_status:
        console.print(view.rank_status, markup=False, highlight=False)


def _rank_table(f: Finding) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    for name in ("rank", "op", "label", "iter", "state", "line"):
        table.add_column(name, overflow="fold")
    items = rows(f)
    for row in items[:MAX_ROWS]:
        d = row.detail
        table.add_row(row.rank_text, d.op or "—", d.label or "—",
                      "—" if d.iteration is None else str(d.iteration), d.state or "—",
                      d.site.short if d.site else "—")
    rest = overflow(items)
    if rest:
        table.add_row(rank_numbers(rest), "…", "", "", "",
                      f"{len(items) - MAX_ROWS} more (see --json)")
    return table


def _source_block(f: Finding, console: Console) -> None:
    """Each distinct source line of the root finding, with the ranks there and its code."""
    for site, ranks in sources(f):
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
        parts.setdefault((d.op, d.label, d.note, d.site.short if d.site else "—"),
                         []).append(r)
    shown = "; ".join(f"{note} on {rank_list(rs_)} ({site})"
                      for (_op, _label, note, site), rs_ in list(parts.items())[:3])
    return f"Last matched before it: #{f.context_seq}: {shown}"


def _labelled(items: list[tuple[str, Text | str, str]]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for label, value, style in items:
        grid.add_row(Text(label, style=style), value)
    return grid


def _root(f: Finding, console: Console, brief: ReportView | None = None) -> None:
    """The root finding; ``brief``: its essentials, under a headline of the view's verdict."""
    if brief is None:
        console.print()
        title = Text("Root cause: ", style="bold")
    else:
        title = Text(f"ddpdoctor: {brief.verdict_word}", style=f"bold {_colour(brief.report)}")
        title.append(" — root cause ")
    title.append(f.kind, style="bold")
    if where(f):
        title.append(f"  ({where(f)})")
    console.print(title)
    console.print(f.summary, markup=False, highlight=False)
    console.print(_rank_table(f))
    _source_block(f, console)
    context = _context_line(f)
    if context and brief is None:
        console.print(context, markup=False, highlight=False, style="dim")
    cause = catalog.get(f.cause)
    items: list[tuple[str, Text | str, str]] = []
    if cause is not None:
        items.append(("Cause:", Text(cause.title) + Text(f"  [{cause.id}]", style="dim"),
                      "bold"))
        if brief is None:
            items.append(("Why:", Text(cause.explanation), "bold"))
    elif f.is_error:
        # No known cause's premises hold (or none matched): what is known is the table above.
        items.append(("Cause:", Text("none of the known causes fits the record: each rank's "
                                     "op and line above are what is known"), "bold"))
    for item in f.evidence if brief is None else []:
        items.append(("", Text(f"• {item}"), ""))
    if f.advice:
        items.append(("Fix:", Text(f.advice), "bold green"))
    if items:
        if brief is None:
            console.print()
        console.print(_labelled(items))


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
        grid.add_row("  • ", Text(tag(f), style="bold") + Text(f": {f.summary}"))
    console.print(grid)
    if len(findings) > MAX_FOLDED:
        console.print(f"  … and {len(findings) - MAX_FOLDED} more (see --json)", markup=False)


def _rank_section(console: Console, title: str, ranks: list[RankSummary],
                  show: Callable[[RankSummary], None]) -> None:
    """A titled list of ranks (nothing when there are none), at most :data:`MAX_ROWS`."""
    if not ranks:
        return
    console.print()
    console.print(Text(title, style="bold"))
    for r in ranks[:MAX_ROWS]:
        show(r)
    if len(ranks) > MAX_ROWS:
        console.print(f"  … and {len(ranks) - MAX_ROWS} more (see --json)", markup=False)


def _unfinished(view: ReportView, console: Console) -> None:
    """For an incomplete run: where each rank that did not finish was left."""
    def show(r: RankSummary) -> None:
        at = r.last.note if r.last is not None else r.detail
        site = f" at {site_text(r.last.site)}" if r.last is not None and r.last.site else ""
        console.print(f"  • rank {r.rank} ({r.status}): {at}{site}", markup=False,
                      highlight=False)

    _rank_section(console, "Ranks that did not finish:", view.unfinished, show)


def _hang_stacks(view: ReportView, console: Console) -> None:
    """Where each rank's main thread was when the hang was detected (user frames)."""
    def show(r: RankSummary) -> None:
        console.print(Text(f"  rank {r.rank}:", style="bold"))
        for site in reversed(r.hang_stack[:6]):
            console.print(f"      {site_text(site)}", markup=False, highlight=False)
        code = code_line(r.hang_stack[0])
        if code:
            console.print(Text(f"      {r.hang_stack[0].line} | ", style="dim")
                          + Text(code, style="cyan"))

    title = "Where each rank is" if view.report is not None and \
        view.report.verdict == rp.Verdict.RUNNING else "Stacks at the hang"
    _rank_section(console, f"{title} (main thread, your code, innermost last):",
                  view.hang_ranks, show)
