"""``ddpdoctor attach``: diagnose a running job that was not started under ddpdoctor."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console

from ddpdoctor.analysis.report import Verdict
from ddpdoctor.cli.app import HelpCommand, app, fail, say, show
from ddpdoctor.launch.command import DEFAULT_LOG_ROOT
from ddpdoctor.launch.exits import EXIT_HANG, EXIT_OK
from ddpdoctor.render.console import closing_line
from ddpdoctor.render.formats import reporter
from ddpdoctor.render.interface import render
from ddpdoctor.render.view import ReportView
from ddpdoctor.trace import schema

if TYPE_CHECKING:
    from ddpdoctor.launch.discover import FoundJob


def _pick(jobs: list[FoundJob], number: Optional[int]) -> FoundJob:
    if not jobs:
        fail("no torch.distributed job found on this node: no Python process has RANK (or "
             "SLURM_PROCID) in its environment, and none is a torch.multiprocessing.spawn "
             "worker; give the ranks' PIDs if they were started otherwise")
    if number is not None:
        if not 1 <= number <= len(jobs):
            fail(f"--job {number}: {len(jobs)} job(s) found on this node")
        return jobs[number - 1]
    if len(jobs) > 1:
        listing = "; ".join(f"[{i}] {j.describe()}" for i, j in enumerate(jobs, start=1))
        fail(f"{len(jobs)} jobs found on this node: {listing}. Choose one with --job N or "
             f"give its ranks' PIDs")
    return jobs[0]


def _logdir(requested: Optional[Path]) -> Path:
    path = requested or Path(DEFAULT_LOG_ROOT) / (
        "attach-" + datetime.now().strftime("%Y%m%d-%H%M%S"))
    if (path / schema.SNAPSHOT_FILE).exists():
        fail(f"{path} already holds an {schema.SNAPSHOT_FILE}; give a new folder with --logdir")
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        fail(f"cannot use log folder {path}: {exc.strerror or exc} (choose another with "
             f"--logdir)")
    return path


@app.command(cls=HelpCommand, short_help="Diagnose a running job that ddpdoctor did not start.")
def attach(
    pids: list[int] = typer.Argument(None, metavar="PID...",
                                     help="The ranks' process ids (default: every rank of the "
                                          "one torch.distributed job found on this node)."),
    logdir: Optional[Path] = typer.Option(None, "--logdir", metavar="DIR",
                                          help="Where to write attach.json (default: "
                                               "./ddpdoctor-logs/attach-<time>)."),
    job: Optional[int] = typer.Option(None, "--job", metavar="N", min=1,
                                      help="Which job, when several run on this node."),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE",
                                            help="Also write the report as JSON."),
    samples: int = typer.Option(3, "--samples", min=1, max=20, metavar="N",
                                help="How many times each rank is read."),
    interval: float = typer.Option(1.0, "--interval", min=0.05, max=30.0, metavar="SECONDS",
                                   help="Seconds between two reads."),
    native: Optional[bool] = typer.Option(None, "--native/--no-native",
                                          help="Read native frames of every rank / of none "
                                               "(default: only of ranks inside a backward, "
                                               "which that read pauses for about a second)."),
) -> None:
    """Read every rank of a job started without ddpdoctor (plain torchrun, srun, mp.spawn):
    each rank's stacks with py-spy, a few times apart, its CPU and I/O counters, and what the
    job left (stderr files, torchelastic error files, flight-recorder dumps). Prints which
    rank the others wait for, its line, the cause and the fix. The job is not stopped or
    changed: py-spy reads the ranks without pausing them (except a native read).

    On several nodes, run it on each node with its own --logdir, then
    `ddpdoctor diff node0/ node1/ ...`. Exit 0: no rank waits in a collective; 3: ranks wait
    in collectives (a hang diagnosed, or what is missing to diagnose it); 2: no job found, no
    stack readable, or bad usage."""
    # Imported at first use, as the launcher needs none of them (ddpdoctor.cli's docstring).
    from ddpdoctor.analysis.attach import diagnose_snapshots
    from ddpdoctor.analysis.stacks import PTRACE_FIX
    from ddpdoctor.launch import spy
    from ddpdoctor.launch.discover import find_jobs, unreadable
    from ddpdoctor.trace.snapshot import write

    started = time.monotonic()
    denied = unreadable(pids or [])
    if denied:
        fail("cannot read " + "; ".join(f"pid {p}: {why}" for p, why in denied.items()) + (
            f" (fix: {PTRACE_FIX})" if any("permission" in w for w in denied.values())
            else ""))
    try:
        found = _pick(find_jobs(pids or None), job)
        spy.py_spy()
    except spy.SpyMissing as exc:
        fail(str(exc))
    say(f"attaching to {found.describe()}")
    out = _logdir(logdir)
    snapshot = spy.take(found, out, samples=samples, interval=interval, native=native,
                        progress=say)
    write(snapshot, out)
    # A rank none of whose reads succeeded: its first error (an empty string: some read did).
    errors = [next((x.error for x in r.samples if x.error), "")
              if all(x.error for x in r.samples) else "" for r in snapshot.ranks
              if r.pid is not None]
    if errors and all(errors):
        fail(f"could not read the stack of any rank: {errors[0]}" + (
            f" (fix: {PTRACE_FIX})" if "ermission" in errors[0] else ""))
    report = diagnose_snapshots([snapshot])
    if json_out is not None:
        try:
            json_out.write_text(render(reporter("json"), report))
        except OSError as exc:
            fail(f"cannot write {json_out}: {exc.strerror or exc}")
    show(report, Console(highlight=False, file=sys.stdout))
    code = EXIT_OK if report.verdict == Verdict.RUNNING else EXIT_HANG
    say(f"read {len(snapshot.ranks)} rank(s) in {time.monotonic() - started:.1f}s; "
        f"evidence in {out} (ddpdoctor diff {out})")
    say(closing_line(ReportView(report)))
    raise typer.Exit(code)
