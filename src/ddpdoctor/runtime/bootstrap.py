"""Start-up of the in-rank runtime, run from ``sitecustomize`` in every Python process of the job.

It costs next to nothing in processes that never become ranks (torchrun's agent, DataLoader
workers): it reads the environment the launcher set, installs a post-import hook that patches
torch the moment ``import torch`` completes (for recording wherever a collective may be
issued: not in torchrun's agent, which only has its workers' exit codes followed), and
registers exit and exception hooks. The trace file is opened when the process becomes a rank
(``init_process_group``); a torchrun worker that dies before that still leaves a trace, named
after its ``RANK``.
"""

from __future__ import annotations

import atexit
import faulthandler
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
import warnings
from typing import Any

from ddpdoctor.runtime import env, on_behalf, torch_internals
from ddpdoctor.runtime.parent_death import die_with_parent
from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace import schema

_recorder: Recorder = None  # type: ignore[assignment]  # set by install() before any use
_boot_pid: int | None = None  # the process boot() ran in (a forked child has another pid)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Runs a function once a watched module has finished executing: ``torch`` (patch it for
    recording) and ``torch._dynamo`` (hide ddpdoctor's code from the compiler)."""

    def __init__(self, watched: dict[str, Any]) -> None:
        self._watched = watched

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        after = self._watched.pop(name, None)
        if after is None:
            return None
        if not self._watched:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            real_exec(module)
            after()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _is_top_process() -> bool:
    """The launcher's direct child: torchrun's agent, or a script that spawns its workers."""
    return os.environ.get(env.LAUNCHER_PID) == str(os.getppid())


def _on_torch_imported() -> None:
    if _is_top_process():
        from ddpdoctor.runtime import exit_codes

        # Under a launch command the top process may be a script that spawns (or anything:
        # torchrun agents below it are found by _on_agent_imported).
        launcher = os.environ.get(env.LAUNCHER, env.Launcher.TORCHRUN)
        exit_codes.install(os.environ[env.LOGDIR], env.Launcher.PYTHON
                           if launcher == env.Launcher.COMMAND else launcher)
        if launcher == env.Launcher.TORCHRUN:
            # torchrun's agent runs no user code and issues no collective: the recording
            # patches would only cost it CPU (~4 ms, once a job) and print a second warning.
            return

    from ddpdoctor.runtime import torch_hooks

    try:
        torch_hooks.install(_recorder, os.environ.get(env.BACKEND) or None)
    except Exception as exc:
        sys.stderr.write(f"ddpdoctor: could not instrument torch ({type(exc).__name__}: {exc}); "
                         f"the job runs without recording\n")


def _on_framework_imported(module_name: str) -> None:
    """A framework module that issues collectives for the user's calls has been imported:
    label them with those calls (:mod:`ddpdoctor.runtime.on_behalf`)."""
    try:
        on_behalf.patch_lightning(module_name, lambda frame: _recorder.labeler.describe(frame)[2])
    except Exception as exc:
        sys.stderr.write(f"ddpdoctor: could not label {module_name}'s collectives "
                         f"({type(exc).__name__}: {exc})\n")


def _on_dynamo_imported() -> None:
    """``torch.compile`` is about to be used: Dynamo must skip ddpdoctor's frames as it skips
    torch's own. Without this it tries to compile the recording group's methods when DDP's
    C++ calls them inside a compiled forward, and fails the job."""
    try:
        from ddpdoctor.runtime import torch_hooks

        torch_hooks.hide_from_compiler()
    except Exception as exc:
        sys.stderr.write(f"ddpdoctor: could not hide its code from torch.compile "
                         f"({type(exc).__name__}: {exc})\n")


def _on_agent_imported() -> None:
    """Under a launch command of the user's (``ddpdoctor run -- accelerate launch ...``), this
    process may be a torchrun agent, wherever it sits in the tree: it records its workers'
    exit codes, and its workers know it as the process that started them (TOP_PID, as the
    job's top process is under torchrun)."""
    try:
        from ddpdoctor.runtime import exit_codes

        os.environ[env.TOP_PID] = str(os.getpid())
        exit_codes.install(os.environ[env.LOGDIR], "torchrun")
        path = os.path.join(os.environ[env.LOGDIR], schema.agent_file(os.getpid()))
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except Exception as exc:
        sys.stderr.write(f"ddpdoctor: could not follow a torchrun agent ({type(exc).__name__}: "
                         f"{exc})\n")


def _is_torchrun_worker() -> bool:
    """The process torchrun started as a rank: a child of torchrun's agent (the job's top
    process); not a process that rank forked (its environment is the rank's), started with
    multiprocessing (which boots again) or ran as a subprocess (a tokenizer server, a
    download tool: its parent is the rank)."""
    if "RANK" not in os.environ or "TORCHELASTIC_RUN_ID" not in os.environ or \
            os.getpid() != _boot_pid or os.environ.get(env.TOP_PID) != str(os.getppid()):
        return False
    import multiprocessing  # only here: every process of the job pays for boot's imports

    return multiprocessing.parent_process() is None


def _ensure_trace() -> None:
    """Open the trace of a torchrun worker that ends before ``init_process_group``."""
    if _recorder.writer is None and _is_torchrun_worker():
        _recorder.start(int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "0")), None)


def _excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
    if exc_type.__name__ == "ChildFailedError" and _is_top_process() and _fold(exc):
        return
    try:
        _ensure_trace()
        _recorder.exception(exc)
        _recorder.flush()
    except Exception:
        pass
    if exc_type.__name__ == "NestedLaunch" and exc_type.__module__.startswith("ddpdoctor."):
        return  # the launcher says, once, to run the script with --launcher python
    try:
        from ddpdoctor.runtime import user_traceback

        user_traceback.clean(exc)
        if _recorder.rank is not None and user_traceback.lost_peer(exc) and \
                user_traceback.fold(exc, os.environ[env.LOGDIR], _recorder.rank):
            return
        tb = exc.__traceback__
    except Exception:
        pass
    _previous_excepthook(exc_type, exc, tb)


_previous_excepthook = sys.excepthook


def _fold(exc: BaseException) -> bool:
    """torchrun's agent failing because a rank failed: its traceback and failure table go to
    ``torchrun.txt`` in the log folder, and one line says so (ddpdoctor's diagnosis follows
    and names the failure); False when the file cannot be written (torch prints it then)."""
    import traceback

    path = os.path.join(os.environ[env.LOGDIR], schema.TORCHRUN_FILE)
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write("".join(traceback.format_exception(exc)))
    except OSError:
        return False
    sys.stderr.write(f"ddpdoctor: torchrun's failure summary: in {path}\n")
    return True


def _thread_excepthook(args: Any) -> None:
    try:
        if args.exc_type is not SystemExit and args.exc_value is not None:
            name = args.thread.name if args.thread is not None else "?"
            _recorder.thread_exception(name, args.exc_value)
    except Exception:
        pass
    _previous_thread_excepthook(args)


_previous_thread_excepthook = threading.excepthook


def _at_exit() -> None:
    try:
        _ensure_trace()
        _recorder.close()
    except Exception:
        pass


def _exit_code(status: object) -> int:
    if status is None:
        return 0
    return status if isinstance(status, int) else 1


_real_exit = sys.exit


def _recording_exit(status: object = None) -> None:
    """``sys.exit`` that notes the code, so a non-zero exit is not recorded as finished."""
    if _recorder is not None:
        _recorder.exit_code = _exit_code(status)
    _real_exit(status)  # type: ignore[arg-type]  # whatever sys.exit was given


_real_os_exit = os._exit


def _flushing_os_exit(status: int) -> None:
    """``os._exit`` that first writes the rank's exit record (it skips atexit handlers)."""
    try:
        if _recorder is not None:
            _recorder.exit_code = status
            _recorder.close(extra={"os_exit": True})
    except Exception:
        pass
    _real_os_exit(status)


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker, or a worker the script starts with
    # multiprocessing.Process) must not write into its parent's trace. The parent's death
    # signal is not inherited: a worker forked by the script ddpdoctor started dies with it.
    _recorder.after_fork()
    _die_with_parent()


def _die_with_parent() -> None:
    """The job must not outlive ddpdoctor, however ddpdoctor ends (``kill -9`` included): the
    top process dies with ddpdoctor, torchrun's workers with the agent, the workers of a script
    that starts its own (``mp.spawn``, ``multiprocessing``, spawned or forked) with the script
    (Linux ``PR_SET_PDEATHSIG``). Other processes of the
    job (a subprocess started from some thread) are left to their parents."""
    top = _is_top_process()
    if top:
        os.environ[env.TOP_PID] = str(os.getpid())  # for the workers this process spawns
    elif not (_is_torchrun_worker() or os.environ.get(env.TOP_PID) == str(os.getppid())):
        return
    die_with_parent()


def boot() -> None:
    """Install the runtime if the launcher asked for it (``DDPDOCTOR_LOGDIR`` is set)."""
    global _recorder, _boot_pid
    logdir = os.environ.get(env.LOGDIR)
    if not logdir or _recorder is not None:
        return
    _boot_pid = os.getpid()
    _die_with_parent()
    _recorder = Recorder(logdir, os.environ.get(env.RUN_ID, ""))
    _recorder.keep_stderr = True
    # torch warns once per process when numpy is missing (which a job that uses no numpy
    # does not mind): with a dozen processes that is a dozen copies of one line.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    watched = {"torch": _on_torch_imported, torch_internals.DYNAMO_MODULE: _on_dynamo_imported}
    for name in on_behalf.WATCHED:
        watched[name] = functools.partial(_on_framework_imported, name)
    if os.environ.get(env.LAUNCHER) == "command":
        # The module a torchrun agent runs its workers with (torchrun, accelerate launch, ...).
        watched[torch_internals.AGENT_MODULE] = _on_agent_imported
    sys.meta_path.insert(0, _PostImportHook(watched))
    sys.excepthook = _excepthook
    threading.excepthook = _thread_excepthook
    sys.exit = _recording_exit
    os._exit = _flushing_os_exit
    if _is_torchrun_worker():
        # Open the trace now: a rank stuck before init_process_group (data loading, a
        # deadlock in user code) is then visible, and its watchdog can report its stack.
        _ensure_trace()
    atexit.register(_at_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)
    if not faulthandler.is_enabled():
        try:
            path = os.path.join(logdir, schema.fault_file(os.getpid()))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            faulthandler.enable(open(fd, "a"))  # noqa: SIM115 - must stay open
        except OSError:
            pass
