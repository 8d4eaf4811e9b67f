"""A process that dies with its parent (Linux ``PR_SET_PDEATHSIG``): how the job never
outlives ddpdoctor. Standard library only: this runs inside every rank."""

from __future__ import annotations

import os

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies. (torch's ``mp.spawn`` sets SIGINT for its
    workers, which a worker blocked inside a collective never acts on: the wrapper of its
    worker function calls this again.)"""
    import signal

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
