"""``ddpdoctor diff`` and ``ddpdoctor timeline``: diagnose recorded traces again, or draw them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ddpdoctor.analysis import diagnose, diagnose_rounds
from ddpdoctor.analysis.report import Verdict
from ddpdoctor.cli.app import HelpCommand, app, fail, reading_progress, show, write_timeline
from ddpdoctor.launch.exits import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE
from ddpdoctor.render import formats
from ddpdoctor.render.interface import render
from ddpdoctor.trace.reader import NoTraces, TraceError, load_rounds, load_run, unreadable


@app.command(cls=HelpCommand,
             short_help="Diagnose recorded traces (or flight-recorder dumps) again.")
def diff(
    paths: list[Path] = typer.Argument(..., metavar="LOGDIR...",
                                       help="Log folder(s) or trace files (one folder per node)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON instead "
                                                       "(--format json)."),
    format_name: Optional[str] = typer.Option(
        None, "--format", metavar="FORMAT",
        help=f"Print the report in FORMAT ({', '.join(formats.FORMATS)}) instead."),
) -> None:
    """Align the per-rank traces and explain the first divergence: ranks, op, source lines, fix.
    Folders written by `ddpdoctor attach` (one per node) are diagnosed from their stacks; a
    folder of a dead job's own logs (torchrun's --log-dir, a Slurm .out file) from what each
    rank wrote last (its traceback, NCCL's watchdog, gloo's timeouts)."""
    # Imported at first use, as the launcher needs none of them (ddpdoctor.cli's docstring).
    from ddpdoctor.analysis.attach import diagnose_snapshots
    from ddpdoctor.analysis.postmortem import diagnose_logs, read_ranks
    from ddpdoctor.trace.job_logs import find_logs
    from ddpdoctor.trace.snapshot import SnapshotError, is_snapshot_folder
    from ddpdoctor.trace.snapshot import read as read_snapshot

    try:
        shown = formats.check_name(format_name) if format_name else "json" if json_out else None
    except ValueError as exc:
        fail(str(exc))
    try:
        if any(is_snapshot_folder(p) for p in paths):  # folders written by ddpdoctor attach
            report = diagnose_snapshots([read_snapshot(p) for p in paths])
        else:
            try:
                with reading_progress() as on_file:
                    runs = load_rounds([str(p) for p in paths], on_file)
                report = diagnose_rounds(runs)
            except NoTraces:
                logs = [log for p in paths if p.is_dir() for log in find_logs(p)]
                if not read_ranks(logs):  # no rank's own lines: nothing to diagnose from
                    raise
                report = diagnose_logs(logs)  # a dead job's own logs: a post-mortem
    except Exception as exc:  # noqa: BLE001 - damaged input is a message, never a traceback
        message = str(exc) if isinstance(exc, (TraceError, SnapshotError)) else unreadable(exc)
        if shown == "json":  # a script reading --json gets JSON, errors included
            sys.stdout.write(json.dumps({"error": message, "exit_code": EXIT_USAGE}) + "\n")
        fail(message)
    if shown is not None:
        sys.stdout.write(render(formats.reporter(shown), report))
    else:
        show(report, Console(highlight=False))
    raise typer.Exit(EXIT_OK if report.verdict in (Verdict.CLEAN, Verdict.RUNNING)
                     else EXIT_PROBLEM)


@app.command(cls=HelpCommand, short_help="Write a timeline of every rank for Perfetto.")
def timeline(
    paths: list[Path] = typer.Argument(..., metavar="LOGDIR...",
                                       help="Log folder(s) (one per node) or trace files."),
    out: Path = typer.Option(Path("ddpdoctor-timeline.json"), "-o", "--output", metavar="FILE",
                             help="The timeline file to write."),
) -> None:
    """Write a timeline of every rank (Chrome trace-event JSON): open it in ui.perfetto.dev
    (Open trace file) or chrome://tracing. One row per rank and group, each collective a slice
    in DDP terms, the first divergence marked and joined by arrows."""
    try:
        with reading_progress() as on_file:
            run = load_run([str(p) for p in paths], on_file)
    except TraceError as exc:
        fail(str(exc))
    write_timeline(run, diagnose(run), out)
