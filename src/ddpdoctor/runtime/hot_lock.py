"""A lock whose one busy thread takes it with two attribute stores.

On a rank whose ranks and gloo threads share few CPUs, acquiring and releasing even an
uncontended ``threading.Lock`` cost the training thread 2–3 µs per collective (measured in a
2-rank job on 2 vCPUs, against 0.5 µs for two calls of a trivial builtin). The trace writer's
lock is taken for every collective by the thread that issues them and rarely by anyone else
(the writer's looks every 0.5 s, the watchdog, rare records), so that one thread, the *hot*
thread, gets a path with no lock at all:

    if get_ident() == lock.hot and not lock.busy:   # HotLock.fast_enter
        lock.busy = True
        if not lock.others: ...fast...     # nobody else is in or entering
        lock.busy = False                  # else: let them finish, then take the slow path

Every other entry (``with lock:``) takes an ``RLock``, counts itself in ``others`` and waits
for ``busy`` to drop. Under the GIL each bytecode is atomic and every thread sees the same
order of stores, so this is Dekker's mutual exclusion: whoever announces itself second sees
the first. A ``with lock:`` nested inside the hot thread's own fast section (a signal
handler that writes a record) goes on at once, as a re-entrant lock would. Without a GIL
(free-threaded builds) nobody is hot and every entry takes the ``RLock``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

_get_ident = threading.get_ident
_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()


class HotLock:
    """Mutual exclusion for a trace writer: ``with lock:`` for anyone, and the fast path
    (:meth:`fast_enter` / :meth:`fast_exit`) for the hot thread."""

    __slots__ = ("hot", "busy", "others", "_lock", "_nested")

    def __init__(self) -> None:
        self.hot: int | None = None  # the thread whose fast path needs no lock
        self.busy = False  # the hot thread is in its fast section
        self.others = 0  # slow entries holding, or about to hold, the lock
        self._lock = threading.RLock()
        self._nested = 0  # slow entries inside the hot thread's fast section

    def make_hot(self) -> None:
        """Give the calling thread the fast path (the first thread to write a collective).
        Only inside ``with lock:``: the hot thread is then in no fast section."""
        if _GIL and self.hot is None:
            self.hot = _get_ident()

    def fast_enter(self) -> bool:
        """Enter without the lock when this is the hot thread and nobody else is in; False:
        use ``with lock:`` instead. (The hot path inlines this; kept here as its reference.)"""
        if _get_ident() != self.hot or self.busy:  # busy: nested in its own fast section
            return False
        self.busy = True
        if self.others:
            self.busy = False
            return False
        return True

    def fast_exit(self) -> None:
        self.busy = False

    def __enter__(self) -> HotLock:
        if self.busy and _get_ident() == self.hot:
            # Inside the hot thread's own fast section (a signal handler): nobody else can be
            # in, since they wait for busy to drop.
            self._nested += 1
            return self
        self._lock.acquire()
        self.others += 1
        if _get_ident() != self.hot:
            while self.busy:  # the hot thread's section is short and never blocks
                time.sleep(0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._nested and self.busy and _get_ident() == self.hot:
            self._nested -= 1
            return
        self.others -= 1
        self._lock.release()
