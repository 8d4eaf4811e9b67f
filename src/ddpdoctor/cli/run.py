"""``ddpdoctor run``: start the script under torchrun (or as its own launcher) with every rank
recorded, watch it, and diagnose what the ranks recorded; the command line's torchrun options
are told apart from ddpdoctor's own here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

from ddpdoctor.analysis.report import Verdict
from ddpdoctor.cli.app import (
    HelpCommand,
    app,
    click_command,
    err,
    fail,
    say,
    show,
    write_timeline,
)
from ddpdoctor.launch.command import (
    CPU_MODE_NPROC,
    gpu_count_word,
    lone_rank,
    needs_cpu_mode,
)
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.exits import (
    EXIT_OK,
    EXIT_UNTESTED,
    EXIT_USAGE,
)
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.launch.options import (
    SHARE_FROM_RANKS,
    RunOptions,
)
from ddpdoctor.launch.session import prepare_run, run_and_diagnose
from ddpdoctor.render import formats, live
from ddpdoctor.render.console import closing_line
from ddpdoctor.render.run_info import RunInfo
from ddpdoctor.render.view import ReportView
from ddpdoctor.runtime.env import Launcher
from ddpdoctor.trace import nested_launch, redact, schema
from ddpdoctor.trace.reader import (
    TraceError,
    load_run,
)

RUN_EPILOG = ("torchrun's own options (--nproc-per-node, --nnodes, --rdzv-*, --standalone, "
              "-m, ...) pass through to torchrun. Default --nproc-per-node: the visible GPUs, "
              "else 2.")


def _output(flag: str, what: str) -> Any:
    """A --FLAG FILE option for one more report file."""
    return typer.Option(None, flag, metavar="FILE", help=f"Also write {what}.")


@app.command("run", cls=HelpCommand, context_settings={"allow_interspersed_args": False},
             epilog=RUN_EPILOG,
             short_help="Run a DDP script with every rank recorded, and diagnose it.")
def run_command(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT",
                                 help="The training script (or module with -m)."),
    args: Optional[list[str]] = typer.Argument(None, metavar="ARGS",
                                               help="Arguments for the script."),
    launcher: Launcher = typer.Option(
        RunOptions.launcher, "--launcher", metavar="torchrun|python",
        help="python for scripts that start their own workers (mp.spawn, "
             "multiprocessing.Process). Another launcher: put its whole command after -- "
             "(-- accelerate launch train.py; -- srun python train.py)."),
    logdir: Optional[Path] = typer.Option(
        None, "--logdir", metavar="DIR",
        help="Where the traces and reports go (default: a new private folder under "
             "./ddpdoctor-logs)."),
    backend: Optional[str] = typer.Option(
        None, "--backend", metavar="NAME",
        help="Use this backend instead of the script's (e.g. gloo)."),
    hang_timeout: float = typer.Option(
        RunOptions.hang_timeout, "--hang-timeout", metavar="SECONDS", min=0.5,
        help="Seconds the ranks may all wait in collectives, none progressing, before the "
             "job is a hang (collectives that can never match are diagnosed at once)."),
    stuck_timeout: float = typer.Option(
        RunOptions.stuck_timeout, "--stuck-timeout", metavar="SECONDS", min=0.5,
        help="Seconds a rank may sit idle at one line of its own code while others wait, "
             "before the job is stopped as stuck there."),
    grace: float = typer.Option(RunOptions.grace, "--grace", metavar="SECONDS", min=0.0,
                                help="Seconds between SIGTERM and SIGKILL when stopping the job."),
    json_out: Optional[Path] = _output("--json", "the report as JSON here"),
    cpu: bool = typer.Option(
        RunOptions.cpu, "--cpu",
        help="Run a script written for CUDA/NCCL on the CPU, unmodified (gloo; CUDA mapped "
             "to the CPU; 2 ranks unless --nproc-per-node says otherwise)."),
    max_steps: Optional[int] = typer.Option(
        None, "--max-steps", metavar="N", min=1,
        help="Stop every rank cleanly at the start of DDP iteration N+1 (exit 0). Code at an "
             "epoch's end does not run: --epoch-steps reaches it."),
    epoch_steps: Optional[int] = typer.Option(
        None, "--epoch-steps", metavar="N", min=1,
        help="CI smoke test: every DataLoader pass yields at most N batches (uneven ranks "
             "stay uneven), so each epoch's end and the next epoch's start run in seconds; "
             "the job stops at its third epoch. 2 is a good value."),
    junit_out: Optional[Path] = _output("--junit",
                                        "a JUnit XML file: one test, failed with the diagnosis"),
    markdown_out: Optional[Path] = _output(
        "--markdown", "the report as Markdown (with $GITHUB_STEP_SUMMARY set, it is appended "
                      "there in any case)"),
    report_files: Optional[list[str]] = typer.Option(
        None, "--report", metavar="FORMAT=FILE",
        help=f"Also write the report in FORMAT ({', '.join(formats.FORMATS)}) to FILE; "
             f"repeatable. --json, --junit and --markdown are its shortcuts."),
    timeline_out: Optional[Path] = _output(
        "--timeline", "a timeline of every rank here (Chrome trace-event JSON for "
                      "ui.perfetto.dev or chrome://tracing; see 'ddpdoctor timeline')"),
    max_trace_mb: float = typer.Option(
        RunOptions.max_trace_mb, "--max-trace-mb", metavar="MB", min=0.0,
        help="After this many MB per rank, record only what breaks the rank's repeating "
             "pattern (a divergence is never lost)."),
    flight_recorder: bool = typer.Option(
        RunOptions.flight_recorder, "--flight-recorder",
        help="Record with PyTorch's flight recorder instead of ddpdoctor's own recorder "
             "(NCCL groups do unless --record-nccl); fewer details."),
    record_nccl: bool = typer.Option(
        RunOptions.record_nccl, "--record-nccl",
        help="Record NCCL groups with ddpdoctor's own recorder, as gloo groups are "
             "(experimental)."),
    share_lines: Optional[bool] = typer.Option(
        None, "--share-lines/--no-share-lines",
        help="When the job has ended, keep the collectives that identical ranks share once "
             f"(smaller logs; default: on from {SHARE_FROM_RANKS} ranks)."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v",
        help="On a terminal, print the whole report, not its essentials (it is in "
             "LOGDIR/report.txt either way)."),
    expect_schedule: Optional[Path] = typer.Option(
        None, "--expect-schedule", metavar="FILE",
        help="Fail (exit 1) when the collectives differ from this 'ddpdoctor schedule save' "
             "file."),
) -> None:
    """Run SCRIPT under torchrun with every rank recorded; diagnose a hang, crash or divergence.

    Examples:

      ddpdoctor run --nproc-per-node 2 train.py --epochs 1

      ddpdoctor run --launcher python spawn_script.py

      ddpdoctor run --hang-timeout 60 -- accelerate launch --num_processes 2 train.py

      ddpdoctor run --cpu --epoch-steps 2 --junit junit.xml train_on_gpus.py
    """
    shortcuts = [("json", json_out), ("junit", junit_out), ("markdown", markdown_out)]
    files = [(fmt, path) for fmt, path in shortcuts if path is not None]
    try:
        files += [formats.request(text) for text in report_files or []]
    except ValueError as exc:
        fail(str(exc))
    opts = RunOptions(
        script=script, args=list(args or []), torchrun_args=_torchrun_args(ctx),
        launcher=launcher, logdir=str(logdir) if logdir else None, backend=backend,
        hang_timeout=hang_timeout, stuck_timeout=stuck_timeout, grace=grace, cpu=cpu,
        max_steps=max_steps, epoch_steps=epoch_steps, max_trace_mb=max_trace_mb,
        expect_schedule=str(expect_schedule) if expect_schedule else None,
        reports=any(fmt in formats.CI_FORMATS for fmt, _ in files),
        flight_recorder=flight_recorder,
        record_nccl=record_nccl, share_lines=share_lines)
    name = " ".join(redact.mask_args([script, *(args or [])]))

    def usage_stop(message: str, logdir: Path | None = None) -> NoReturn:
        """Bad usage: exit 2, and in CI mode the reports say so too (failed, with why)."""
        view = ReportView(None, RunInfo(name=name, exit_code=EXIT_USAGE,
                                        logdir=str(logdir) if logdir else None,
                                        read_error=f"bad usage: {message}"))
        _write_reports(view, [(fmt, path) for fmt, path in files if fmt in formats.CI_FORMATS])
        fail(message)

    try:
        log_path = prepare_run(opts)
    except UsageError as exc:
        usage_stop(str(exc))
    say(f"recording to {log_path}")
    word = gpu_count_word(opts)
    if word:
        say(f"--cpu: --nproc-per-node {word} counts accelerators, and CPU mode has none: "
            f"running {CPU_MODE_NPROC} ranks per node (give --nproc-per-node N for another "
            f"number)")
    if needs_cpu_mode(opts):
        say("this machine has no GPU and the script asks for CUDA or NCCL: should it fail "
            "below, run it on the CPU with `ddpdoctor run --cpu ...` (docs/cpu-mode.md)")
    if lone_rank(opts):
        say("one GPU is visible, so the job runs one rank, which no other rank can diverge "
            "from: give --nproc-per-node 2 (with --cpu to run the ranks on the CPU over gloo) "
            "to compare two")
    try:
        if err.is_terminal and sys.stdout.isatty():
            opts.status_every = LIVE_EVERY
            with live.LiveView(err) as view:
                outcome = run_and_diagnose(opts, log_path, view.status, view.output,
                                           terminal=err.file.fileno())
        else:
            outcome = run_and_diagnose(opts, log_path, _status_printer(opts))
    except UsageError as exc:
        usage_stop(str(exc), log_path)
    nested = nested_launch.message(log_path, script)
    if nested:
        usage_stop(nested, log_path)
    job = outcome.job
    if job.hang:
        what = job.stop.headline if job.stop is not None else "hang detected"
        say(f"{what}: {job.reason}; stacks collected from {len(job.acks)} rank(s), job stopped")
    elif job.interrupted:
        say("interrupted: job stopped, logs kept")
    info = RunInfo(name=name, exit_code=outcome.exit_code, seconds=job.duration,
                   logdir=str(log_path), problems=tuple(outcome.schedule_diff),
                   read_error=outcome.read_error)
    result = ReportView(outcome.report, info)
    whole = log_path / schema.REPORT_FILE
    if outcome.report is not None:
        _write([(whole, formats.reporter("text").render(result), "w")])
    elif outcome.read_error:
        say(f"no diagnosis: {outcome.read_error}")
    if timeline_out:
        try:
            run_traces = load_run([str(log_path)])
            write_timeline(run_traces, outcome.report, timeline_out)
        except TraceError as exc:
            say(f"warning: no timeline: {exc}")
    if outcome.schedule_diff:
        say(f"the collective schedule differs from {expect_schedule}:")
        for line in outcome.schedule_diff:
            err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    elif expect_schedule and outcome.report is not None:
        say(f"the collective schedule matches {expect_schedule}")
    if outcome.report is not None and outcome.report.verdict.unverified and \
            outcome.exit_code in (EXIT_OK, EXIT_UNTESTED):  # a stopped or failed job says so
        ci = (" (exit 4 in CI mode)" if outcome.exit_code == EXIT_UNTESTED
              else "; in CI mode (--cpu, --max-steps, --junit, $CI) this fails with exit 4")
        what = ("NOTHING WAS TESTED - no two ranks' collectives could be compared"
                if outcome.report.verdict == Verdict.UNTESTED else
                "NOT VERIFIED TO THE END - the traces do not hold enough to compare the ranks "
                "to the end")
        say(f"warning: {what} (the notes say why)" + ci)
    if outcome.teardown_only:
        say(f"warning: every rank finished its script, but the job exited with code "
             f"{job.exit_code} during interpreter teardown (a known gloo/DDP abort at exit); "
             f"not a divergence")
    _write_reports(result, files)
    if outcome.shared is not None and outcome.shared.members:
        done = outcome.shared
        say(f"{done.members} of {done.files} rank traces share their collective lines with "
            f"another rank's, kept once: {done.bytes_before / 1e6:.1f} MB -> "
            f"{done.bytes_after / 1e6:.1f} MB (--no-share-lines keeps every file whole)")
    if outcome.report is not None:
        # Last, so that a terminal's last screen holds the answer (the whole report is in
        # report.txt), and a log ends with it.
        show(outcome.report, err, brief=None if verbose else str(whole))
        say(f"{closing_line(result)}; logs in {log_path} ({job.duration:.1f}s, "
            f"exit {outcome.exit_code})")
    else:
        say(f"logs in {log_path} ({job.duration:.1f}s, exit {outcome.exit_code})")
    raise typer.Exit(outcome.exit_code)


LIVE_EVERY = 0.5  # seconds between redraws of the live view


def _torchrun_args(ctx: typer.Context) -> list[str]:
    """torchrun's options: ddpdoctor.yaml's ``torchrun`` section, then the command line's."""
    obj = ctx.find_root().obj or {}
    return [*obj.get("torchrun_defaults", []), *obj.get("torchrun", [])]


def _write_reports(view: ReportView, files: list[tuple[str, Path]]) -> None:
    """The report files asked for (format, file), and Markdown to $GITHUB_STEP_SUMMARY."""
    texts: dict[str, str] = {}

    def text(fmt: str) -> str:
        if fmt not in texts:
            texts[fmt] = formats.reporter(fmt).render(view)
        return texts[fmt]

    outputs = [(path, text(fmt), "w") for fmt, path in files]
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        outputs.append((Path(summary), text("markdown"), "a"))
    _write(outputs)


def _write(outputs: list[tuple[Path, str, str]]) -> None:
    """Write report files (path, text, mode); a file that cannot be written is a warning (the
    diagnosis on the terminal stands)."""
    for path, text, mode in outputs:
        try:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
            # Created readable by the user only (a report may quote the job's messages); a
            # file that exists keeps its mode. Text that is not valid UTF-8 is escaped.
            with open(os.open(path, flags, 0o600), mode, encoding="utf-8",
                      errors="backslashreplace") as fh:
                fh.write(text)
        except OSError as exc:
            say(f"warning: cannot write {path}: {exc.strerror or exc}")


def _status_printer(opts: RunOptions) -> Callable[[JobProgress, str], None]:
    """Progress while the job runs, without a terminal: a plain line now and then."""

    def show(progress: JobProgress, event: str) -> None:
        if event == "status" and progress.ranks:
            say(live.plain_line(progress))

    return show


def _run_own_options() -> dict[str, bool]:
    """``run``'s own option strings, each with whether it takes a value."""
    command = click_command()
    own = {"-h": False, "--help": False}
    for param in command.commands["run"].params:
        if param.param_type_name == "option":
            for opt in [*param.opts, *param.secondary_opts]:
                own[opt] = not getattr(param, "is_flag", False)
    return own


def split_run_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``argv`` for typer, and torchrun's options taken out of a ``run`` command line: typer
    sees ddpdoctor's own options, then ``--``, the script and its arguments."""
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if at is None or argv[at] != "run":
        return argv, []
    from ddpdoctor.launch import torchrun

    rest = argv[at + 1:]
    if any(a in ("-h", "--help") for a in rest[:next((i for i, a in enumerate(rest)
                                                      if not a.startswith("-")), len(rest))]):
        return argv, []
    parts = torchrun.split(rest, _run_own_options())
    if parts.command:  # ddpdoctor run [options] -- LAUNCH COMMAND
        if parts.torchrun:
            raise UsageError(f"{parts.torchrun[0]} is a torchrun option: with a launch command "
                             f"after --, give the launcher's options in that command")
        return [*argv[:at + 1], *parts.own, "--launcher", Launcher.COMMAND.value, "--",
                *parts.command], []
    tail = ["--", parts.script, *parts.args] if parts.script is not None else []
    return [*argv[:at + 1], *parts.own, *tail], parts.torchrun
