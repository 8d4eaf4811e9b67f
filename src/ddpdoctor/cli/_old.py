"""Command line: ``ddpdoctor run``, ``diff`` and ``schedule``. Thin: options -> one call -> renderer.

``run`` takes its defaults from ``ddpdoctor.yaml`` in the working directory (config.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Optional

import click
import typer
from rich.console import Console
from typer.core import TyperArgument, TyperCommand

from ddpdoctor import __version__, config, doctor
from ddpdoctor.analysis.report import Report
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.launch.options import RunOptions, UsageError
from ddpdoctor.render import console as console_report
from ddpdoctor.render import json_report, junit, live, markdown
from ddpdoctor.render import timeline as timeline_render
from ddpdoctor.schedule import ScheduleError
from ddpdoctor.trace import redact
from ddpdoctor.analysis import diagnose
from ddpdoctor.trace.model import Run
from ddpdoctor.trace.reader import TraceError, load_run

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Find why a PyTorch DDP job hangs, and which line of code made the ranks diverge.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False)


class _Command(TyperCommand):
    """Help in the usual shape: ``run [OPTIONS] SCRIPT [ARGS]...``, arguments without the
    ``<str>`` / ``<list[Path]>`` types typer adds (their metavar already says what they are)."""

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.metavar or (param.name or "").upper()
                if param.nargs != 1 and not name.endswith("..."):
                    name += "..."
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for param in self.params:
            if isinstance(param, TyperArgument):
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
        super().format_help(ctx, formatter)


class Launcher(str, Enum):
    torchrun = "torchrun"
    python = "python"


def _say(message: str) -> None:
    """One status line on stderr, never wrapped (logs and tests grep for it)."""
    err.print(f"ddpdoctor: {message}", markup=False, soft_wrap=True)


def _fail(message: str, code: int = doctor.EXIT_USAGE) -> None:
    _say(f"error: {message}")
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        print(f"ddpdoctor {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """ddpdoctor records every collective of every rank, and explains hangs and divergences."""
    if ctx.invoked_subcommand == "run":
        try:
            defaults = config.load()
        except config.ConfigError as exc:
            _fail(str(exc))
        # Options missing from the command line take their value from ddpdoctor.yaml.
        ctx.default_map = {**(ctx.default_map or {}), "run": defaults.get("run", {})}
        ctx.ensure_object(dict)["torchrun_defaults"] = defaults.get("torchrun", [])


RUN_EPILOG = ("torchrun's options (--nproc-per-node, --nnodes, --node-rank, --rdzv-*, "
              "--standalone, --master-addr/--master-port, --max-restarts, --tee, --redirects, "
              "--log-dir, --local-ranks-filter, -m, --no-python, --run-path, ...) pass through "
              "to torchrun unchanged, in either spelling (--nproc_per_node=2); ddpdoctor's own "
              "options are those listed here. Defaults: --nproc-per-node is the visible GPUs, "
              "else 2 (2 with --cpu), and a free --master-port on a single node.")


@app.command(cls=_Command, context_settings={"allow_interspersed_args": False},
             epilog=RUN_EPILOG,
             short_help="Run a DDP script with every rank recorded, and diagnose it.")
def run(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT",
                                 help="The training script (or module with -m)."),
    args: Optional[list[str]] = typer.Argument(None, metavar="ARGS",
                                               help="Arguments for the script."),
    launcher: Launcher = typer.Option(
        Launcher.torchrun, "--launcher", metavar="torchrun|python",
        help="torchrun, or python for scripts that start their own workers (mp.spawn)."),
    logdir: Optional[Path] = typer.Option(
        None, "--logdir", metavar="DIR",
        help="Where the per-rank traces go (default: ./ddpdoctor-logs/<date>-<time>-<pid> in "
             "the working directory; the folder is created private, 0700)."),
    backend: Optional[str] = typer.Option(
        None, "--backend", metavar="NAME", help="Override the backend the script asks for (e.g. gloo)."),
    hang_timeout: float = typer.Option(
        30.0, "--hang-timeout", metavar="SECONDS", min=0.5,
        help="Seconds every live rank may wait in a collective, none progressing, before the job "
             "is a hang. A rank busy outside collectives (checkpoint, evaluation) is not waiting; "
             "collectives that provably cannot match are diagnosed at once."),
    stuck_timeout: float = typer.Option(
        600.0, "--stuck-timeout", metavar="SECONDS", min=0.5,
        help="Seconds a rank may stay at one place in its own code, outside collectives and "
             "without using CPU, before the job is stopped as stuck there."),
    grace: float = typer.Option(5.0, "--grace", metavar="SECONDS", min=0.0,
                                help="Seconds between SIGTERM and SIGKILL when stopping the job."),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE",
                                            help="Also write the report as JSON here."),
    cpu: bool = typer.Option(
        False, "--cpu",
        help="Run a script written for CUDA/NCCL on the CPU, unmodified: gloo, CUDA devices "
             "mapped to the CPU (docs/cpu-mode.md); --nproc-per-node defaults to 2."),
    max_steps: Optional[int] = typer.Option(
        None, "--max-steps", metavar="N", min=1,
        help="Stop every rank cleanly at the start of DDP iteration N+1 (a success, exit 0)."),
    junit_out: Optional[Path] = typer.Option(
        None, "--junit", metavar="FILE", help="Also write a JUnit XML file: one test, failed with the diagnosis."),
    markdown_out: Optional[Path] = typer.Option(
        None, "--markdown", metavar="FILE",
        help="Also write the report as Markdown (with $GITHUB_STEP_SUMMARY set, it is appended "
             "there in any case)."),
    max_trace_mb: float = typer.Option(
        RunOptions.max_trace_mb, "--max-trace-mb", metavar="MB", min=0.0,
        help="After this many MB per rank, write only what breaks the rank's repeating "
             "pattern: about 25 MB per rank for an hour at 10 steps/s, and the first "
             "divergence is never lost (docs/trace-format.md). 0 from the start; a large "
             "value keeps every collective in full."),
    flight_recorder: bool = typer.Option(
        False, "--flight-recorder",
        help="Keep the collectives with PyTorch's flight recorder instead of ddpdoctor's own "
             "recording (always so for NCCL groups, which ddpdoctor does not record yet); every "
             "rank dumps it into the log folder on a hang. No labels beyond DDP's call sites, no "
             "reduce op or root."),
    timeline_out: Optional[Path] = typer.Option(
        None, "--timeline", metavar="FILE",
        help="Also write a timeline of every rank here (Chrome trace-event JSON for "
             "ui.perfetto.dev or chrome://tracing; see 'ddpdoctor timeline')."),
    record_nccl: bool = typer.Option(
        False, "--record-nccl",
        help="UNVERIFIED: record NCCL groups with ddpdoctor's own process-group wrapper (as gloo "
             "groups are) instead of the flight recorder; scripts/gpu-check has not yet passed "
             "on a GPU."),
    expect_schedule: Optional[Path] = typer.Option(
        None, "--expect-schedule", metavar="FILE",
        help="Fail (exit 1) when the run's collective schedule differs from this file "
             "(written by 'ddpdoctor schedule save')."),
) -> None:
    """Run SCRIPT under torchrun with every rank recorded; diagnose a hang, crash or divergence.

    Examples:

      ddpdoctor run --nproc-per-node 2 train.py --epochs 1

      ddpdoctor run --standalone --nproc_per_node=4 main.py --batch-size 32

      ddpdoctor run --launcher python spawn_script.py

      ddpdoctor run --cpu --max-steps 2 --junit junit.xml train_on_gpus.py
    """
    opts = RunOptions(
        script=script, args=list(args or []), torchrun_args=_torchrun_args(ctx),
        launcher=launcher.value, logdir=str(logdir) if logdir else None, backend=backend,
        hang_timeout=hang_timeout, stuck_timeout=stuck_timeout, grace=grace, cpu=cpu,
        max_steps=max_steps, max_trace_mb=max_trace_mb,
        expect_schedule=str(expect_schedule) if expect_schedule else None,
        reports=bool(junit_out or markdown_out), flight_recorder=flight_recorder,
        record_nccl=record_nccl)
    try:
        log_path = doctor.prepare_run(opts)
    except UsageError as exc:
        _fail(str(exc))
    _say(f"recording to {log_path}")
    try:
        if err.is_terminal and sys.stdout.isatty():
            opts.status_every = LIVE_EVERY
            with live.LiveView(err) as view:
                outcome = doctor.run(opts, log_path, view.status, view.output)
        else:
            outcome = doctor.run(opts, log_path, _status_printer(opts))
    except UsageError as exc:
        _fail(str(exc))
    job = outcome.job
    if job.hang:
        what = "rank stuck" if job.stop == "stuck" else "hang detected"
        _say(f"{what}: {job.reason}; stacks collected from {len(job.acks)} rank(s), job stopped")
    elif job.interrupted:
        _say("interrupted: job stopped, logs kept")
    if outcome.report is not None:
        _show(outcome.report, err)
        if json_out:
            extra = {"exit_code": outcome.exit_code, "duration_s": round(job.duration, 3),
                     "logdir": str(log_path)}
            json_out.write_text(json.dumps(json_report.to_dict(outcome.report, extra),
                                           indent=2))
    elif outcome.read_error:
        _say(f"no diagnosis: {outcome.read_error}")
    if timeline_out:
        try:
            run_traces = load_run([str(log_path)])
            _write_timeline(run_traces, outcome.report, timeline_out)
        except TraceError as exc:
            _say(f"warning: no timeline: {exc}")
    if outcome.schedule_diff:
        _say(f"the collective schedule differs from {expect_schedule}:")
        for line in outcome.schedule_diff:
            err.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
    elif expect_schedule and outcome.report is not None:
        _say(f"the collective schedule matches {expect_schedule}")
    if outcome.report is not None and outcome.report.verdict == "untested":
        _say("warning: NOTHING WAS TESTED - no collective was recorded on any rank (see the "
             "notes)" + (" (exit 4 in CI mode)" if outcome.exit_code == doctor.EXIT_UNTESTED
                                else "; in CI mode (--cpu, --max-steps, --junit, $CI) this "
                                     "fails with exit 4"))
    if outcome.teardown_only:
        _say(f"warning: every rank finished its script, but the job exited with code "
             f"{job.exit_code} during interpreter teardown (a known gloo/DDP abort at exit); "
             f"not a divergence")
    info = markdown.RunInfo(name=" ".join(redact.mask_args([script, *(args or [])])),
                            exit_code=outcome.exit_code,
                            seconds=job.duration, logdir=str(log_path),
                            problems=tuple(outcome.schedule_diff), read_error=outcome.read_error)
    _write_ci_reports(outcome.report, info, junit_out, markdown_out)
    _say(f"logs in {log_path} ({job.duration:.1f}s, exit {outcome.exit_code})")
    raise typer.Exit(outcome.exit_code)


def _show(report: Report, console: Console) -> None:
    """The report on a terminal (wrapped to it, in colour), or as plain long lines in a log."""
    if console.is_terminal:
        console_report.render(report, console)
    else:
        width = int(os.environ.get("COLUMNS", "0") or 0) or LOG_WIDTH
        console.file.write(console_report.plain_text(report, max(width, 80)))
        console.file.flush()


LOG_WIDTH = 400  # a report written to a log is not wrapped below this width
LIVE_EVERY = 0.5  # seconds between redraws of the live view


def _torchrun_args(ctx: typer.Context) -> list[str]:
    """torchrun's options: ddpdoctor.yaml's ``torchrun`` section, then the command line's."""
    obj = ctx.find_root().obj or {}
    return [*obj.get("torchrun_defaults", []), *obj.get("torchrun", [])]


def _write_ci_reports(report: Optional[Report], info: markdown.RunInfo, junit_out: Optional[Path],
                      markdown_out: Optional[Path]) -> None:
    """--junit, --markdown and $GITHUB_STEP_SUMMARY; a file that cannot be written is a warning
    (the diagnosis above stands)."""
    outputs: list[tuple[Path, str, str]] = []
    if junit_out:
        outputs.append((junit_out, junit.render(report, info), "w"))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if markdown_out or summary:
        text = markdown.render(report, info)
        if markdown_out:
            outputs.append((markdown_out, text, "w"))
        if summary:
            outputs.append((Path(summary), text, "a"))
    for path, text, mode in outputs:
        try:
            with open(path, mode, encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            _say(f"warning: cannot write {path}: {exc.strerror or exc}")


def _status_printer(opts: RunOptions) -> Callable[[JobProgress, str], None]:
    """Progress while the job runs, without a terminal: a plain line now and then."""

    def show(progress: JobProgress, event: str) -> None:
        if event == "status" and progress.ranks:
            _say(live.plain_line(progress))

    return show


@app.command(cls=_Command, short_help="Diagnose recorded traces (or flight-recorder dumps) again.")
def diff(
    paths: list[Path] = typer.Argument(..., metavar="LOGDIR...",
                                       help="Log folder(s) or trace files (one folder per node)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON instead."),
) -> None:
    """Align the per-rank traces and explain the first divergence: ranks, op, source lines, fix."""
    try:
        report = doctor.diff([str(p) for p in paths])
    except TraceError as exc:
        _fail(str(exc))
    if json_out:
        print(json.dumps(json_report.to_dict(report), indent=2))
    else:
        _show(report, Console(highlight=False))
    raise typer.Exit(doctor.EXIT_OK if report.verdict == "clean" else doctor.EXIT_PROBLEM)


@app.command(cls=_Command, short_help="Write a timeline of every rank for Perfetto.")
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
        run = load_run([str(p) for p in paths])
    except TraceError as exc:
        _fail(str(exc))
    _write_timeline(run, diagnose(run), out)


def _write_timeline(run: Run, report: Optional[Report], out: Path) -> None:
    try:
        count = timeline_render.write(run, report, out)
    except OSError as exc:
        _fail(f"cannot write {out}: {exc.strerror or exc}")
    _say(f"timeline: {out} ({count} events of {len(run.ranks)} ranks); open it in "
         f"https://ui.perfetto.dev (Open trace file) or chrome://tracing")


schedule_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None,
    help="Save a job's collective schedule, and check later runs against it.")
app.add_typer(schedule_app, name="schedule",
              short_help="Save a job's collective schedule; check later runs against it.")


@schedule_app.command("save", cls=_Command)
def schedule_save(
    logdir: Path = typer.Argument(..., metavar="LOGDIR",
                                  help="Log folder of a good run (ddpdoctor run --logdir)."),
    out: Path = typer.Argument(..., metavar="FILE",
                               help="Schedule file to write (YAML), e.g. schedule.yaml."),
) -> None:
    """Write the job's collective schedule: init, then one steady-state DDP iteration."""
    try:
        sched = doctor.save_schedule([str(logdir)], str(out))
    except (TraceError, ScheduleError) as exc:
        _fail(str(exc))
    entries = sum(len(r.init) + len(r.iteration) for r in sched.ranks)
    parts = "init only: no DDP iteration" if sched.iteration is None else \
        f"init and iteration {sched.iteration}"
    print(f"wrote {out}: {entries} collectives ({parts}) of {sched.world_size} ranks")


@schedule_app.command("compare", cls=_Command)
def schedule_compare(
    expected: Path = typer.Argument(..., metavar="FILE",
                                    help="File written by 'ddpdoctor schedule save'."),
    logdir: list[Path] = typer.Argument(..., metavar="LOGDIR...",
                                        help="Log folder(s) of the run to check."),
) -> None:
    """Exit 1 with the differences when the run adds, removes or reshapes a collective."""
    try:
        changes = doctor.compare_schedule(str(expected), [str(p) for p in logdir])
    except (TraceError, ScheduleError) as exc:
        _fail(str(exc))
    if changes:
        print(f"the collective schedule differs from {expected}:")
        for line in changes:
            print(f"  {line}")
        raise typer.Exit(doctor.EXIT_PROBLEM)
    print(f"the collective schedule matches {expected}")


def _run_own_options() -> dict[str, bool]:
    """``run``'s own option strings, each with whether it takes a value."""
    command = typer.main.get_command(app)
    own = {"-h": False, "--help": False}
    for param in command.commands["run"].params:  # type: ignore[attr-defined]
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
    tail = ["--", parts.script, *parts.args] if parts.script is not None else []
    return [*argv[:at + 1], *parts.own, *tail], parts.torchrun


def main() -> None:
    """Console-script entry point."""
    try:
        argv, torchrun_args = split_run_args(sys.argv[1:])
    except UsageError as exc:
        _say(f"error: {exc}")
        sys.exit(doctor.EXIT_USAGE)
    try:
        app(args=argv, obj={"torchrun": torchrun_args}, prog_name="ddpdoctor")
    except KeyboardInterrupt:
        _exit(doctor.EXIT_INTERRUPTED)
    except SystemExit as exc:
        _exit(exc.code)


def _exit(code: object) -> None:
    """Exit with ``code``. Once torch is imported (``run`` reads torchrun's options with
    torch's parser), the interpreter's own teardown takes ~0.8 s: nothing is left to clean up
    by then, so the output is flushed and the process ends at once."""
    if "torch" not in sys.modules:
        sys.exit(code)
    number = code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(code, str):
        print(code, file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(number)
