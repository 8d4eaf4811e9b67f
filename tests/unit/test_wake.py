"""The launcher's wake FIFO: a rank that starts to wait wakes it once per wait."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

from ddpdoctor.launch.wake import Wake
from ddpdoctor.runtime.launcher_wake import LauncherWake
from ddpdoctor.runtime.writer import TraceWriter
from ddpdoctor.trace import progress_block, schema

from .writer_jobs import _Work

STACK = (("/job/train.py", 33, "step"), ("/job/train.py", 50, "main"))


def _ready(wake: Wake) -> bool:
    return bool(select.select([wake.fd], [], [], 0)[0])


def test_a_byte_wakes_the_launcher_until_it_drains_the_fifo() -> None:
    wake = Wake.create()
    assert wake is not None
    rank = LauncherWake(wake.path)
    try:
        assert not _ready(wake)  # open for reading and writing: no end of file to see
        rank.wake()
        rank.wake()
        assert _ready(wake)
        wake.drain()
        assert not _ready(wake)
    finally:
        rank.close()
        wake.close()
    assert not os.path.exists(os.path.dirname(wake.path))
    LauncherWake(wake.path).wake()  # the launcher gone: nothing raised, nothing made


def test_the_writer_wakes_the_launcher_once_per_wait(tmp_path: Path) -> None:
    wake = Wake.create()
    assert wake is not None
    w = TraceWriter(str(tmp_path / schema.trace_filename(0)), schema.header(0, "r", 0), 0,
                    interval=3600, wake=wake.path)
    site = w.site("0", "all_reduce", "user", None, (((4,), "torch.float32"),), "SUM", None,
                  None, STACK)
    try:
        now = time.time()
        fresh = w.write_at(site, 1, None, None, 1, now)
        w.returned(fresh, _Work(done=False))
        w.flush()
        assert not _ready(wake)  # running, but not for WAITED seconds yet
        w.returned(fresh, _Work(done=True))
        w.flush()
        old = w.write_at(site, 2, None, None, 1, now - progress_block.WAITED - 0.1)
        w.returned(old, _Work(done=False))
        w.flush()
        assert _ready(wake)  # the rank waits: woken
        wake.drain()
        w.flush()
        assert not _ready(wake)  # the same wait: once
        w.returned(old, _Work(done=True))
        again = w.write_at(site, 3, None, None, 1, now - progress_block.WAITED - 0.1)
        w.returned(again, _Work(done=False))
        w.flush()
        assert _ready(wake)  # a new wait wakes it again
    finally:
        w.close()
        wake.close()
