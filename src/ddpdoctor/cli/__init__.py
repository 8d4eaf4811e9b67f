"""Command line: ``ddpdoctor run``, ``diff``, ``timeline`` and ``schedule``, one module each.
Thin: options -> one call -> renderer. ``run`` takes its defaults from ``ddpdoctor.yaml`` in the
working directory (:mod:`ddpdoctor.cli.config`); exit codes: :mod:`ddpdoctor.launch.exits`.

Every launch imports every command's module (typer registers them all), and the launcher's start
is CPU the job pays once per run: what only the other commands, a finding's cause or a
``ddpdoctor.yaml`` need (attach's and the post-mortem's modules, snapshots, PyYAML,
rich.progress) is imported where it is first used, not at the top (~40 ms less CPU per launch;
``tests/unit/test_layers.py`` keeps them out).
"""

from __future__ import annotations

import sys
import warnings
from typing import NoReturn

from ddpdoctor.cli import attach, diff, run, schedule  # noqa: F401  (each registers its commands)
from ddpdoctor.cli.app import app, click_command, say
from ddpdoctor.cli.run import split_run_args
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.exits import EXIT_INTERRUPTED, EXIT_USAGE
from ddpdoctor.runtime.quick_exit import end, exit_status

__all__ = ["app", "main", "split_run_args"]

# --help lists the commands in this order (typer lists them as they were registered).
_ORDER = ["run", "attach", "diff", "timeline"]
app.registered_commands.sort(
    key=lambda c: _ORDER.index(c.name) if c.name in _ORDER else len(_ORDER))


def main() -> None:
    """Console-script entry point."""
    # ddpdoctor's own process may import torch (torchrun's argument parser, described once
    # per torch install; a store client on several nodes); torch warns when numpy is
    # missing, which nothing here needs.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    for stream in (sys.stdout, sys.stderr):
        try:  # a report quoting a file name or message that is not valid UTF-8, piped
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
    try:
        argv, torchrun_args = split_run_args(sys.argv[1:])
    except UsageError as exc:
        say(f"error: {exc}")
        sys.exit(EXIT_USAGE)
    try:
        click_command()(args=argv, obj={"torchrun": torchrun_args}, prog_name="ddpdoctor")
    except KeyboardInterrupt:
        _exit(EXIT_INTERRUPTED)
    except SystemExit as exc:
        _exit(exc.code)


def _exit(code: str | int | None) -> NoReturn:
    """Exit with ``code``. The interpreter's own teardown takes ~0.8 s once torch is imported
    (``run`` on a torch install for the first time, or on several nodes) and ~0.2 s after
    ``diff`` of 1024 ranks (it frees every object read): nothing is left to clean up by then
    (every file the commands write is closed), so the output is flushed and the process ends
    at once."""
    end(exit_status(code))
