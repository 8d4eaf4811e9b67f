"""Bad input to ``ddpdoctor diff`` gives one clear line (exit 2) or a diagnosis that says what
it skipped — never a traceback. Property-based tests of the reader and the aligner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis.report import Verdict
from ddpdoctor.cli import app
from ddpdoctor.trace import schema
from ddpdoctor.trace.reader import TraceError, load_run

from .factories import healthy_ddp, make_run, ranks

runner = CliRunner()


def _trace(path: Path, rank: int, n: int = 3, run_id: str = "r", world: int = 2,
           version: int = schema.VERSION) -> Path:
    head = {**schema.header(rank, run_id, 0), "version": version}
    lines = [json.dumps(head),
             json.dumps({"kind": "process_start", "rank": rank, "world_size": world, "pid": 1}),
             json.dumps({"kind": "stack", "id": 0,
                         "frames": [{"file": "t.py", "line": 3, "function": "f"}]})]
    for i in range(1, n + 1):
        lines.append(json.dumps({"kind": "collective", "id": i, "rank": rank, "group": "0",
                                 "seq": i, "op": "all_reduce", "label": "user",
                                 "shapes": [[2]], "dtypes": ["float32"], "numel": 2,
                                 "t": float(i), "stack": 0, "state": "completed"}))
    lines.append(json.dumps({"kind": "done", "t": 8.0, "upto": n, "pending": []}))
    lines.append(json.dumps({"kind": "exit", "status": "finished", "t": 9.0}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _diff(*paths: Path) -> tuple[int, str]:
    result = runner.invoke(app, ["diff", *map(str, paths)])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    return result.exit_code, result.output


def _pair(tmp_path: Path) -> Path:
    _trace(tmp_path / "rank-0.jsonl", 0)
    _trace(tmp_path / "rank-1.jsonl", 1)
    return tmp_path


def _with(d: Path, name: str, data: bytes) -> Path:
    (d / name).write_bytes(data)
    return d


def _two(d: Path, a: tuple, b: tuple) -> Path:
    _trace(d / a[0], a[1], run_id=a[2])
    _trace(d / b[0], b[1], run_id=b[2])
    return d


@pytest.mark.parametrize("make, message", [
    (lambda d: d, "no ddpdoctor traces"),
    (lambda d: d / "missing", "no such file or folder"),
    (lambda d: _with(d, "notes.txt", b"hi"), "no ddpdoctor traces"),
    (lambda d: _with(d, "rank-0.jsonl", b""), "is empty"),
    (lambda d: _with(d, "rank-0.jsonl", b"\x89PNG\r\n\x1a\n\x00\x00"), "not a ddpdoctor trace"),
    (lambda d: _trace(d / "rank-0.jsonl", 0, version=schema.VERSION + 1).parent,
     "upgrade ddpdoctor"),
    (lambda d: _two(d, ("rank-0.jsonl", 0, "a"), ("rank-1.jsonl", 1, "b")), "different runs"),
    (lambda d: _two(d, ("rank-0.jsonl", 0, "r"), ("rank-0.copy.jsonl", 0, "r")),
     "two traces for rank 0"),
], ids=["empty-folder", "missing-folder", "no-traces", "empty-file", "binary", "newer-version",
        "mixed-runs", "duplicate-rank"])
def test_unreadable_input_is_one_line_and_exit_2(tmp_path: Path, make, message: str) -> None:
    code, out = _diff(make(tmp_path))
    assert code == 2
    assert message in out
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in out


@pytest.mark.parametrize("damage, note", [
    (lambda p: p.write_bytes(p.read_bytes() + b'{"kind": "collect'), "cut off"),
    (lambda p: p.write_bytes(p.read_bytes().replace(b'"seq": 2,', b'"seq": 2, \xff\xfe', 1)),
     "damaged line"),
    (lambda p: p.write_bytes(p.read_bytes() + b"x" * (5 * 1024 * 1024) + b"\n"),
     "damaged line"),
    (lambda p: p.write_bytes(p.read_bytes() + b"\x00\x01garbage\n"), "damaged line"),
])
def test_damaged_lines_are_skipped_and_said(tmp_path: Path, damage, note: str) -> None:
    _pair(tmp_path)
    damage(tmp_path / "rank-1.jsonl")
    code, out = _diff(tmp_path)
    assert code in (0, 1)
    assert note in out and "Traceback" not in out


def test_a_missing_rank_is_said(tmp_path: Path) -> None:
    _trace(tmp_path / "rank-0.jsonl", 0, world=3)
    _trace(tmp_path / "rank-1.jsonl", 1, world=3)
    code, out = _diff(tmp_path)
    assert code == 1
    assert "INCOMPLETE" in out and "rank 2 (missing)" in out


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=300), cut=st.integers(min_value=0, max_value=2000))
def test_reader_never_raises_anything_but_trace_error(tmp_path: Path, junk: bytes,
                                                      cut: int) -> None:
    path = _trace(tmp_path / "rank-0.jsonl", 0, n=5)
    data = path.read_bytes()
    path.write_bytes(data[:cut] + junk + data[cut:])
    try:
        run = load_run([tmp_path])
    except TraceError as exc:
        assert "\n" not in str(exc)
        return
    report = diagnose(run)
    assert report.verdict in tuple(Verdict)


_OPS = st.sampled_from(["all_reduce", "broadcast", "barrier", "all_gather"])
_SHAPES = st.sampled_from([[2], [3], [2, 2]])


@settings(max_examples=80, deadline=None)
@given(world=st.integers(min_value=2, max_value=4),
       plan=st.lists(st.tuples(_OPS, _SHAPES), min_size=1, max_size=12),
       cuts=st.lists(st.integers(min_value=0, max_value=12), min_size=4, max_size=4),
       swap=st.booleans())
def test_aligner_handles_any_sequences(world: int, plan: list, cuts: list[int],
                                       swap: bool) -> None:
    builders = ranks(world)
    for b, cut in zip(builders, cuts):
        ops = plan[:cut] if cut else plan
        if swap and b.rank == world - 1 and len(ops) > 1:
            ops = [ops[1], ops[0], *ops[2:]]
        for op, shape in ops:
            b.user(op, shapes=[shape])
        b.finish()
    report = diagnose(make_run(*builders))
    assert report.verdict in tuple(Verdict)
    if all(not c or c >= len(plan) for c in cuts) and not swap:
        assert report.verdict == "clean"


@settings(max_examples=20, deadline=None)
@given(world=st.integers(min_value=2, max_value=6), iterations=st.integers(1, 5))
def test_identical_healthy_ranks_are_clean(world: int, iterations: int) -> None:
    report = diagnose(make_run(*healthy_ddp(world, iterations)))
    assert report.verdict == "clean" and not report.has_errors


def test_diff_json_says_an_error_in_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["diff", "--json", str(tmp_path / "nothing-here")])
    assert result.exit_code == 2
    first = result.stdout.strip().splitlines()[0]
    assert json.loads(first) == {"error": f"no such file or folder: {tmp_path / 'nothing-here'}",
                                 "exit_code": 2}
