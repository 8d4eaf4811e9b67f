"""torchrun's agent ended as the interpreter would end it, less the interpreter's teardown.

A process that has imported torch spends ~0.3-0.75 CPU-s tearing its interpreter down at exit
(freeing torch's modules object by object; ``bench/fixed_costs.py``'s ``agent-end`` part), after
everything that process does is done. ``ddpdoctor run`` starts torchrun's agent through
:func:`run`: once torchrun's ``main`` has returned (or exited), the agent does what Python's
own exit does first — waits for its non-daemon threads, runs its ``atexit`` callbacks (logging's
flush included), flushes stdout and stderr — and then ends with ``os._exit`` and the same exit
status. The agent runs no user code: nothing of the user's is skipped. An exception out of
``main`` (a worker failed: torchrun's ``ChildFailedError``) takes Python's usual path, its
traceback printed as before. Only a single-node job is started this way: on several nodes the
agent that hosts the rendezvous store keeps it for the usual time its peers may still use it.
Standard library only.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn


def run(main: Callable[[], object]) -> NoReturn:
    """``sys.exit(main())``, ended without the interpreter's teardown where main returns or
    exits; any other exception propagates as it would."""
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    finish(code)


def exit_status(code: object) -> int:
    """The status Python's exit gives ``sys.exit(code)`` (a code that is no int is printed)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except (OSError, ValueError):
        pass
    return 1


def finish(code: object) -> NoReturn:
    """End the process with ``sys.exit(code)``'s status after the steps of Python's exit that
    come before its teardown."""
    shutdown = getattr(threading, "_shutdown", None)  # CPython's own: joins non-daemon threads
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None:  # not CPython as we know it: exit as usual
        sys.exit(code)  # type: ignore[arg-type]
    status = exit_status(code)
    shutdown()
    run_exitfuncs()
    end(status)


def end(status: int) -> NoReturn:
    """Flush stdout and stderr and end the process at once with ``status``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(status)
