"""The in-rank watchdog's activity records, driven by hand: a new quiet spell (the rank issued
a collective since the last look) gets its first record as soon as it has two readings, and
its readings start afresh (issue 56: a rank stuck in its own code is reported at the hang
timeout + 1 s, not a second later); and its wake-ups, which a quiet rank that works gets
seldom."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ddpdoctor.runtime import watchdog as watchdog_mod
from ddpdoctor.runtime import writer as writer_mod
from ddpdoctor.runtime.watchdog import (
    ACTIVITY_SECONDS,
    POLL_SECONDS,
    QUIET_SECONDS,
    WORKING_POLL_SECONDS,
    Watchdog,
)


class _Writer:
    failed = False

    def pending(self) -> list:
        return []


class _Recorder:
    closed = False

    def __init__(self) -> None:
        self.last_issue = 0.0
        self.started = 0.0
        self.writer = _Writer()
        self.flight_recorder = False
        self.records: list[dict[str, Any]] = []

    def emit(self, record: dict) -> None:
        self.records.append(record)


def _watchdog(recorder: _Recorder) -> Watchdog:
    """A Watchdog without its thread: its looks are made by the test."""
    dog = Watchdog.__new__(Watchdog)
    dog._recorder, dog._logdir, dog._rank = recorder, "", 0
    dog._next_activity, dog._quiet_since = 0.0, 0.0
    dog._cpu, dog._tree, dog._working = deque(maxlen=11), None, False
    return dog


def test_a_new_quiet_spell_gets_its_first_record_after_two_readings() -> None:
    rec = _Recorder()
    dog = _watchdog(rec)
    rec.last_issue = 100.0
    for now in (100.35, 100.45, 101.45, 101.6):  # a quiet spell: records at 100.45, 101.45
        dog._activity(now)
    assert [r["t"] for r in rec.records] == [100.45, 101.45]
    # The rank issues a collective at 101.65 and goes quiet again: its first record comes
    # after two readings of the new spell, not a second after the last one (102.45).
    rec.last_issue = 101.65
    for now in (101.7, 101.97, 102.05):
        dog._activity(now)
    assert [r["t"] for r in rec.records] == [100.45, 101.45, 102.05]
    assert rec.records[-1]["quiet_since"] == 101.65
    assert 102.05 - 101.65 <= QUIET_SECONDS + POLL_SECONDS + 1e-9 < ACTIVITY_SECONDS


def test_every_threads_frame_is_read_with_the_collector_paused_and_left_as_it_was() -> None:
    """gh-106883: a collection inside ``sys._current_frames()`` can deadlock CPython 3.11
    before 3.11.9 (seen in this suite: every thread in take_gil)."""
    import gc
    import sys
    import threading

    from ddpdoctor.runtime import thread_frames

    seen: list[bool] = []
    real = sys._current_frames

    def spy() -> dict:
        seen.append(gc.isenabled())
        return real()

    sys._current_frames = spy  # type: ignore[assignment]
    try:
        frames = thread_frames.current_frames()
        gc.disable()
        thread_frames.current_frames()
        assert not gc.isenabled()  # a collector the process paused stays paused
        gc.enable()
    finally:
        sys._current_frames = real  # type: ignore[assignment]
    assert seen == [False, False] and gc.isenabled()
    assert threading.get_ident() in frames


class _LookedAt(_Writer):
    """A writer whose looks are counted, as the watchdog's thread makes them."""

    interval = 0.2

    def __init__(self) -> None:
        self.looks: list[float] = []
        self.waiting_slots = 0  # what backlog() says

    def look(self) -> None:
        self.looks.append(time.time())

    def backlog(self) -> int:
        return self.waiting_slots


def _busy(rec: _Recorder, seconds: float) -> None:
    """The rank issues a collective every 20 ms for ``seconds``."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        rec.last_issue = time.time()
        time.sleep(0.02)


def test_the_watchdogs_thread_looks_seldom_while_busy_at_once_when_quiet_and_stops_at_close(
        tmp_path: Any, monkeypatch: Any) -> None:
    """A rank's trace writer has no thread of its own: the watchdog's wake-ups make its looks,
    every BUSY_LOOK_SECONDS while the rank issues collectives (each costs a busy rank ~2 ms,
    session 46), at its first wake-up once the rank is quiet, then every ``interval``; the
    thread ends once the rank is closed."""
    monkeypatch.setattr(writer_mod, "BUSY_LOOK_SECONDS", 1.5)
    rec = _Recorder()
    rec.writer = writer = _LookedAt()
    rec.started = rec.last_issue = time.time()
    dog = Watchdog(rec, str(tmp_path), 0)
    _busy(rec, 3.0)
    quiet_from = rec.last_issue
    busy = list(writer.looks)
    time.sleep(1.5)  # quiet
    quiet = [t for t in writer.looks if t > quiet_from]
    rec.closed = True
    dog._thread.join(2)
    assert not dog._thread.is_alive()
    busy_gaps = [b - a for a, b in zip(busy, busy[1:])]
    quiet_gaps = [b - a for a, b in zip(quiet, quiet[1:])]
    assert 2 <= len(busy) <= 3.0 / (1.5 - POLL_SECONDS / 2) + 1
    assert min(busy_gaps) >= 1.5 - POLL_SECONDS / 2 - 0.01
    # The first look once quiet: at the wake-up that finds the rank quiet (a loaded CPU
    # allowed for), not when the busy cadence would have made it (up to 1.45 s later).
    assert quiet and quiet[0] - quiet_from <= QUIET_SECONDS + POLL_SECONDS + 0.3
    assert 4 <= len(quiet) <= 1.5 / (0.2 - POLL_SECONDS / 2) + 1
    assert min(quiet_gaps) >= 0.2 - POLL_SECONDS / 2 - 0.01
    assert max(quiet_gaps) <= 0.2 + POLL_SECONDS + 0.2


def test_a_busy_rank_whose_ring_fills_is_looked_at_each_wake_up(tmp_path: Any,
                                                                 monkeypatch: Any) -> None:
    """A quarter of the issue ring waiting for lines makes a look due at once, busy or not:
    the hot thread writes lines itself only when the ring would wrap."""
    monkeypatch.setattr(writer_mod, "BUSY_LOOK_SECONDS", 60.0)
    rec = _Recorder()
    rec.writer = writer = _LookedAt()
    writer.waiting_slots = writer_mod.BUSY_BACKLOG
    rec.started = rec.last_issue = time.time()
    dog = Watchdog(rec, str(tmp_path), 0)
    _busy(rec, 1.5)
    rec.closed = True
    dog._thread.join(2)
    assert not dog._thread.is_alive()
    assert len(writer.looks) >= 1.5 / QUIET_SECONDS - 1  # a look every wake-up


def test_a_quiet_rank_that_works_is_read_seldom_and_its_cpu_rate_spans_a_second(
        monkeypatch: Any) -> None:
    """Readings WORKING_POLL_SECONDS apart while the main thread works: the activity record's
    rate still covers the last second, not the last eleven readings."""
    rec = _Recorder()
    dog = _watchdog(rec)
    rec.last_issue = 100.0
    clock = {"cpu": 5.0}
    monkeypatch.setattr(watchdog_mod, "main_thread_cpu", lambda: clock["cpu"])
    now = 100.3
    for _ in range(12):  # the main thread uses 0.9 of a core
        now += WORKING_POLL_SECONDS
        clock["cpu"] += 0.9 * WORKING_POLL_SECONDS
        dog._activity(now)
    assert dog._working
    assert ACTIVITY_SECONDS <= now - dog._cpu[0][0] < ACTIVITY_SECONDS + WORKING_POLL_SECONDS
    assert rec.records[-1]["cpu_rate"] == 0.9
    now += POLL_SECONDS  # then it stops: an idle rank is read every POLL_SECONDS again
    dog._activity(now)
    assert not dog._working


def test_the_watchdogs_thread_wakes_seldom_while_the_quiet_rank_works(tmp_path: Any,
                                                                       monkeypatch: Any) -> None:
    """Each wake-up makes a working main thread hand the GIL over (~2-8 ms of its CPU on this
    VM): a rank importing torch or evaluating is read every WORKING_POLL_SECONDS, an idle one
    every POLL_SECONDS (a hang request is answered as fast as before where it matters)."""
    wakes: list[float] = []
    real = Watchdog._activity
    mine: list[Watchdog] = []

    def counted(self: Watchdog, now: float) -> None:
        # Only this test's watchdog: a recorder an earlier test left open in this process
        # has a live watchdog thread too, which the patched class would count.
        if self in mine:
            wakes.append(now)
        real(self, now)

    monkeypatch.setattr(Watchdog, "_activity", counted)
    # A loaded machine gives the working main thread less than half a core: it still works.
    monkeypatch.setattr(watchdog_mod, "WORKING_CPU_RATE", 0.1)
    rec = _Recorder()
    rec.writer = _LookedAt()
    rec.started = rec.last_issue = time.time() - 10  # quiet from the start
    dog = Watchdog(rec, str(tmp_path), 0)
    mine.append(dog)
    time.sleep(1.5)  # idle
    idle = len(wakes)
    deadline = time.time() + 3.0
    while time.time() < deadline:  # the main thread works
        sum(i * i for i in range(1000))
    working = len(wakes) - idle
    rec.closed = True
    dog._thread.join(2)
    assert idle >= 1.5 / (POLL_SECONDS + 0.1)
    # The first reading that finds it working comes a POLL_SECONDS in; then the slow cadence.
    assert 3.0 / (WORKING_POLL_SECONDS + 0.15) <= working <= 3.0 / WORKING_POLL_SECONDS + 3
