"""``ddpdoctor schedule save`` and ``compare``: keep a job's collective schedule, check later runs
against it (the logic: :mod:`ddpdoctor.analysis.schedule`)."""

from __future__ import annotations

from pathlib import Path

import typer

from ddpdoctor.analysis import schedule
from ddpdoctor.analysis.schedule import ScheduleError
from ddpdoctor.cli.app import HelpCommand, app, fail
from ddpdoctor.launch.exits import EXIT_PROBLEM
from ddpdoctor.trace.reader import TraceError, load_run

schedule_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None,
    help="Save a job's collective schedule, and check later runs against it.")
app.add_typer(schedule_app, name="schedule",
              short_help="Save a job's collective schedule; check later runs against it.")


@schedule_app.command("save", cls=HelpCommand)
def schedule_save(
    logdir: Path = typer.Argument(..., metavar="LOGDIR",
                                  help="Log folder of a good run (ddpdoctor run --logdir)."),
    out: Path = typer.Argument(..., metavar="FILE",
                               help="Schedule file to write (YAML), e.g. schedule.yaml."),
) -> None:
    """Write the job's collective schedule: init, then one steady-state DDP iteration."""
    try:
        sched = schedule.from_run(load_run([str(logdir)]))
        schedule.save(sched, str(out))
    except (TraceError, ScheduleError) as exc:
        fail(str(exc))
    entries = sum(len(r.init) + len(r.iteration) for r in sched.ranks)
    parts = "init only: no DDP iteration" if sched.iteration is None else \
        f"init and iteration {sched.iteration}"
    print(f"wrote {out}: {entries} collectives ({parts}) of {sched.world_size} ranks")


@schedule_app.command("compare", cls=HelpCommand)
def schedule_compare(
    expected: Path = typer.Argument(..., metavar="FILE",
                                    help="File written by 'ddpdoctor schedule save'."),
    logdir: list[Path] = typer.Argument(..., metavar="LOGDIR...",
                                        help="Log folder(s) of the run to check."),
) -> None:
    """Exit 1 with the differences when the run adds, removes or reshapes a collective."""
    try:
        changes = schedule.compare(schedule.load(str(expected)),
                                   schedule.from_run(load_run([str(p) for p in logdir])))
    except (TraceError, ScheduleError) as exc:
        fail(str(exc))
    if changes:
        print(f"the collective schedule differs from {expected}:")
        for line in changes:
            print(f"  {line}")
        raise typer.Exit(EXIT_PROBLEM)
    print(f"the collective schedule matches {expected}")
