"""Collectives a framework issues on the user's behalf, labelled with the user's own call.

Lightning's ``self.log(name, value, sync_dist=True)`` in a ``validation_step`` issues nothing
there: Lightning all-reduces the metric at the epoch's end (or at once, with ``on_step=True``),
thirty frames below ``trainer.fit(...)``, where no frame of the user's says which metric or
which line. This module remembers, per logged metric, the stack of the ``self.log`` call, and
while Lightning syncs that metric it marks the thread: the recorder then labels every
collective issued meanwhile ``lightning.epoch_sync`` / ``lightning.step_sync``, with the
metric's name as its API and the ``self.log`` line as its site (``pg_wrapper._Issuer.issue``).

Lightning's modules are patched when they are imported (the bootstrap's post-import hook,
:data:`WATCHED`), ``pytorch_lightning`` and ``lightning.pytorch`` alike; nothing is imported
here. Standard library only.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ddpdoctor.runtime import patches
from ddpdoctor.trace.ddp_sites import LIGHTNING_EPOCH_SYNC, LIGHTNING_STEP_SYNC

# Lightning's module that logs and syncs metrics, under each of its package names.
WATCHED = tuple(f"{package}.trainer.connectors.logger_connector.result"
                for package in ("pytorch_lightning", "lightning.pytorch"))
_SITE = "_ddpdoctor_log_stack"  # attribute of a _ResultMetric: where self.log first logged it

class _PerThread(threading.local):
    """What each thread is doing for a framework. Class defaults, not ``getattr(..., None)``:
    a missing attribute of a thread-local raises inside getattr (0.35 µs against 0.04), and
    :func:`current` runs for every collective."""

    call: tuple[str, str, tuple] | None = None  # the metric being synced (current)
    logged: tuple[str, tuple] | None = None  # (name, stack) of the self.log call running


_local = _PerThread()
# The threads marked now. The recording group reads the thread-local only while one is: a
# thread-local's attribute is several lookups in cold memory on every collective, this set's
# size one read (bench/RESULTS.md, session 43). Adding and discarding are atomic under the GIL.
marked_threads: set[int] = set()


def current() -> tuple[str, str, tuple] | None:
    """(label, metric name, stack of the user's call) while the calling thread syncs a
    framework metric on the user's behalf, else None. (The recording group reads this inline.)"""
    return _local.call if marked_threads else None


@contextlib.contextmanager
def syncing(call: tuple[str, str, tuple]) -> Iterator[None]:
    """Mark the calling thread as syncing ``call`` (what :func:`current` returns) meanwhile."""
    _local.call = call
    me = threading.get_ident()
    marked_threads.add(me)
    try:
        yield
    finally:
        marked_threads.discard(me)
        _local.call = None


def patch_lightning(module_name: str, stack_of: Callable[[Any], tuple]) -> None:
    """Patch Lightning's result module ``module_name`` (imported now): ``_ResultCollection.log``
    remembers the stack of the user's call (``stack_of(frame)``) on the metric it logs, and
    ``_ResultMetric.update`` / ``compute`` (the step and epoch-end syncs) mark the thread."""
    module = sys.modules.get(module_name)
    collection = getattr(module, "_ResultCollection", None)
    metric = getattr(module, "_ResultMetric", None)
    if collection is None or metric is None or not hasattr(metric, "compute"):
        return  # another Lightning than the one this was written against: no labels
    real_log = collection.log

    def log(self: Any, fx: str, name: str, *args: Any, **kwargs: Any) -> Any:
        # This function's caller is LightningModule.log, whose caller is the user's code: the
        # stack holds both, and the site the analysis shows is the user's line. The metric
        # takes it as it updates (with on_step=True it syncs there, within this call).
        try:
            _local.logged = (name, stack_of(sys._getframe(1)))
        except Exception:  # a Lightning this was not written against: no label
            _local.logged = None
        try:
            return real_log(self, fx, name, *args, **kwargs)
        finally:
            _local.logged = None

    patches.replace(collection, "log", log)
    for method, label in (("update", LIGHTNING_STEP_SYNC), ("compute", LIGHTNING_EPOCH_SYNC)):
        patches.replace(metric, method, _marking(getattr(metric, method), label))


def _marking(real: Callable[..., Any], label: str) -> Callable[..., Any]:
    """``real`` (a _ResultMetric method), with the thread marked while it runs when its metric
    was logged with a known stack."""

    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = str(getattr(self.meta, "name", "?"))
        stack = getattr(self, _SITE, None)
        if stack is None:  # the first update, inside the self.log call that logged it
            logged = _local.logged
            if logged is not None and logged[0] == name:
                stack = logged[1]
                setattr(self, _SITE, stack)
        if stack is None or _local.call is not None:
            return real(self, *args, **kwargs)
        with syncing((label, name, stack)):
            return real(self, *args, **kwargs)

    return marked
