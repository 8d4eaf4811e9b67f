"""The ``ddpdoctor`` command group: the typer app every subcommand registers on, its help style,
the ``ddpdoctor.yaml`` defaults, and the status lines and report output the subcommands share.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Optional

import typer
from rich.console import Console
from typer.core import TyperArgument, TyperCommand

from ddpdoctor import __version__
from ddpdoctor.analysis.report import Report
from ddpdoctor.cli import config
from ddpdoctor.launch.exits import EXIT_USAGE
from ddpdoctor.render import timeline as timeline_render
from ddpdoctor.render.console import ConsoleReporter
from ddpdoctor.render.interface import render
from ddpdoctor.trace.model import Run

if TYPE_CHECKING:
    from rich.progress import Progress

app = typer.Typer(
    add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Find why a PyTorch DDP job hangs, and which line of code made the ranks diverge.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False)


@functools.cache
def click_command() -> Any:
    """The click command typer builds from :data:`app`, every subcommand registered: built
    once a launch (it inspects each command's signature, ~7 ms), for both the reading of
    ``run``'s options and the call."""
    return typer.main.get_command(app)


class HelpCommand(TyperCommand):
    """Help in the usual shape: ``run [OPTIONS] SCRIPT [ARGS...]``, arguments without the
    type tags typer 0.29 adds."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.metavar or (param.name or "").upper()
                if param.nargs != 1 and not name.endswith("..."):
                    name += "..."
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_help(self, ctx: Any, formatter: Any) -> None:
        # typer 0.29 tags each argument with its type ("<str>"), where a user may have it
        # (installed --no-deps); its metavar already says what it is.
        for param in self.params:
            if isinstance(param, TyperArgument):
                setattr(param, "display_type_rich", lambda ctx: None)  # noqa: B010
        super().format_help(ctx, formatter)


def say(message: str) -> None:
    """One status line on stderr, never wrapped (logs and tests grep for it). Written as it is
    where stderr is no terminal: rich's rendering (highlighting included) cost the launcher
    ~10 ms of CPU for each status line of a job run without one (bench/RESULTS.md, session
    37)."""
    if not err.is_terminal:
        err.file.write(f"ddpdoctor: {message}\n")
        err.file.flush()
        return
    err.print(f"ddpdoctor: {message}", markup=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    say(f"error: {message}")
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
            run = next(c.callback for c in app.registered_commands if c.name == "run")
            defaults = config.load(config.options_of(run))  # type: ignore[arg-type]
        except config.ConfigError as exc:
            fail(str(exc))
        # Options missing from the command line take their value from ddpdoctor.yaml.
        ctx.default_map = {**(ctx.default_map or {}), "run": defaults.get("run", {})}
        ctx.ensure_object(dict)["torchrun_defaults"] = defaults.get("torchrun", [])


def show(report: Report, console: Console, brief: str | None = None) -> None:
    """The report on a terminal (wrapped to it, in colour; its brief form when ``brief`` names
    the file that holds the whole), or as plain long lines in a log."""
    if console.is_terminal:
        reporter = ConsoleReporter(console.width, console.color_system, brief)
    else:
        width = int(os.environ.get("COLUMNS", "0") or 0) or LOG_WIDTH
        reporter = ConsoleReporter(max(width, 80))
    console.file.write(render(reporter, report))
    console.file.flush()


LOG_WIDTH = 400  # a report written to a log is not wrapped below this width


READING_PROGRESS_FILES = 32  # reading fewer traces is too quick for a progress bar


@contextmanager
def reading_progress() -> Iterator[Callable[[int, int], None]]:
    """A callback for :func:`~ddpdoctor.trace.reader.load_run` that shows, on a terminal, a
    transient progress bar on stderr while many traces are read (1024 ranks take seconds)."""
    bar: Progress | None = None
    task: Any = None

    def update(done: int, total: int) -> None:
        nonlocal bar, task
        if total < READING_PROGRESS_FILES or not err.is_terminal:
            return
        if bar is None:
            # Imported at first use: the launcher needs none (ddpdoctor.cli's docstring).
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            bar = Progress(TextColumn("reading traces"), BarColumn(), MofNCompleteColumn(),
                           TimeElapsedColumn(), console=err, transient=True)
            bar.start()
            task = bar.add_task("read", total=total)
        bar.update(task, completed=done)

    try:
        yield update
    finally:
        if bar is not None:
            bar.stop()


def write_timeline(run: Run, report: Optional[Report], out: Path) -> None:
    try:
        count = timeline_render.write(run, report, out)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    say(f"timeline: {out} ({count} events of {len(run.ranks)} ranks); open it in "
         f"https://ui.perfetto.dev (Open trace file) or chrome://tracing")
