"""Member files (trace format 8): ranks whose collective lines another rank's file of the
folder holds are rewritten once the job has ended, read back exactly as they were written, by
every reading path; a member whose lines cannot be joined back is unreadable, never short."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.json_report import to_dict
from ddpdoctor.trace import parallel, shared_ref
from ddpdoctor.trace.model import Run
from ddpdoctor.trace.reader import TraceError, load_run
from ddpdoctor.trace.shared_lines import share_lines

from .test_compact_reader import _assert_same
from .writer_jobs import writer_job

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _synth():  # noqa: ANN202 - the bench's module, loaded by path
    spec = importlib.util.spec_from_file_location("ddpdoctor_bench_synth", BENCH / "synth.py")
    synth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = synth  # dataclasses look their module up
    spec.loader.exec_module(synth)
    return synth


def _fields(run: Run) -> dict:
    """Every field of every rank, its collectives decoded, the file's folder left out."""
    out = {}
    for r, t in run.ranks.items():
        fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)
                  if f.name not in ("collectives", "path")}
        fields["file"] = Path(t.path).name
        fields["collectives"] = [dataclasses.asdict(c) for c in t.collectives]
        out[r] = fields
    return out


def _report(run: Run) -> str:
    return json.dumps(to_dict(diagnose(run)), default=str)


def _shared_copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


@pytest.mark.parametrize("hang", [False, True])
def test_real_writer_traces_read_the_same_once_their_lines_are_shared(
        tmp_path: Path, hang: bool) -> None:
    whole = writer_job(tmp_path / "whole", None, world=5, iterations=150, eval_rank=2,
                       eval_at=100, hang=hang, extras=True)
    shared = _shared_copy(whole, tmp_path / "shared")
    done = share_lines(shared)
    # Rank 2 evaluated alone; ranks 0 and 1 have a second group and a send between them:
    # only rank 4 issued what another rank (3) did.
    members = {r for r in range(5)
               if shared_ref.of_file(str(shared / f"rank-{r}.jsonl")) is not None}
    assert done.members == 1 and members == {4}
    for r in members:
        assert (shared / f"rank-{r}.jsonl").stat().st_size < \
            (whole / f"rank-{r}.jsonl").stat().st_size / 3
    before, after = load_run([whole]), load_run([shared])
    assert _fields(after) == _fields(before)
    assert _report(after) == _report(before)
    _assert_same(shared)  # the record-by-record path joins the lines back the same


def test_identical_ranks_are_members_of_the_first_and_twice_is_once(tmp_path: Path) -> None:
    whole = writer_job(tmp_path / "whole", None, world=4, iterations=80, eval_rank=None)
    shared = _shared_copy(whole, tmp_path / "shared")
    first = share_lines(shared)
    assert (first.files, first.members) == (4, 3)
    assert first.bytes_after < first.bytes_before / 2
    refs = [shared_ref.of_file(str(shared / f"rank-{r}.jsonl")) for r in range(4)]
    assert refs[0] is None and {ref.file for ref in refs[1:]} == {"rank-0.jsonl"}
    files = {p.name: p.read_bytes() for p in shared.iterdir()}
    again = share_lines(shared)
    assert again.members == 0 and {p.name: p.read_bytes() for p in shared.iterdir()} == files
    assert _fields(load_run([shared])) == _fields(load_run([whole]))


@pytest.mark.parametrize("kept", [0, 1])
def test_a_file_forgotten_as_a_holder_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kept: int) -> None:
    from ddpdoctor.trace import identical

    whole = writer_job(tmp_path / "whole", None, world=4, iterations=80, eval_rank=None)
    shared = _shared_copy(whole, tmp_path / "shared")
    share_lines(shared)
    # 1: each member finds its file forgotten and reads it again; 0: not even then (its lines
    # are joined back and read record by record).
    monkeypatch.setattr(identical, "MAX_PATHS", kept)
    assert _fields(load_run([shared])) == _fields(load_run([whole]))


def test_what_is_left_whole(tmp_path: Path) -> None:
    whole = writer_job(tmp_path / "whole", None, world=4, iterations=80, eval_rank=None)
    data = (whole / "rank-1.jsonl").read_bytes()
    (whole / "rank-1.jsonl").write_bytes(data[:-40])  # cut mid-line: a killed rank
    lines = (whole / "rank-2.jsonl").read_bytes().split(b"\n")
    lines[30] = b"{not json"
    (whole / "rank-2.jsonl").write_bytes(b"\n".join(lines))  # a damaged line
    shared = _shared_copy(whole, tmp_path / "shared")
    done = share_lines(shared)
    assert done.members == 1  # rank 3 alone
    for r in (0, 1, 2):
        assert (shared / f"rank-{r}.jsonl").read_bytes() == \
            (whole / f"rank-{r}.jsonl").read_bytes()
    assert _report(load_run([shared])) == _report(load_run([whole]))


def test_files_too_large_to_found_a_class_are_not_read_for_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.trace import reader, shared_lines

    whole = writer_job(tmp_path / "whole", None, world=3, iterations=40, eval_rank=None)
    read: list[Path] = []
    real = reader.membership
    monkeypatch.setattr(shared_lines, "membership",
                        lambda path, pool: read.append(path) or real(path, pool))
    monkeypatch.setattr(shared_lines, "BULK_MAX", 100)
    done = share_lines(whole)
    assert (done.files, done.members, read) == (3, 0, [])
    assert done.bytes_after == done.bytes_before


def test_a_member_whose_lines_are_gone_or_changed_is_unreadable(tmp_path: Path) -> None:
    whole = writer_job(tmp_path / "whole", None, world=3, iterations=60, eval_rank=None)
    gone = _shared_copy(whole, tmp_path / "gone")
    share_lines(gone)
    (gone / "rank-0.jsonl").unlink()
    with pytest.raises(TraceError, match="kept in rank-0.jsonl, which cannot be read"):
        load_run([gone])
    changed = _shared_copy(whole, tmp_path / "changed")
    share_lines(changed)
    text = (changed / "rank-0.jsonl").read_text()
    (changed / "rank-0.jsonl").write_text(text.replace('"numel": 1024,', '"numel": 1025,', 1))
    # The members are left out, each with a note; rank 0 itself is read.
    for order in ([changed], [changed / "rank-1.jsonl", changed / "rank-2.jsonl",
                              changed / "rank-0.jsonl"]):  # the members read first too
        run = load_run(order)
        assert list(run.ranks) == [0] and run.damaged
        assert sum("kept in rank-0.jsonl, which now holds other lines" in n and
                   n.endswith("left out") for n in run.notes) == 2, run.notes


def test_the_shared_record_names_a_file_of_the_same_folder_only() -> None:
    good = shared_ref.SharedRef("rank-0.jsonl", 10, 400, 7)
    assert shared_ref.parse(good.line()[:-1]) == good
    for name in ("../rank-0.jsonl", "/tmp/rank-0.jsonl", "sub/rank-0.jsonl", "rank-0.txt"):
        line = good.line()[:-1].replace(b'"rank-0.jsonl"', json.dumps(name).encode())
        assert shared_ref.parse(line) is None, name
    assert shared_ref.parse(good.line()[:-1].replace(b'"lines": 10', b'"lines": -1')) is None
    assert shared_ref.parse(good.line()[:-1].replace(b'"lines": 10', b'"lines": true')) is None


def test_worker_processes_read_members_as_one_process_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synth = _synth()
    folder = tmp_path / "nodes"
    info = synth.generate_nodes(folder, 4, 5, 900, diverge_rank=7)
    assert info["members"] == 15
    folders = sorted(folder.iterdir())
    monkeypatch.setattr(parallel, "_threads_running", lambda: False)
    with monkeypatch.context() as m:
        m.setattr(parallel, "MIN_BYTES", 1 << 60)
        one = load_run(folders)
    with monkeypatch.context() as m:
        m.setattr(parallel, "MIN_BYTES", 0)
        m.setattr(parallel, "FILES_PER_TASK", 3)  # members in another task than their file
        many = load_run(folders)
    assert _fields(many) == _fields(one)
    root = diagnose(many).findings[0]
    assert root.seq == info["diverge_seq"] and 7 in root.ranks


def test_synthetic_nodes_are_what_share_lines_writes(tmp_path: Path) -> None:
    synth = _synth()
    synth.generate_nodes(tmp_path / "direct", 3, 4, 500, diverge_rank=4)
    synth.generate_nodes(tmp_path / "whole", 3, 4, 500, diverge_rank=4, share=False)
    for node in sorted((tmp_path / "whole").iterdir()):
        share_lines(node)
    direct = {p.relative_to(tmp_path / "direct"): p.read_bytes()
              for p in (tmp_path / "direct").rglob("*.jsonl")}
    shared = {p.relative_to(tmp_path / "whole"): p.read_bytes()
              for p in (tmp_path / "whole").rglob("*.jsonl")}
    assert direct == shared


def test_a_large_run_s_timeline_has_one_track_per_class_of_identical_ranks(
        tmp_path: Path) -> None:
    from ddpdoctor.render import timeline

    synth = _synth()
    folder = tmp_path / "nodes"
    info = synth.generate_nodes(folder, 5, 8, 700, diverge_rank=21)
    run = load_run(sorted(folder.iterdir()))
    report = diagnose(run)
    assert timeline.rank_classes(run) == [[r for r in range(40) if r != 21], [21]]
    doc = timeline.build(run, report)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e.get("name") == "process_name"}
    assert names == {0: "ranks 0-20, 22-39 (39 identical ranks; rank 0's times)",
                     21: "rank 21"}
    slices = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    assert {e["pid"] for e in slices} == {0, 21}
    assert len([e for e in slices if e["pid"] == 0]) == 700
    marks = [e for e in doc["traceEvents"] if e.get("name", "").startswith("first divergence")]
    assert {e["pid"] for e in marks} == {0, 21}
    assert report.findings[0].seq == info["diverge_seq"]
    assert doc["metadata"]["tracks"] == 2 and doc["metadata"]["ranks"] == 40
    # Read record by record (plain lists, an index made anew for each rank): the same.
    from ddpdoctor.trace import reader
    from ddpdoctor.trace.compact import NotCompact

    def refuse(*args: object, **kwargs: object) -> None:
        raise NotCompact("record by record")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(reader, "read_compact", refuse)
        m.setattr(reader, "read_shared", refuse)
        slow = load_run(sorted(folder.iterdir()))
    assert isinstance(slow.ranks[3].collectives, list)
    assert timeline.rank_classes(slow) == [[r for r in range(40) if r != 21], [21]]


def test_the_default_group_s_member_list_is_decoded_once_and_shared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synth = _synth()
    folder = tmp_path / "nodes"
    synth.generate_nodes(folder, 40, 8, 60, diverge_rank=100)  # 320 ranks: a long list
    bad = folder / "node-3" / "rank-24.jsonl"  # a founder: whole
    assert shared_ref.of_file(str(bad)) is None
    text = bad.read_text()
    bad.write_text(text.replace('"ranks": [0, 1, 2,', '"ranks": [0, -1, 2,', 1))
    monkeypatch.setattr(parallel, "_threads_running", lambda: False)
    for workers in (False, True):
        with monkeypatch.context() as m:
            m.setattr(parallel, "MIN_BYTES", 0 if workers else 1 << 60)
            m.setattr(parallel, "FILES_PER_TASK", 7)
            run = load_run(sorted(folder.iterdir()))
        lists = {id(t.groups["0"].ranks) for r, t in run.ranks.items() if r != 24}
        assert len(lists) == 1, workers
        assert run.ranks[0].groups["0"].ranks == list(range(320))
        assert "0" not in run.ranks[24].groups and run.ranks[24].damaged_lines == 1
        assert any("rank 24" in note for note in run.notes)
