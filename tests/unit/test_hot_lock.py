"""The trace writer's lock: the hot thread's lock-free path excludes everyone else, a record
written from inside it (a signal handler) does not wait for itself, and a writer used from
several threads at once keeps every line whole."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpdoctor.runtime import hot_lock
from ddpdoctor.runtime.hot_lock import HotLock
from ddpdoctor.runtime.writer import TraceWriter
from ddpdoctor.trace import schema
from ddpdoctor.trace.reader import load_run


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Threads switch every few bytecodes instead of every 5 ms: races show up."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class _Shared:
    def __init__(self) -> None:
        self.inside = 0
        self.count = 0
        self.overlaps = 0

    def section(self) -> None:
        if self.inside:
            self.overlaps += 1
        self.inside += 1
        value = self.count
        for _ in range(20):  # room for a thread switch between the read and the write
            pass
        self.count = value + 1
        self.inside -= 1


@pytest.mark.timeout(60)
def test_the_fast_path_and_the_lock_exclude_each_other(switch_often: None) -> None:
    lock, shared = HotLock(), _Shared()
    n = 3000

    def hot() -> None:
        with lock:
            lock.make_hot()
        for _ in range(n):
            if lock.fast_enter():
                try:
                    shared.section()
                finally:
                    lock.fast_exit()
            else:
                with lock:
                    shared.section()

    def other() -> None:
        for _ in range(n):
            with lock:
                shared.section()

    threads = [threading.Thread(target=f) for f in (hot, other, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert not any(t.is_alive() for t in threads)
    assert lock.hot is not None and threads[0].ident == lock.hot or not hot_lock._GIL
    assert shared.overlaps == 0 and shared.count == 3 * n
    assert not lock.busy and lock.others == 0


@pytest.mark.timeout(30)
def test_a_record_from_inside_the_fast_section_does_not_wait_for_itself() -> None:
    if not hot_lock._GIL:
        pytest.skip("no fast path without the GIL")
    lock = HotLock()
    with lock:
        lock.make_hot()
    waiting, done = threading.Event(), threading.Event()

    def other() -> None:
        waiting.set()
        with lock:  # waits for the hot thread's section to end
            done.set()

    assert lock.fast_enter()
    thread = threading.Thread(target=other)
    thread.start()
    waiting.wait(10)
    while not lock.others:  # the other thread announced itself and spins on busy
        threading.Event().wait(0.001)
    with lock:  # what a signal handler on the hot thread does: goes on at once
        with lock:
            assert lock.busy and not done.is_set()
    assert not lock.fast_enter()  # nested fast entry: the slow path instead
    lock.fast_exit()
    thread.join(10)
    assert done.is_set() and lock.others == 0 and not lock.busy


@pytest.mark.timeout(120)
def test_collectives_from_several_threads_keep_every_line_whole(tmp_path: Path,
                                                                switch_often: None) -> None:
    path = tmp_path / "rank-0.jsonl"
    writer = TraceWriter(str(path), schema.header(0, "r", 0), 0, interval=0.001,
                         max_bytes=None)
    stack = (("/job/train.py", 3, "main"),)
    per_thread = 1500

    def issue(group: str) -> None:
        site = writer.site(group, "all_reduce", "user", "all_reduce",
                           (((4,), "torch.float32"),), "SUM", None, None, stack)
        for seq in range(1, per_thread + 1):
            cid = writer.write_at(site, seq, None, None, 0, 100.0 + seq)
            writer.returned(cid, schema.COMPLETED)  # a settled state: the writer drops it
            if seq % 100 == 0:
                writer.put({"kind": schema.WARNING, "t": 1.0, "message": f"{group} {seq}"})

    threads = [threading.Thread(target=issue, args=(g,)) for g in ("0", "1", "2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    writer.close()
    lines = path.read_bytes().splitlines()
    records = [json.loads(line) for line in lines]  # raises on a torn line
    ids = sorted(r["id"] for r in records if r["kind"] == schema.COLLECTIVE)
    assert ids == list(range(1, 3 * per_thread + 1))
    trace = load_run([tmp_path]).ranks[0]
    assert len(trace.collectives) == 3 * per_thread and not trace.damaged_lines
    for group in ("0", "1", "2"):
        seqs = [c.seq for c in trace.collectives if c.group == group]
        assert seqs == list(range(1, per_thread + 1))
