"""Flight-recorder dumps read as traces, without processes: ops, labels from frames, windows
of ring buffers aligned, and a crafted pickle refused without running anything."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.trace import flight_recorder as fr
from ddpdoctor.trace.reader import load_run

TORCH = "/venv/lib/python3.11/site-packages/torch"
DDP = f"{TORCH}/nn/parallel/distributed.py"
GRAPH = f"{TORCH}/autograd/graph.py"
C10D = f"{TORCH}/distributed/distributed_c10d.py"


def _entry(seq: int, op: str, sizes: list, frames: list | None, dtype: str = "Float") -> dict:
    entry = {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False,
             "profiling_name": f"gloo:{op}", "process_group": ["0", "default_pg"],
             "input_sizes": sizes, "input_dtypes": [dtype] * len(sizes), "state": "scheduled",
             "time_created_ns": 10**18 + seq, "retired": True}
    if frames is not None:
        entry["frames"] = [{"name": n, "filename": f, "line": ln} for f, ln, n in frames]
    return entry


def _bucket(seq: int) -> dict:
    return _entry(seq, "allreduce", [[161]], [(GRAPH, 10, "_engine_run_backward"),
                                              ("/job/train.py", 58, "main")])


def _barrier(seq: int) -> dict:
    return _entry(seq, "barrier", [[1]], [(C10D, 4000, "barrier"), ("/job/train.py", 64, "main")])


def _dump(path: Path, entries: list[dict], pickled: bool = True) -> Path:
    doc = {"version": "2.10", "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}},
           "entries": entries}
    path.write_bytes(pickle.dumps(doc) if pickled else json.dumps(doc).encode())
    return path


def test_a_barrier_meeting_an_extra_backward_in_dumps_is_diagnosed(tmp_path: Path) -> None:
    # Seed 001 case 5 as two ring buffers: rank 0 kept collectives from #3 on, rank 1 from #2.
    _dump(tmp_path / "nccl_trace_rank_0", [_bucket(s) for s in range(3, 9)] + [_barrier(9)])
    _dump(tmp_path / "nccl_trace_rank_1", [_bucket(s) for s in range(2, 10)])
    run = load_run([tmp_path])
    assert [c.seq for c in run.ranks[0].collectives][:2] == [1, 2]
    assert run.ranks[1].collectives[0].label == "ddp.bucket"
    assert any("compared from its collective #3" in n for n in run.notes)
    root = diagnose(run).findings[0]
    assert root.kind == "op_mismatch" and root.cause == "uneven_inputs"
    assert root.evidence == ["DDP gradient all-reduces per rank: rank 0: 6, rank 1: 7"]
    assert (root.ranks[0].site.line, root.ranks[1].site.line) == (64, 58)


def test_json_dumps_read_the_same_without_frames(tmp_path: Path) -> None:
    entries = [_entry(s, "allreduce", [[4]], None) for s in (1, 2)]
    _dump(tmp_path / "fr_rank_0.json", entries + [_entry(3, "barrier", [[1]], None)], False)
    _dump(tmp_path / "fr_rank_1.json", entries + [_entry(3, "allreduce", [[4]], None)], False)
    report = diagnose(load_run([tmp_path]))
    assert report.verdict == "diverged" and report.findings[0].kind == "op_mismatch"
    assert [c.op for c in load_run([tmp_path]).ranks[0].collectives] == [
        "all_reduce", "all_reduce", "barrier"]


class _Boom:
    def __reduce__(self) -> tuple:
        return (Path("/tmp/ddpdoctor-must-not-exist").touch, ())


@pytest.mark.parametrize("pickled", [True, False])
def test_a_dump_is_bounded_by_what_it_would_decode_to_before_it_is_parsed(
        tmp_path: Path, pickled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # A dump of many empty entries: small on disk, millions of objects once parsed.
    path = _dump(tmp_path / "nccl_trace_rank_0", [{} for _ in range(5000)], pickled)
    monkeypatch.setattr(fr, "MAX_CONTAINERS", 4000)
    with pytest.raises(fr.DumpError, match="would decode to .* objects"):
        fr.load(path)
    monkeypatch.setattr(fr, "MAX_CONTAINERS", 6000)
    assert len(fr.load(path)["entries"]) == 5000
    # A genuine buffer of 2,000 entries with their frames is well inside the real bound.
    real = _dump(tmp_path / "nccl_trace_rank_1", [_bucket(s) for s in range(1, 2001)], pickled)
    monkeypatch.undo()
    assert len(fr.load(real)["entries"]) == 2000


def test_a_crafted_pickle_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    bad = tmp_path / "nccl_trace_rank_0"
    bad.write_bytes(pickle.dumps({"entries": [_Boom()]}))
    with pytest.raises(fr.DumpError, match="refused"):
        fr.read_dump(bad)
    assert not Path("/tmp/ddpdoctor-must-not-exist").exists()
    _dump(tmp_path / "nccl_trace_rank_1", [_bucket(1)])
    run = load_run([tmp_path])
    assert list(run.ranks) == [1] and any("refused" in n for n in run.notes)


def test_dump_names_and_non_dumps(tmp_path: Path) -> None:
    assert fr.rank_of(Path("nccl_trace_rank_12")) == 12
    assert fr.rank_of(Path("fr-rank-3.json")) == 3 and fr.rank_of(Path("notes.txt")) is None
    (tmp_path / "notes_1.txt").write_text("hello")
    assert not fr.looks_like_dump(tmp_path / "notes_1.txt")


def test_pg_status_says_which_last_collective_completed_and_no_reduce_op_is_invented(
        tmp_path: Path) -> None:
    """A rank whose group status says its last collective completed is not waiting in it;
    and a dump holds no reduce op, so none is printed."""
    from ddpdoctor.analysis.terms import op_text
    from ddpdoctor.trace.flight_recorder import read_dump

    entries = [dict(_bucket(s), pg_id=0) for s in range(1, 5)]
    path = tmp_path / "nccl_trace_rank_0"
    doc = {"version": "2.10", "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}},
           "pg_status": {"0": {"last_enqueued_collective": 4, "last_started_collective": -1,
                               "last_completed_collective": 4}}, "entries": entries}
    path.write_bytes(pickle.dumps(doc))
    trace = read_dump(path)
    assert [c.state for c in trace.collectives] == ["completed"] * 4
    doc["pg_status"]["0"]["last_completed_collective"] = 3
    path.write_bytes(pickle.dumps(doc))
    assert read_dump(path).collectives[-1].state == "pending"
    assert op_text(trace.collectives[-1]) == "all_reduce float32[161]"
