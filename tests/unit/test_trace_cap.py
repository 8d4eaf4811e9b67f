"""The size cap (DDPDOCTOR_MAX_TRACE_MB): traces written by the real writer with and without a
cap read back to the same collectives (times aside) and the same diagnosis, on both reading
paths, while the capped trace stays small. No torch process: records are built by hand."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.json_report import to_dict
from ddpdoctor.runtime import trace_cap
from ddpdoctor.trace import reader, schema
from ddpdoctor.trace.compact import CollectiveLog, NotCompact
from ddpdoctor.trace.reader import load_run

from .writer_jobs import writer_job


def _legacy(monkeypatch: pytest.MonkeyPatch, folder: Path):
    def refuse(*args: object, **kwargs: object) -> None:
        raise NotCompact("forced")

    with monkeypatch.context() as m:
        m.setattr(reader, "read_compact", refuse)
        m.setattr(reader, "read_shared", refuse)
        return load_run([folder])


def _fields(c: object, skip: tuple[str, ...] = ()) -> dict:
    return {k: v for k, v in dataclasses.asdict(c).items() if k not in skip}


@pytest.mark.parametrize("keyframe", [3600.0, 0.0], ids=["runs", "keyframe-every-drain"])
@pytest.mark.parametrize("hang", [False, True], ids=["finished", "hang"])
def test_capped_trace_reads_back_to_the_same_collectives_and_diagnosis(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keyframe: float, hang: bool) -> None:
    monkeypatch.setattr(trace_cap, "KEYFRAME_SECONDS", keyframe)
    full = load_run([writer_job(tmp_path / "full", None, hang=hang)])
    capped_dir = writer_job(tmp_path / "capped", 8000, hang=hang)
    capped = load_run([capped_dir])
    for r, trace in capped.ranks.items():
        assert isinstance(trace.collectives, CollectiveLog)  # the fast path read it
        assert trace.cap is not None and trace.damaged_lines == 0
        want, got = full.ranks[r].collectives, trace.collectives
        assert len(got) == len(want)
        for a, b in zip(want, got):
            assert _fields(a, ("t", "t_end")) == _fields(b, ("t", "t_end"))  # times differ
    # the record-by-record reader expands the runs to the very same collectives
    legacy = _legacy(monkeypatch, capped_dir)
    for r, trace in legacy.ranks.items():
        assert not isinstance(trace.collectives, CollectiveLog)
        assert [_fields(c) for c in trace.collectives] == \
            [_fields(c) for c in capped.ranks[r].collectives]
    a, b = diagnose(full), diagnose(capped)
    assert (a.verdict, [(f.kind, f.seq, sorted(f.ranks)) for f in a.findings]) == \
        (b.verdict, [(f.kind, f.seq, sorted(f.ranks)) for f in b.findings])
    assert a.findings[0].kind == "callsite_divergence" and a.findings[0].seq is not None
    assert any("size cap" in n for n in b.notes)
    assert json.dumps(to_dict(diagnose(legacy)), default=str) == \
        json.dumps(to_dict(b), default=str)


def test_capped_trace_is_small_and_keeps_the_head(tmp_path: Path) -> None:
    full = writer_job(tmp_path / "full", None, iterations=2000, eval_rank=None)
    capped = writer_job(tmp_path / "capped", 8000, iterations=2000, eval_rank=None)
    size_full = (full / "rank-0.jsonl").stat().st_size
    size_capped = (capped / "rank-0.jsonl").stat().st_size
    assert size_capped < size_full / 10
    lines = (capped / "rank-0.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    cap_at = kinds.index(schema.CAP)
    assert all(k != schema.REPEAT for k in kinds[:cap_at])  # the head is written in full
    assert kinds.count(schema.REPEAT) > 0


def test_no_cap_without_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPDOCTOR_MAX_TRACE_MB", raising=False)
    folder = writer_job(tmp_path / "plain", None, iterations=50)
    text = (folder / "rank-0.jsonl").read_text()
    assert '"kind": "repeat"' not in text and '"kind": "cap"' not in text
    monkeypatch.setenv("DDPDOCTOR_MAX_TRACE_MB", "0.5")
    assert trace_cap.cap_from_env() == 512 * 1024
    monkeypatch.setenv("DDPDOCTOR_MAX_TRACE_MB", "lots")
    assert trace_cap.cap_from_env() is None
