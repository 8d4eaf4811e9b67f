"""``--max-steps N``: every rank ends cleanly at the start of DDP iteration N+1 (and, through
:func:`stop`, ``--epoch-steps`` at the start of the third epoch: ``epoch_steps.py``).

The DDP hooks call :func:`check` at the start of every DDP forward (and join shadow
iteration), before it is counted and before DDP issues any collective of it. Once N
iterations are done the rank stops there:

1. stdout and stderr are flushed, and the trace gets its ``exit`` record with status
   ``max_steps`` (``code`` 0, ``steps`` N), flushed and closed (after at most a second for
   c10d to mark the collectives the rank already waited for as completed);
2. the rank waits, through the default group's c10d store (no collective, nothing recorded),
   until every rank of the world has reached the same point (rank 0, which may host the
   store, until every other rank has also made its last call to it). Every rank has by then
   completed every collective it issued, so no message is left in flight: leaving cannot
   break a peer's collective. A rank that does not come within ``DDPDOCTOR_STOP_TIMEOUT``
   seconds (half the launcher's hang timeout) is blocked elsewhere - the ranks diverged: the
   stopped rank leaves anyway, the blocked peer's collective fails with a lost connection,
   and the job ends as a divergence within seconds instead of a hang;
3. the rank's own child processes (DataLoader workers) are terminated and the process ends
   with ``os._exit(0)``: no ``destroy_process_group``, no interpreter teardown, hence none of
   gloo's aborts at exit. A rank torchrun runs as a function (``--run-path``) first hands its
   agent the return value the agent waits for. The script's code after the stop point -
   ``finally`` blocks, ``atexit`` handlers, the rest of the script - does not run.

Standard library and torch only: this runs inside every rank.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any

from ddpdoctor.runtime import env
from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.trace import schema

DEFAULT_STOP_TIMEOUT = 15.0
_POLL = 0.02

_limit: int | None = None
_timeout: float = DEFAULT_STOP_TIMEOUT
epoch_ends = 0  # DataLoader passes that ran to their end (counted by epoch_steps.py)


def configure(limit: int | None, timeout: float | None = None) -> None:
    """Set the step limit (None: no limit) and how long a stopping rank waits for the others."""
    global _limit, _timeout
    _limit = limit if limit is not None and limit >= 0 else None
    if timeout is not None and timeout > 0:
        _timeout = timeout


def configure_from_env() -> int | None:
    """Read ``DDPDOCTOR_MAX_STEPS`` / ``DDPDOCTOR_STOP_TIMEOUT``; returns the limit."""
    raw = os.environ.get(env.MAX_STEPS, "").strip()
    limit = int(raw) if raw.isdigit() else None
    try:
        timeout = float(os.environ.get(env.STOP_TIMEOUT, "") or DEFAULT_STOP_TIMEOUT)
    except ValueError:
        timeout = DEFAULT_STOP_TIMEOUT
    configure(limit, timeout)
    return limit


def check(recorder: Any) -> None:
    """Stop this rank if it has done its N iterations (call before counting a new one)."""
    if _limit is not None and recorder is not None and recorder.iteration >= _limit:
        stop(recorder)


def stop(recorder: Any, extra: dict[str, Any] | None = None) -> None:
    """End this rank now: exit record (``steps``, the DataLoader passes that ended, and
    ``extra``), wait for the other ranks, ``os._exit(0)``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    try:
        _settle(recorder)
        recorder.close(schema.EXIT_MAX_STEPS,
                       {"steps": _limit, "epoch_ends": epoch_ends, **(extra or {})})
    except Exception:
        pass
    try:
        wait_for_peers(_timeout, getattr(recorder, "run_id", "") or "")
    except Exception:
        pass  # the store went away: a peer that hosted it has stopped already
    _end_children()
    _return_to_elastic_agent()
    os._exit(0)


def _return_to_elastic_agent() -> None:
    """A rank that torchrun started as a function (``--run-path``), not as a process: its
    agent waits for the function's return value, which ``os._exit`` alone never delivers (the
    agent then waits forever). Deliver it (None) as the function's own return would, and give
    the agent the time to read it."""
    found = internals.agent_return_channel(sys._getframe(1))
    if found is None:
        return
    queues, rank, read = found
    try:
        if queues is not None and rank is not None:
            queues[rank].put(None)
            if read is not None:
                read.wait(_timeout)
    except Exception:  # the agent is gone: nothing waits for the value
        pass


def _settle(recorder: Any, timeout: float = 1.0) -> None:
    """Give the collectives this rank already waited for the moment c10d takes to mark their
    ``Work`` completed, so that the trace does not end with them pending."""
    writer = getattr(recorder, "writer", None)
    deadline = time.monotonic() + timeout
    while writer is not None and writer.pending() and time.monotonic() < deadline:
        time.sleep(0.002)


def wait_for_peers(timeout: float, run_id: str) -> bool:
    """Wait until every rank of the world reached its stop point; False after ``timeout``."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return True
    world = dist.get_world_size()
    store = internals.default_store()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    key = f"ddpdoctor/max_steps/{run_id}/{attempt}"
    arrived = store.add(key, 1)
    deadline = time.monotonic() + timeout
    while arrived < world:
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
        arrived = store.add(key, 0)
    # Rank 0 may host the store (a script that spawns its workers and initialises with
    # env://): it leaves last, once every other rank has made its last call to the store, so
    # that no peer's call meets a closed socket (c10d prints a 40-frame C++ stack for that).
    if dist.get_rank() != 0:
        store.add(f"{key}/left", 1)
        return True
    while store.add(f"{key}/left", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(_POLL)
    return True


def _end_children() -> None:
    children = multiprocessing.active_children()
    for child in children:
        try:
            child.terminate()
        except Exception:
            pass
    for child in children:
        try:
            child.join(1.0)
        except Exception:
            pass
