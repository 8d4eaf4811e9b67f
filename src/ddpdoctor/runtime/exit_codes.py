"""Exit codes of the job's workers, recorded by the process that started them.

A rank cannot record its own death by SIGKILL, and ``os._exit`` or a fatal signal skip most
of what it could write. The process that started the workers always learns their exit codes:
torchrun's agent (``SubprocessContext._poll`` sees each worker's ``Popen.returncode``) or, for
scripts that ``mp.spawn`` their workers, ``ProcessContext.join`` in the script's own process.
This module wraps those two calls in that one process (the launcher's direct child) and writes
``exits-<pid>.json`` into the log folder: ``{"exit_codes": {"<worker pid>": code}, "latest":
{...}}``, a negative code being the signal that ended the worker. ``exit_codes`` keeps every
worker the process started (each torchrun restart's too); ``latest`` only those of its latest
set of workers (torchrun's current attempt), which is what the launcher's exit-barrier release
asks. Readers map pids to ranks through each rank's ``process_start`` record. Standard
library only.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from ddpdoctor.runtime import patches
from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime.env import Launcher
from ddpdoctor.trace import schema


def _write(logdir: str, codes: dict[int, int]) -> None:
    if not codes:
        return
    path = os.path.join(logdir, f"{schema.EXITS_PREFIX}{os.getpid()}.json")
    try:
        with open(path, encoding="utf-8") as fh:
            known = json.load(fh).get("exit_codes", {})
    except (OSError, ValueError, AttributeError):
        known = {}
    latest = {str(pid): code for pid, code in codes.items()}
    known.update(latest)
    tmp = f"{path}.tmp"
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            json.dump({"exit_codes": known, "latest": latest}, fh)
        os.replace(tmp, path)
    except OSError:
        pass


def _patch_torchrun(logdir: str) -> None:
    context = internals.agent_process_context()
    if context is None or getattr(getattr(context, internals.AGENT_POLL), "_ddpdoctor", False):
        return
    real = getattr(context, internals.AGENT_POLL)

    @functools.wraps(real)
    def _poll(self: Any) -> Any:
        result = real(self)
        if result is not None:  # every worker ended, or one failed and the rest were stopped
            try:
                _write(logdir, {h.proc.pid: h.proc.returncode
                                for h in self.subprocess_handlers.values()
                                if h.proc.returncode is not None})
            except Exception:
                pass
        return result

    _poll._ddpdoctor = True  # type: ignore[attr-defined]
    patches.replace(context, internals.AGENT_POLL, _poll)


def _patch_spawn(logdir: str) -> None:
    context = internals.spawn_module().ProcessContext
    if getattr(context.join, "_ddpdoctor", False):
        return
    real = context.join

    @functools.wraps(real)
    def join(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return real(self, *args, **kwargs)
        finally:
            try:
                _write(logdir, {p.pid: p.exitcode for p in self.processes
                                if p.exitcode is not None})
            except Exception:
                pass

    join._ddpdoctor = True  # type: ignore[attr-defined]
    patches.replace(context, "join", join)


def install(logdir: str, launcher: str) -> None:
    """Record worker exit codes from this process (the job's top process); never raises."""
    try:
        if launcher == Launcher.TORCHRUN:
            _patch_torchrun(logdir)
        else:
            _patch_spawn(logdir)
    except Exception:
        pass  # exit codes are enrichment: the traces still tell most of the story
