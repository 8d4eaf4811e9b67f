"""The trace reader: cut-off lines, damage, versions and mixed runs, without any process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.trace import schema
from ddpdoctor.trace.reader import TraceError, load_run, read_rank


def _write(path: Path, rank: int, records: list[dict], run_id: str = "r1",
           tail: bytes = b"", version: int = 2) -> Path:
    """A trace file; version 2 by default (each collective line carries its state)."""
    head = {**schema.header(rank, run_id, 0), "version": version}
    lines = [json.dumps(head)] + [json.dumps(r) for r in records]
    path.write_bytes(("\n".join(lines) + "\n").encode() + tail)
    return path


def _coll(i: int, **kw) -> dict:
    rec = {"kind": "collective", "id": i, "rank": 0, "group": "0", "seq": i,
           "op": "all_reduce", "label": "user", "shapes": [[2]], "dtypes": ["float32"],
           "numel": 2, "t": 1.0 + i, "stack": 0, "state": "completed"}
    rec.update(kw)
    return rec


STACK = {"kind": "stack", "id": 0, "frames": [{"file": "train.py", "line": 7,
                                               "function": "main"}]}


def test_reads_collectives_with_sites_and_late_states(tmp_path: Path) -> None:
    path = _write(tmp_path / "rank-0.jsonl", 0, [
        {"kind": "process_start", "rank": 0, "world_size": 2, "pid": 1},
        STACK, _coll(1), _coll(2, state="pending"),
        {"kind": "state", "id": 2, "state": "completed", "t": 9.0},
        _coll(3, state="pending"), {"kind": "exit", "status": "finished"}])
    trace = read_rank(path)
    assert [c.state for c in trace.collectives] == ["completed", "completed", "pending"]
    assert trace.collectives[0].site.line == 7 and trace.collectives[1].t_end == 9.0
    assert trace.finished and trace.world_size == 2 and trace.damaged_lines == 0


def test_format_3_states_come_from_the_last_done_record(tmp_path: Path) -> None:
    records = [STACK] + [_coll(i, state="pending") for i in range(1, 7)] + [
        {"kind": "done", "t": 9.0, "upto": 3, "pending": [2]},
        {"kind": "state", "id": 4, "state": "failed", "t": 9.5},
        {"kind": "done", "t": 10.0, "upto": 5, "pending": [2]}]
    for name, tail in (("rank-0.jsonl", b""), ("rank-1.jsonl", b"{junk")):
        path = _write(tmp_path / name, 0, records, version=3, tail=tail)
        trace = read_rank(path)
        assert [c.state for c in trace.collectives] == [
            "completed", "pending", "completed", "failed", "completed", "pending"], name
        pending = [c.id for c in trace.collectives if c.state != "completed"]
        assert pending == [2, 4, 6]


def test_a_cut_marker_makes_the_trace_cut(tmp_path: Path) -> None:
    path = _write(tmp_path / "rank-0.jsonl", 0, [STACK, _coll(1)], version=3)
    assert not read_rank(path).cut
    (tmp_path / "rank-0.jsonl.cut").write_bytes(b"")
    assert read_rank(path).cut


def test_cut_off_last_line_is_skipped_and_noted(tmp_path: Path) -> None:
    _write(tmp_path / "rank-0.jsonl", 0, [STACK, _coll(1)], tail=b'{"kind": "collec')
    _write(tmp_path / "rank-1.jsonl", 1, [STACK, _coll(1)])
    run = load_run([tmp_path])
    assert run.ranks[0].truncated and run.ranks[0].damaged_lines == 0
    assert len(run.ranks[0].collectives) == 1
    assert any("cut off" in n for n in run.notes)


def test_damaged_middle_line_and_binary_junk_are_counted(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    _write(path, 0, [STACK, _coll(1)])
    path.write_bytes(path.read_bytes() + b"\xff\xfe junk\n[1, 2]\n" +
                     json.dumps(_coll(2)).encode() + b"\n")
    trace = read_rank(path)
    assert trace.damaged_lines == 2 and len(trace.collectives) == 2


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b'{"kind": "header", "format": "something-else"}\n', "not a ddpdoctor trace"),
    (b'{"kind": "header", "format": "ddpdoctor-trace", "version": 99}\n', "version 99"),
    (b"\x00\x01\x02", "not a ddpdoctor trace"),
])
def test_unreadable_files_raise_one_line_errors(tmp_path: Path, content: bytes,
                                                message: str) -> None:
    (tmp_path / "rank-0.jsonl").write_bytes(content)
    with pytest.raises(TraceError, match=message) as info:
        load_run([tmp_path])
    assert "\n" not in str(info.value)


def test_folder_without_traces_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no ddpdoctor traces"):
        load_run([tmp_path])
    with pytest.raises(TraceError, match="no such file or folder"):
        load_run([tmp_path / "nope"])


def test_mixed_runs_and_duplicate_ranks_are_refused(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    _write(a / "rank-0.jsonl", 0, [], run_id="one")
    _write(b / "rank-1.jsonl", 1, [], run_id="two")
    with pytest.raises(TraceError, match="different runs"):
        load_run([a, b])
    _write(b / "rank-0.jsonl", 0, [], run_id="one")
    with pytest.raises(TraceError, match="two traces for rank 0"):
        load_run([a, b / "rank-0.jsonl"])


def test_folders_of_several_nodes_merge_by_rank(tmp_path: Path) -> None:
    a, b = tmp_path / "node0", tmp_path / "node1"
    a.mkdir(), b.mkdir()
    _write(a / "rank-0.jsonl", 0, [{"kind": "process_start", "rank": 0, "world_size": 3}])
    _write(b / "rank-2.jsonl", 2, [{"kind": "process_start", "rank": 2, "world_size": 3}])
    run = load_run([a, b])
    assert sorted(run.ranks) == [0, 2] and run.world_size == 3 and run.missing_ranks == [1]


def test_fault_files_give_the_signal_of_a_rank(tmp_path: Path) -> None:
    _write(tmp_path / "rank-0.jsonl", 0, [{"kind": "process_start", "rank": 0, "pid": 41,
                                           "world_size": 2}])
    _write(tmp_path / "rank-1.jsonl", 1, [{"kind": "process_start", "rank": 1, "pid": 42,
                                           "world_size": 2}])
    (tmp_path / "fault-41.txt").write_text("Fatal Python error: Segmentation fault\n\n"
                                           "Current thread 0x1 (most recent call first):\n")
    (tmp_path / "fault-42.txt").write_text("")
    assert load_run([tmp_path]).exit_codes == {0: -11}


def test_a_rank_that_stopped_recording_makes_the_run_incomplete(tmp_path: Path) -> None:
    """Recording raised on one rank (the group's wrapper turned itself off): the collectives
    after it are missing, so identical-looking traces must not read as clean."""
    from ddpdoctor.analysis import diagnose

    lost = {"kind": "warning", "t": 3.5, "lost": True,
            "message": "recording stopped for group 0: ValueError: boom"}
    for rank in (0, 1):
        extra = [lost] if rank == 1 else []
        _write(tmp_path / f"rank-{rank}.jsonl", rank, [
            {"kind": "process_start", "rank": rank, "world_size": 2, "pid": 1},
            STACK, _coll(1, rank=rank), _coll(2, rank=rank), *extra,
            {"kind": "exit", "status": "finished"}])
    assert read_rank(tmp_path / "rank-1.jsonl").cut
    assert not read_rank(tmp_path / "rank-0.jsonl").cut
    report = diagnose(load_run([tmp_path]))
    assert report.verdict == "incomplete"
    assert any("rank 1: its trace is cut after collective #2" in n
               and "stopped recording (recording stopped for group 0: ValueError: boom)" in n
               for n in report.notes), report.notes
