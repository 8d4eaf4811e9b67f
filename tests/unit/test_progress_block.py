"""The progress block between the rank's real trace writer and the launcher's monitor: what
the writer thread tells it, how the monitor reads it (one read a poll, parsed only when it
changed), a block rewritten while it is read, later rounds, more running than listed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ddpdoctor.launch.monitor import MORE, JobProgress, _Block
from ddpdoctor.runtime.progress import ProgressBlock
from ddpdoctor.runtime.writer import TraceWriter
from ddpdoctor.trace import progress_block, schema

from .writer_jobs import _Work

STACK = (("/job/train.py", 33, "step"), ("/job/train.py", 50, "main"))


def _writer(folder: Path, rank: int = 0, round_: int = 0) -> TraceWriter:
    w = TraceWriter(str(folder / schema.trace_filename(rank, 0, round_)),
                    schema.header(rank, "r", 0, round_), rank, interval=3600)
    w.put({"kind": schema.PROCESS_START, "t": 1.0, "rank": rank, "world_size": 2})
    w.put({"kind": schema.GROUP, "t": 1.0, "group": "1", "ranks": [0, 1]})
    return w


def _issue(w: TraceWriter, group: str, seq: int, done: bool, op: str = "all_reduce") -> int:
    site = w.site(group, op, "ddp.bucket", None, (((4,), "torch.float32"),), "SUM", None, None,
                  STACK)
    cid = w.write_at(site, seq, None, 7, 3, 100.0 + seq)
    w.returned(cid, _Work(done))
    return cid


def test_the_writer_thread_tells_the_block_what_the_monitor_needs(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    _issue(w, "0", 1, True), _issue(w, "1", 1, True)
    running = _issue(w, "0", 2, False)
    w.flush()
    job = JobProgress(str(tmp_path))
    job.poll(10.0)
    p = job.ranks[0]
    assert (p.completed, p.issued, p.iteration, p.last_op, p.world_size) == (
        2, {"0": 2, "1": 1}, 3, "all_reduce (ddp.bucket)", 2)
    assert job.members == {"1": [0, 1]}
    pend = p.pending[running]
    assert pend.what == "all_reduce (ddp.bucket) at train.py:33" and pend.seen == 10.0
    assert pend.coll is not None and (pend.coll.seq, pend.coll.bucket, pend.coll.shapes,
                                      pend.coll.reduce_op) == (2, 7, [[4]], "SUM")
    assert job.paths() == {0: tmp_path / "rank-0.jsonl"}
    w._hot.work(running)[0].done = True
    w.flush()
    job.poll(11.0)
    assert not p.pending and p.completed == 3 and p.last_progress == 11.0
    w.close([{"kind": schema.EXIT, "t": 2.0, "status": schema.EXIT_FINISHED}])
    job.poll(12.0)
    assert p.status == schema.EXIT_FINISHED
    job.close()


def test_a_block_is_parsed_only_when_it_changed(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    _issue(w, "0", 1, True)
    w.flush()
    block = _Block(Path(progress_block.path_of(w.path)))
    assert block.read() is not None
    assert block.read() is None  # one read of its head, nothing parsed
    _issue(w, "0", 2, True)
    assert block.read() is None  # the training thread never writes the block
    w.flush()
    state = block.read()
    assert state is not None and state["issued_id"] == 2
    block.close()
    w.close()


def test_a_block_read_while_it_is_rewritten_is_read_again_next_poll(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    _issue(w, "0", 1, False)
    w.flush()
    path = progress_block.path_of(w.path)
    whole = Path(path).read_bytes()
    torn = bytearray(whole)
    torn[-5:] = b"xxxxx"  # the payload's end from another generation: its CRC disagrees
    job = JobProgress(str(tmp_path))
    Path(path).write_bytes(bytes(torn))
    job.poll(10.0)
    assert job.ranks == {}
    Path(path).write_bytes(whole[:30])  # cut short
    job.poll(10.5)
    assert job.ranks == {}
    Path(path).write_bytes(whole)
    job.poll(11.0)
    assert list(job.ranks[0].pending) == [1]
    job.close()
    w.close()


def test_a_later_round_replaces_the_earlier_and_never_the_reverse(tmp_path: Path) -> None:
    first = _writer(tmp_path)
    _issue(first, "0", 1, False)
    first.flush()
    job = JobProgress(str(tmp_path))
    job.poll(10.0)
    assert job.ranks[0].round == 0 and 1 in job.ranks[0].pending
    second = _writer(tmp_path, round_=1)
    second.flush()
    job.poll(11.0)
    assert job.ranks[0].round == 1 and not job.ranks[0].pending
    _issue(first, "0", 2, False)  # a late write of the first round changes nothing
    first.flush()
    job.poll(12.0)
    assert job.ranks[0].round == 1 and not job.ranks[0].pending
    assert job.paths() == {0: tmp_path / "rank-0.round-1.jsonl"}
    job.close()
    first.close(), second.close()


def test_more_running_than_listed_is_never_proved_a_deadlock(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    ids = [_issue(w, "0", seq, False) for seq in range(1, progress_block.MAX_LISTED + 4)]
    w.flush()
    job = JobProgress(str(tmp_path))
    job.poll(10.0)
    p = job.ranks[0]
    assert sorted(i for i in p.pending if i > 0) == ids[:progress_block.MAX_LISTED]
    assert p.pending[MORE].coll is None and p.pending[MORE].what == "3 more collectives"
    for cid in ids:
        w._hot.work(cid)[0].done = True
    w.flush()
    job.poll(11.0)
    assert not p.pending
    job.close()
    w.close()


def test_a_cut_trace_is_said_in_its_block(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    w._cut(OSError(28, "No space left on device"))
    job = JobProgress(str(tmp_path))
    job.poll(10.0)
    assert job.ranks[0].cut
    job.close()
    os.unlink(schema.cut_marker(w.path))


def test_the_block_format_is_the_documented_one(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    _issue(w, "0", 1, False)
    w.flush()
    data = Path(progress_block.path_of(w.path)).read_bytes()
    assert data[:4] == progress_block.MAGIC
    generation, length, _crc = progress_block.decode_head(data)  # type: ignore[misc]
    state = json.loads(data[20:20 + length])
    assert generation >= 1 and state["pending"][0]["frames"][0] == {
        "file": "/job/train.py", "line": 33, "function": "step"}
    documented = Path(__file__).parents[2] / "docs" / "trace-format.md"
    text = documented.read_text()
    for name in state:
        assert f"`{name}`" in text, name
    w.close()


def test_a_rank_waits_from_the_moment_it_issued_not_from_when_the_block_said_so(
        tmp_path: Path) -> None:
    """The block lists a running collective up to a writer interval after it was issued: the
    wait the hang rules count (and the stuck verdict at the hang timeout) starts at its issue
    time (issue 56: the stuck-rank report at the timeout + 1 s)."""
    w = _writer(tmp_path)
    running = _issue(w, "0", 1, False)  # issued at 101.0
    w.flush()
    job = JobProgress(str(tmp_path))
    job.poll(101.6)
    assert job.ranks[0].pending[running].seen == 101.0
    job.close()
    w.close()


def test_an_activity_record_written_after_the_rank_issued_is_fresh_whenever_the_block_said_so(
        tmp_path: Path) -> None:
    """The launcher learns of the last collective up to an interval after the rank issued it:
    the rank's own issue time decides whether an activity record came after it (else a rank
    still from its first record looked still only from its second, a second late)."""
    w = _writer(tmp_path)
    _issue(w, "0", 1, True)  # issued at 101.0
    w.flush()
    job = JobProgress(str(tmp_path))
    job.poll(101.9)
    assert job.ranks[0].last_issue == 101.0
    w.put({"kind": schema.ACTIVITY, "t": 101.4, "quiet_since": 101.0, "cpu_rate": 0.0,
           "frames": [{"file": "/job/train.py", "line": 40, "function": "sleep"}]})
    job.poll(102.0)
    assert job.ranks[0].fresh_activity() is not None
    job.close()
    w.close()


def test_the_folder_is_listed_again_only_when_it_changed(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A poll lists the log folder only when its mtime moved (or is recent, or the last
    listing is RELIST_SECONDS old); a block that appears is found at the next poll all the
    same."""
    from ddpdoctor.launch import monitor

    listings: list[str] = []
    real_scandir = os.scandir

    def counting(path: object) -> object:
        listings.append(str(path))
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(monitor.os, "scandir", counting)
    clock = [time.time()]
    monkeypatch.setattr(monitor.time, "time", lambda: clock[0])
    first = ProgressBlock(str(tmp_path / "rank-0.jsonl"), schema.header(0, "r", 0))
    first.progressed(1, 1, 1, "all_reduce (user)", None, {"0": 1}, [], 0)
    old = clock[0] - 60
    os.utime(tmp_path, (old, old))
    job = JobProgress(str(tmp_path))
    job.poll()
    job.poll()
    assert len(listings) == 1 and set(job.ranks) == {0}  # unchanged folder: one listing
    second = ProgressBlock(str(tmp_path / "rank-1.jsonl"), schema.header(1, "r", 0))
    second.progressed(1, 1, 1, "all_reduce (user)", None, {"0": 1}, [], 0)
    job.poll()
    assert len(listings) == 2 and set(job.ranks) == {0, 1}  # a new file moved the mtime
    os.utime(tmp_path, (old, old))
    job.poll()  # the mtime moved (back): listed again
    job.poll()
    assert len(listings) == 3
    clock[0] += monitor.RELIST_SECONDS
    job.poll()  # nothing changed, but the last listing is old: listed again
    assert len(listings) == 4
    first.close()
    second.close()
