"""``--epoch-steps N``: every epoch made short, so that a smoke test reaches the epoch-end code.

Bugs that make DDP ranks diverge live where an epoch ends: evaluation on one rank, a
checkpoint barrier, the last uneven batch, the second epoch's first forward. Stopping a smoke
run after a few steps never reaches them; running whole epochs takes hours. Under
``DDPDOCTOR_EPOCH_STEPS=N`` every pass over a ``torch.utils.data.DataLoader`` (an epoch of
training, a round of evaluation) yields at most N batches, so the script's loop ends its
epoch, runs its evaluation, checkpoint and logging code and starts the next one, in seconds:

* **uneven inputs stay uneven**: before a pass, the ranks tell each other (through the
  default group's c10d store, no collective) how many batches their loader holds; a rank
  whose loader holds k batches more than the shortest rank's yields N + k, so the rank with
  one batch more still meets the epoch's end with one batch more. A loader that only some
  ranks go through (evaluation on rank 0) is capped at N after one short wait
  (:data:`EXCHANGE_WAIT`), and not exchanged again;
* ``len(loader)`` answers the short length, as learning-rate schedules and progress bars ask;
* **the job ends at the start of the third epoch**: when a DataLoader two of whose passes ran
  to their end begins another, the rank stops cleanly as ``--max-steps`` stops it
  (``max_steps.stop``; exit record status ``max_steps`` with ``epoch_steps`` set), every rank
  at the same point. Passes abandoned early do not count: pytorch/examples' trainers peek at
  one batch (``next(iter(loader))``) at the start of each epoch. A loader the script makes
  anew every epoch has no second pass: its epochs are short, and the script runs to its end.

Under ``--max-steps`` alone (nothing shortened) the passes that ran to their end are counted,
so that the report can say when the stop came before any epoch ended.

Standard library and torch only: this runs inside every rank.
"""

from __future__ import annotations

import itertools
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any

from ddpdoctor.runtime import env, max_steps, patches
from ddpdoctor.runtime import torch_internals as internals

EXCHANGE_WAIT = 2.0  # seconds a rank waits for its peers' loader lengths, once per loader
STOP_AT_ENDS = 2  # a loader begins a pass after this many ran to their end: the third epoch
_POLL = 0.005

_steps: int | None = None  # N; None: count the passes, shorten nothing
_recorder: Any = None


@dataclass
class _Loader:
    """What this rank knows of one DataLoader's passes."""

    index: int  # the order in which the rank first iterated it: the same on every rank
    begun: int = 0  # passes begun
    ended: int = 0  # passes that ran to their end: epochs
    cap: int | None = None  # batches its current pass yields
    alone: bool = False  # its peers did not say their length once: capped at N from then on


_loaders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DataLoader -> _Loader
_order = itertools.count()


def install(recorder: Any) -> None:
    """Patch ``DataLoader`` when ``--epoch-steps`` or ``--max-steps`` is given."""
    global _steps, _recorder
    raw = os.environ.get(env.EPOCH_STEPS, "").strip()
    _steps = int(raw) if raw.isdigit() and int(raw) > 0 else None
    if _steps is None and not os.environ.get(env.MAX_STEPS, "").strip():
        return
    import torch.utils.data

    _recorder = recorder
    loader = torch.utils.data.DataLoader
    real_iter, real_len = loader.__iter__, loader.__len__

    def __iter__(self: Any) -> Any:
        length = _length(real_len, self)
        state = _loaders.get(self)
        if state is None:
            state = _loaders[self] = _Loader(next(_order))
        try:  # first: the third epoch's stop starts no worker
            cap = _begin_pass(state, length)
        except Exception:  # never fail the job's data for a smoke-test shortcut
            cap = _steps
        return _Pass(real_iter(self), cap, length, state)

    def __len__(self: Any) -> int:
        length = real_len(self)
        state = _loaders.get(self)
        cap = state.cap if state is not None and state.cap is not None else _steps
        return length if cap is None else min(length, cap)

    patches.replace(loader, "__iter__", __iter__)
    patches.replace(loader, "__len__", __len__)


def _length(real_len: Any, loader: Any) -> int | None:
    try:
        return int(real_len(loader))
    except Exception:  # an IterableDataset without a length
        return None


def _begin_pass(state: _Loader, length: int | None) -> int | None:
    """Count the pass, stop the job at the third epoch, and return how many batches it yields
    (None: all)."""
    done = state.begun
    state.begun += 1
    if _steps is None:
        return None
    if state.ended >= STOP_AT_ENDS:
        max_steps.stop(_recorder, {"steps": getattr(_recorder, "iteration", 0),
                                   "epoch_steps": _steps})
    cap = _steps
    if length is not None and length > _steps and not state.alone:
        shortest = _shortest(state.index, done, length)
        if shortest is None:
            state.alone = True
        else:
            cap = min(length, _steps + length - shortest)
    state.cap = cap
    return cap


def _shortest(index: int, done: int, length: int) -> int | None:
    """The shortest length of this loader's pass over every rank (None: a peer did not say
    within :data:`EXCHANGE_WAIT`, or there is no process group)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    store = internals.default_store()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    base = f"ddpdoctor/epoch_steps/{getattr(_recorder, 'run_id', '')}/{attempt}/{index}/{done}"
    store.set(f"{base}/{rank}", str(length))
    keys = [f"{base}/{r}" for r in range(world)]
    deadline = time.monotonic() + EXCHANGE_WAIT
    while not store.check(keys):
        if time.monotonic() >= deadline:
            return None
        time.sleep(_POLL)
    return min(int(store.get(k)) for k in keys)


class _Pass:
    """One pass over a loader: at most ``cap`` batches (None: all). The pass has ended once it
    has given its last batch (``cap``, or the loader's length): a loop that stops at
    ``len(loader)`` (Lightning's) never asks for more; else at ``StopIteration``."""

    def __init__(self, it: Any, cap: int | None, length: int | None, state: _Loader) -> None:
        self._it = it
        self._cap = cap
        self._last = min((n for n in (cap, length) if n is not None), default=None)
        self._state = state
        self._given = 0
        self._ended = False

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> Any:
        if self._cap is not None and self._given >= self._cap:
            self._end()
        try:
            batch = next(self._it)
        except StopIteration:
            self._end()
        self._given += 1
        if self._last is not None and self._given >= self._last:
            self._count_end()
        return batch

    def _end(self) -> Any:
        self._count_end()
        raise StopIteration

    def _count_end(self) -> None:
        if not self._ended:
            self._ended = True
            max_steps.epoch_ends += 1
            self._state.ended += 1

    def __len__(self) -> int:
        length = len(self._it)
        return length if self._cap is None else min(length, self._cap)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)  # the loader iterator's own attributes
