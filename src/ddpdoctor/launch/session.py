"""One ``ddpdoctor run`` from its options to its outcome: check the options and make the log
folder (:func:`prepare_run`), run and watch the job (``launch/job.py``), diagnose what its
ranks recorded, and decide the exit code from both (:func:`outcome_of`, the README's table of
verdicts and exit codes). The command line (``cli/run.py``) only reads options and prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.analysis import diagnose, diagnose_rounds, schedule
from ddpdoctor.analysis.report import Report
from ddpdoctor.launch.command import check_flight_recorder, make_logdir
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.exits import (
    EXIT_HANG,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNTESTED,
)
from ddpdoctor.launch.job import JobResult, run_job
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.launch.options import SHARE_FROM_RANKS, RunOptions, check_options, check_script
from ddpdoctor.runtime.env import Launcher
from ddpdoctor.trace import schema
from ddpdoctor.trace.model import Run
from ddpdoctor.trace.reader import NoTraces, TraceError, load_rounds, unreadable, wait_for_tails
from ddpdoctor.trace.shared_lines import SharingDone, share_lines


@dataclass
class RunOutcome:
    """A finished ``ddpdoctor run``: how the job ended, the diagnosis, the exit code."""

    job: JobResult
    report: Report | None
    exit_code: int
    read_error: str | None = None
    teardown_only: bool = False
    schedule_diff: list[str] = field(default_factory=list)  # --expect-schedule differences
    shared: SharingDone | None = None  # what --share-lines rewrote


def prepare_run(opts: RunOptions) -> Path:
    """Validate the options, the script and the expected schedule, and create the log folder
    (raises UsageError)."""
    check_options(opts)
    check_flight_recorder(opts)
    check_script(opts)
    if opts.expect_schedule:
        _expected_schedule(opts.expect_schedule)
    return make_logdir(opts.logdir)


def _expected_schedule(path: str) -> schedule.Schedule:
    try:
        return schedule.load(path)
    except schedule.ScheduleError as exc:
        raise UsageError(str(exc)) from None


def _no_rank_note(opts: RunOptions, job: JobResult, logdir: Path) -> str:
    """Why no process became a rank: torchrun never started the script (its own options or
    environment stopped it: no worker exit codes were recorded), the script failed before it
    initialised a process group (an import error), or it never initialised one."""
    started = any(logdir.glob(f"{schema.EXITS_PREFIX}*.json"))
    failed = job.exit_code not in (0, None) and not job.interrupted
    if opts.launcher == Launcher.TORCHRUN and not started and failed:
        return (f"torchrun started no rank: it stopped with exit code {job.exit_code} before "
                f"running the script (its own error is printed above)")
    if failed:
        return (f"the script stopped (exit code {job.exit_code}) before it called "
                f"init_process_group: no rank was recorded (its error is printed above)")
    return "no rank trace was written: the script never called init_process_group"


def run_and_diagnose(opts: RunOptions, logdir: Path,
        on_status: Callable[[JobProgress, str], None] | None = None,
        on_output: Callable[[str, bool], None] | None = None,
        terminal: int | None = None) -> RunOutcome:
    """Run the job under instrumentation and diagnose what its ranks recorded."""
    expected = _expected_schedule(opts.expect_schedule) if opts.expect_schedule else None
    job = run_job(opts, logdir, on_status, on_output, terminal)
    wait_for_tails(str(logdir))
    report, read_error, changes = None, None, []
    try:
        rounds = load_rounds([str(logdir)])
        rounds[-1].stopped_for_hang = job.hang
        rounds[-1].interrupted = job.interrupted
        rounds[-1].running = False  # the lock read as held is this run's own
        report = diagnose_rounds(rounds)
        if expected is not None:
            changes = schedule.compare(expected, schedule.from_run(rounds[-1]))
    except NoTraces:
        report = diagnose(Run(ranks={}, world_size=0, notes=[_no_rank_note(opts, job, logdir)]))
    except TraceError as exc:
        read_error = str(exc)
    except Exception as exc:  # noqa: BLE001 - damaged input is a message, never a traceback
        read_error = unreadable(exc)
    outcome = outcome_of(job, report, read_error, opts.ci_mode, changes)
    world = report.world_size if report is not None else 0
    if opts.share_lines or (opts.share_lines is None and world >= SHARE_FROM_RANKS):
        outcome.shared = share_lines(logdir)
    return outcome


def outcome_of(job: JobResult, report: Report | None, read_error: str | None, ci_mode: bool,
               changes: list[str] | None = None) -> RunOutcome:
    """The run's exit code from how the job ended and its diagnosis: the README's table of
    verdicts and exit codes. In CI mode a report that CI counts as failed
    (``render.run_info.failed``) never comes with exit 0."""
    outcome = _outcome(job, report, read_error)
    if outcome.report is not None and outcome.report.verdict.unverified and \
            outcome.exit_code == EXIT_OK and ci_mode:
        # One verdict everywhere: a CI step whose report fails must fail too.
        outcome.exit_code = EXIT_UNTESTED
    outcome.schedule_diff = list(changes or [])
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
