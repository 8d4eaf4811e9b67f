"""Finding and ending every process of a job, by pid.

torchrun starts its workers in new sessions, so a process-group kill misses them. The launcher
makes itself a child subreaper (Linux), so every orphan of the job is re-parented to it and
stays findable as a descendant; this module walks ``/proc`` for descendants and ends them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphaned descendants our children (Linux only); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            out[int(name)] = int(fields[1])
    return out


def descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (not ``root`` itself), parents before children."""
    parents = _parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def detached(pids: list[int], job: set[int]) -> set[int]:
    """Those of ``pids`` in a session none of the ``job``'s processes (its launcher, its
    ranks, this process) belongs to or led: a daemon a rank started the way daemons start
    (a fork, ``setsid``, a second fork) is the user's, and under torchrun it outlives the job.
    (torchrun starts each rank in a session of its own: a rank's session id is its pid.)"""
    sessions = {os.getsid(0), *job}
    for pid in job:
        try:
            sessions.add(os.getsid(pid))
        except OSError:  # ended: its session, if it led one, is its pid (above)
            pass
    out = set()
    for pid in pids:
        try:
            if os.getsid(pid) not in sessions:
                out.add(pid)
        except OSError:  # ended meanwhile
            continue
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"


def reap(exclude: int | None = None) -> None:
    """Collect exit statuses of re-parented children that ended (no zombies left behind).

    ``exclude`` is the job's own process, whose status its ``Popen`` object collects.
    """
    for pid in descendants(os.getpid()):
        if pid == exclude:
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def terminate(pids: list[int], grace: float, exclude: int | None = None) -> list[int]:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, SIGKILL the rest; returns those killed."""
    signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        reap(exclude)
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    signal_all(left, signal.SIGKILL)
    for _ in range(100):
        reap(exclude)
        if not any(alive(p) for p in left):
            break
        time.sleep(0.02)
    return left
