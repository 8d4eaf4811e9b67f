"""The launchers' private names: torchrun's module and entry, its elastic agent's worker
handling, ``mp.spawn``'s worker entry, torchrun's argument parser."""

from __future__ import annotations

import importlib
import os
from types import FrameType, ModuleType
from typing import Any

from ddpdoctor.runtime.torch_internals.loading import import_quietly

AGENT_MODULE = "torch.distributed.elastic.multiprocessing.api"  # torchrun's worker handling
SPAWN_MODULE = "torch.multiprocessing.spawn"
TORCHRUN_MODULE = "torch.distributed.run"
# torchrun as its console script runs it: ``python -m`` of the module would run it as
# ``__main__``, whose logger is then no torch logger, and its lines would lose torch's prefix
# ("W1129 04:31:01.693000 13573 .../run.py:874] ").
_TORCHRUN_START = f"import sys; sys.argv[0] = 'torchrun'; from {TORCHRUN_MODULE} import main"
TORCHRUN_ENTRY = f"{_TORCHRUN_START}; sys.exit(main())"
# The same, ended without the interpreter's teardown (ddpdoctor.runtime.quick_exit: a
# single-node job's agent).
TORCHRUN_ENTRY_QUICK_EXIT = "\n".join([
    _TORCHRUN_START, "try:", " from ddpdoctor.runtime.quick_exit import run",
    "except ImportError:", " run = lambda main: sys.exit(main())", "run(main)"])
AGENT_POLL = "_poll"  # SubprocessContext's: sees each worker's Popen.returncode
SPAWN_WRAP = "_wrap"  # mp.spawn's worker entry: (fn, i, args, error_file)


def agent_process_context() -> type | None:
    """torchrun's ``SubprocessContext`` (whose :data:`AGENT_POLL` sees workers end)."""
    return getattr(importlib.import_module(AGENT_MODULE), "SubprocessContext", None)


def agent_return_channel(frame: FrameType | None) -> tuple[Any, Any, Any] | None:
    """Where torchrun's agent waits for the return value of a rank it runs as a function
    (``--run-path``): (the return queues, the local rank, the event set once the value was
    read), taken from the agent's worker entry found at or above ``frame``; None outside one."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.replace(os.sep, "/").endswith(
                "distributed/elastic/multiprocessing/api.py"):
            found = frame.f_locals
            return (found.get("ret_vals"), found.get("local_rank"),
                    found.get("queue_finished_reading_event"))
        frame = frame.f_back
    return None


def spawn_module() -> ModuleType:
    """``torch.multiprocessing.spawn`` (``ProcessContext``, :data:`SPAWN_WRAP`)."""
    return importlib.import_module(SPAWN_MODULE)


def torchrun_parser() -> Any:
    """A fresh ``argparse`` parser of torchrun's options, as torchrun builds it."""
    return import_quietly(TORCHRUN_MODULE).get_args_parser()


def torchrun_parser_sources() -> list[str]:
    """The files torchrun's parser is made from, found without importing torch (empty where
    torch is not installed): what a cached description of it depends on."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = list(spec.submodule_search_locations)[0]
    files = [os.path.join(root, "distributed", name) for name in ("run.py", "argparse_util.py")]
    return files if all(os.path.exists(f) for f in files) else []


# torchrun's own argparse actions (torch.distributed.argparse_util): ``env`` takes its default
# from PET_<DEST>, ``check_env`` is a flag whose default is PET_<DEST> (0 or 1).
TORCHRUN_ENV_ACTIONS = ("env", "check_env")
TORCHRUN_ENV_PREFIX = "PET_"


def torchrun_env_action(action: Any) -> str | None:
    """Which of :data:`TORCHRUN_ENV_ACTIONS` ``action`` is (None: another kind)."""
    cls = type(action)
    if cls.__module__ == "torch.distributed.argparse_util" and \
            cls.__name__ in TORCHRUN_ENV_ACTIONS:
        return cls.__name__
    return None


def parser_options(parser: Any) -> dict[str, Any]:
    """An ``argparse`` parser's actions by option string (argparse keeps no public map)."""
    return parser._option_string_actions
