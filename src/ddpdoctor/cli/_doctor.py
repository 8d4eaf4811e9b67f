"""What ddpdoctor does, as calls the CLI (or a test) makes: run a job, diff traces, save and
compare collective schedules.

Also the exit-code policy, in one place:

====  =====================================================================================
0     the job succeeded and nothing diverged (``diff``: the traces are clean)
1     a problem was found: a rank crashed or diverged (``run``: or the job's own non-zero code,
      or the collective schedule differs from ``--expect-schedule``)
2     bad usage or unreadable input
3     ``run`` detected a hang (or a rank stuck in its own code), collected the evidence and
      stopped the job
4     ``run`` in CI mode (``--cpu``, ``--max-steps``, ``--junit``, ``--markdown`` or ``$CI``
      set): nothing was tested (no process group initialised, no collective recorded)
130   ``run`` was interrupted (SIGINT/SIGTERM); the job was stopped, the logs kept
====  =====================================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor import schedule
from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis.report import UNTESTED, Report
from ddpdoctor.launch.command import make_logdir
from ddpdoctor.launch.job import JobResult, run_job
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.launch.options import RunOptions, UsageError, check_options, check_script
from ddpdoctor.trace.model import Run
from ddpdoctor.trace.reader import NoTraces, TraceError, load_run

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_HANG = 3
EXIT_UNTESTED = 4
EXIT_INTERRUPTED = 130


@dataclass
class RunOutcome:
    """A finished ``ddpdoctor run``: how the job ended, the diagnosis, the exit code."""

    job: JobResult
    report: Report | None
    exit_code: int
    read_error: str | None = None
    teardown_only: bool = False
    schedule_diff: list[str] = field(default_factory=list)  # --expect-schedule differences


def diff(paths: Iterable[str]) -> Report:
    """Diagnose the traces under ``paths``; raises TraceError on unreadable input."""
    return diagnose(load_run(paths))


def prepare_run(opts: RunOptions) -> Path:
    """Validate the options, the script and the expected schedule, and create the log folder
    (raises UsageError)."""
    check_options(opts)
    check_script(opts)
    if opts.expect_schedule:
        _expected_schedule(opts.expect_schedule)
    return make_logdir(opts.logdir)


def _expected_schedule(path: str) -> schedule.Schedule:
    try:
        return schedule.load(path)
    except schedule.ScheduleError as exc:
        raise UsageError(str(exc)) from None


def save_schedule(paths: Iterable[str], out: str) -> schedule.Schedule:
    """Write the collective schedule of the traces under ``paths`` to ``out`` (raises
    TraceError or ScheduleError)."""
    sched = schedule.from_run(load_run(paths))
    schedule.save(sched, out)
    return sched


def compare_schedule(expected: str, paths: Iterable[str]) -> list[str]:
    """How the traces under ``paths`` differ from the schedule file ``expected`` (one line
    each; empty when they do not). Raises TraceError or ScheduleError."""
    return schedule.compare(schedule.load(expected), schedule.from_run(load_run(paths)))


def run(opts: RunOptions, logdir: Path,
        on_status: Callable[[JobProgress, str], None] | None = None,
        on_output: Callable[[str, bool], None] | None = None) -> RunOutcome:
    """Run the job under instrumentation and diagnose what its ranks recorded."""
    expected = _expected_schedule(opts.expect_schedule) if opts.expect_schedule else None
    job = run_job(opts, logdir, on_status, on_output)
    report, read_error, changes = None, None, []
    try:
        loaded = load_run([str(logdir)])
        loaded.stopped_for_hang = job.hang
        report = diagnose(loaded)
        if expected is not None:
            changes = schedule.compare(expected, schedule.from_run(loaded))
    except NoTraces:
        # No process became a rank: the script never initialised a process group.
        report = diagnose(Run(ranks={}, world_size=0, notes=[
            "no rank trace was written: the script never called init_process_group"]))
    except TraceError as exc:
        read_error = str(exc)
    outcome = _outcome(job, report, read_error)
    if outcome.report is not None and outcome.report.verdict == UNTESTED and \
            outcome.exit_code == EXIT_OK and opts.ci_mode:
        outcome.exit_code = EXIT_UNTESTED
    outcome.schedule_diff = changes
    if changes and outcome.exit_code == EXIT_OK:
        outcome.exit_code = EXIT_PROBLEM
    return outcome


def _outcome(job: JobResult, report: Report | None, read_error: str | None) -> RunOutcome:
    if job.interrupted:
        return RunOutcome(job, report, EXIT_INTERRUPTED, read_error)
    if job.hang:
        return RunOutcome(job, report, EXIT_HANG, read_error)
    problem = report is not None and report.has_errors
    if job.exit_code == 0:
        return RunOutcome(job, report, EXIT_PROBLEM if problem else EXIT_OK, read_error)
    if report is not None and not problem and report.all_finished:
        # Every rank finished its script; the process aborted in teardown (gloo + DDP).
        return RunOutcome(job, report, EXIT_OK, read_error, teardown_only=True)
    return RunOutcome(job, report, job.exit_code if job.exit_code > 0 else EXIT_PROBLEM,
                      read_error)
