"""The compact reading path gives exactly what decoding every record gives: same collectives,
same rank fields, same diagnosis, on traces written by the real writer, intact or damaged
(cut off, junk, lost or repeated lines), with several groups and point-to-point ops, and
falls back to decoding every record for files in any other layout."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.json_report import to_dict
from ddpdoctor.trace import reader
from ddpdoctor.trace.compact import CollectiveLog, NotCompact
from ddpdoctor.trace.index import ListIndex, index_of
from ddpdoctor.trace.model import Collective, Run
from ddpdoctor.trace.reader import TraceError, load_run
from ddpdoctor.trace.records import issued_of, site_fields

from .writer_jobs import writer_job

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _legacy(folder: Path) -> Run:
    real = reader.read_compact

    def refuse(*args: object, **kwargs: object) -> None:
        raise NotCompact("forced")

    real_shared = reader.read_shared
    reader.read_compact = reader.read_shared = refuse
    try:
        return load_run([folder])
    finally:
        reader.read_compact, reader.read_shared = real, real_shared


def _trace_fields(run: Run) -> dict:
    out = {}
    for r, t in run.ranks.items():
        fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)
                  if f.name != "collectives"}
        fields["collectives"] = [dataclasses.asdict(c) for c in t.collectives]
        out[r] = fields
    return out


def _index_view(collectives: list[Collective] | CollectiveLog) -> dict:
    """What the analysis reads through a rank's CollectiveIndex, in comparable form."""
    index = index_of(collectives)

    def static(code: int) -> tuple | None:
        if code < 0:
            return None
        p = index.protos[code]
        return (p.group, p.op, p.label, p.shapes, p.dtypes, p.numel, p.reduce_op, p.root,
                p.peer, p.api, [str(s) for s in p.stack])

    return {"groups": {name: ([static(c) for c in pos.codes],
                              [c and dataclasses.asdict(c) for c in pos.collectives])
                       for name, pos in index.by_group().items()},
            "p2p": [dataclasses.asdict(c) for c in index.p2p()],
            "incomplete": [dataclasses.asdict(c) for c in index.incomplete(64)],
            "last_iteration": [index.last_iteration(w) for w in (1, 64, 10**6)],
            "stacks": sorted(str(s) for s in index.used_stacks())}


def _assert_same(folder: Path) -> Run:
    """Both paths agree on ``folder``; returns the compact path's run."""
    try:
        fast = load_run([folder])
    except TraceError as exc:
        with pytest.raises(TraceError, match=str(exc)[:40]):
            _legacy(folder)
        return None
    slow = _legacy(folder)
    assert _trace_fields(fast) == _trace_fields(slow)
    for r, trace in fast.ranks.items():  # one protocol, whichever path read the rank
        assert _index_view(trace.collectives) == _index_view(slow.ranks[r].collectives)
    assert fast.notes == slow.notes and fast.world_size == slow.world_size
    assert json.dumps(to_dict(diagnose(fast)), default=str) == \
        json.dumps(to_dict(diagnose(slow)), default=str)
    return fast


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return writer_job(tmp_path_factory.mktemp("job") / "logs", None, iterations=120,
                      eval_at=100, extras=True)


@pytest.mark.parametrize("hang", [False, True])
def test_writer_traces_take_the_fast_path_and_read_the_same(tmp_path: Path, hang: bool) -> None:
    folder = writer_job(tmp_path / "logs", None, iterations=150, eval_at=120, hang=hang)
    run = _assert_same(folder)
    assert all(isinstance(t.collectives, CollectiveLog) for t in run.ranks.values())
    root = diagnose(run).findings[0]
    assert root.kind == "callsite_divergence" and 1 in root.ranks


def test_both_paths_give_the_analysis_one_index(job: Path) -> None:
    run = load_run([job])
    legacy = _legacy(job)
    views = {}
    for r, trace in run.ranks.items():
        assert isinstance(trace.collectives, CollectiveLog)
        assert index_of(trace.collectives) is trace.collectives
        assert isinstance(index_of(legacy.ranks[r].collectives), ListIndex)
        views[r] = _index_view(trace.collectives)
        assert views[r] == _index_view(legacy.ranks[r].collectives)
    assert len(views[0]["groups"]) == 2 and views[0]["p2p"]  # rank 0 has both: compared above


def test_groups_and_point_to_point(job: Path) -> None:
    run = _assert_same(job)
    assert isinstance(run.ranks[0].collectives, CollectiveLog)
    assert {c.op for c in run.ranks[0].collectives} >= {"send", "all_reduce", "broadcast"}
    # What decides a match beyond the tensors reads back on both paths (format 7).
    a2a = next(c for c in run.ranks[1].collectives if c.op == "all_to_all_single")
    assert (a2a.sends, a2a.recvs, a2a.row) == ((4, 4), (4, 4), 4)
    assert next(c for c in run.ranks[0].collectives if c.op == "send").tag == 7


def _mutate(src: Path, dst: Path, rank: int, change) -> Path:
    shutil.copytree(src, dst)
    path = dst / f"rank-{rank}.jsonl"
    path.write_bytes(change(path.read_bytes()))
    return dst


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _drop(index: int):
    return lambda d: b"\n".join(ln for i, ln in enumerate(_lines(d)) if i != index)


def _insert(index: int, junk: bytes):
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        return b"\n".join(lines[:index] + [junk] + lines[index:])
    return change


def _repeat(index: int):
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        return b"\n".join(lines[:index + 1] + [lines[index]] + lines[index + 1:])
    return change


def _splice(index: int):
    """A line cut short and the next line glued to it (a torn write)."""
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        lines[index] = lines[index][:len(lines[index]) // 2] + lines[index + 1]
        del lines[index + 1]
        return b"\n".join(lines)
    return change


def _reorder(a: int, b: int):
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        lines[a], lines[b] = lines[b], lines[a]
        return b"\n".join(lines)
    return change


def _edit(index: int, old: bytes, new: bytes):
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        assert old in lines[index]  # a damage that changes nothing tests nothing
        lines[index] = lines[index].replace(old, new, 1)
        return b"\n".join(lines)
    return change


def _nth(prefix: bytes, n: int, change_line):
    """Change the ``n``-th line that begins with ``prefix`` (None: drop it)."""
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        i = [i for i, ln in enumerate(lines) if ln.startswith(prefix)][n]
        new = change_line(lines[i])
        assert new != lines[i]
        lines[i:i + 1] = [] if new is None else [new]
        return b"\n".join(lines)
    return change


def _move_after_use(d: bytes) -> bytes:
    """A site record written after the first collective line that names it."""
    lines = _lines(d)
    i = next(i for i, ln in enumerate(lines) if ln.startswith(_SITE) and b'"id": 2,' in ln)
    use = next(j for j in range(i, len(lines)) if re.search(rb'"site": 2[,}]', lines[j]))
    return b"\n".join(lines[:i] + lines[i + 1:use + 1] + [lines[i]] + lines[use + 1:])


_SITE = b'{"kind": "site", '


def _swap_collectives(start: int):
    """Two neighbouring collective lines written in the wrong order."""
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        i = next(i for i in range(start, len(lines) - 1)
                 if lines[i].startswith(b'{"id": ') and lines[i + 1].startswith(b'{"id": '))
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
        return b"\n".join(lines)
    return change


DAMAGE = {
    "swapped-collectives": _swap_collectives(400),
    "lost-line": _drop(300),
    "lost-last-collective": _drop(-3),
    "junk-line": _insert(200, b"\xff\xfe junk"),
    "json-but-not-a-record": _insert(250, b"[1, 2, 3]"),
    "repeated-line": _repeat(400),
    "torn-write": _splice(500),
    "swapped-lines": _reorder(600, 601),
    "state-before-its-collective": _reorder(10, 40),
    "unknown-kind": _insert(100, b'{"kind": "mystery", "t": 1}'),
    "foreign-key-order": _insert(150, json.dumps(
        {"kind": "collective", "rank": 0, "id": 99999, "group": "0", "seq": 5,
         "op": "barrier", "label": "user", "state": "completed"}).encode()),
    "site-without-group": _nth(_SITE, 1, lambda ln: ln.replace(b'"group": "0", ', b"")),
    "stack-redefined": _insert(700, b'{"kind": "stack", "id": 0, "frames": []}'),
    "site-redefined": _nth(_SITE, 3, lambda ln: ln + b"\n" + ln.replace(b'"id": 3,',
                                                                     b'"id": 0,')),
    "lost-site-line": _nth(_SITE, 2, lambda ln: None),
    "site-after-its-first-use": _move_after_use,
    "collective-naming-no-site": _nth(b'{"id": 90, ', 0,
                                      lambda ln: re.sub(rb'"site": \d+', b'"site": 999', ln)),
    "site-id-not-a-number": _nth(b'{"id": 95, ', 0,
                                 lambda ln: re.sub(rb'"site": (\d+)', rb'"site": "\1"', ln)),
    "bad-state-record": _insert(300, b'{"kind": "state", "id": "x", "state": "completed"}'),
    "state-for-unknown-id": _insert(300, b'{"kind": "state", "id": 77777, "state": "failed", '
                                         b'"t": 5.0}'),
    "bad-utf8-in-site": _nth(_SITE, 2, lambda ln: ln.replace(b'"label": "', b'"label": "\xff\xfe')),
    "bad-utf8-in-tail": _nth(b'{"id": 130, ', 0, lambda ln: ln.replace(b'"site": ',
                                                                       b'"\xff\xfesite": ')),
    "bad-number-in-head": _edit(140, b'"iteration": ', b'"iteration": 1.2.3'),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_damaged_traces_read_the_same(job: Path, tmp_path: Path, name: str) -> None:
    if name == "bad-number-in-head":
        pytest.skip("a damaged variable head: the compact path keeps the collective its "
                    "tail describes (see trace/compact.py), the other path drops the line")
    _assert_same(_mutate(job, tmp_path / "logs", 0, DAMAGE[name]))


def test_a_lost_site_line_loses_the_collectives_that_name_it(job: Path, tmp_path: Path) -> None:
    """A collective whose site's line was lost is damage: counted, never read as another op
    (format 9)."""
    data = (job / "rank-0.jsonl").read_bytes()
    site = [ln for ln in _lines(data) if ln.startswith(_SITE)][2]
    sid = json.loads(site)["id"]
    naming = [rec["id"] for rec in map(json.loads, _lines(data)[1:-1])
              if rec.get("site") == sid and rec["kind"] == "collective"]
    assert naming
    whole = load_run([job]).ranks[0].collectives
    run = _assert_same(_mutate(job, tmp_path / "logs", 0, DAMAGE["lost-site-line"]))
    trace = run.ranks[0]
    assert trace.damaged_lines >= len(naming)
    by_id = {c.id: c for c in whole}
    kept = list(trace.collectives)
    assert kept and not {c.id for c in kept} & set(naming)
    assert all((c.op, c.label, c.shapes) == (by_id[c.id].op, by_id[c.id].label,
                                             by_id[c.id].shapes) for c in kept)


def test_cut_off_anywhere_reads_the_same(job: Path, tmp_path: Path) -> None:
    size = (job / "rank-1.jsonl").stat().st_size
    for i, cut in enumerate(range(size - 3000, size, 137)):
        _assert_same(_mutate(job, tmp_path / f"cut{i}", 1, lambda d, c=cut: d[:c]))


def test_other_layouts_fall_back(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    head = {"kind": "header", "format": "ddpdoctor-trace", "version": 1, "rank": 0,
            "run_id": "r", "attempt": 0}
    coll = {"kind": "collective", "id": 1, "rank": 0, "group": "0", "seq": 1, "op": "barrier",
            "label": "user", "shapes": [], "dtypes": [], "numel": 0, "t": 1.0, "state":
            "completed"}
    (folder / "rank-0.jsonl").write_text(json.dumps(head) + "\n" + json.dumps(coll) + "\n")
    run = _assert_same(folder)
    assert not isinstance(run.ranks[0].collectives, CollectiveLog)
    assert run.ranks[0].collectives[0].op == "barrier"


def test_identical_ranks_share_one_code_list(job: Path) -> None:
    run = load_run([job])
    a, b = run.ranks[0].collectives, run.ranks[2].collectives
    assert isinstance(a, CollectiveLog) and a.codes is not run.ranks[1].collectives.codes
    run2 = load_run([writer_job(job.parent / "same", None, iterations=60, eval_rank=None)])
    logs = [t.collectives for t in run2.ranks.values()]
    assert all(log.codes is logs[0].codes for log in logs)
    assert b.codes is not None


def test_synthetic_traces_are_written_as_the_writer_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("ddpdoctor_bench_synth", BENCH / "synth.py")
    synth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = synth  # dataclasses look their module up
    spec.loader.exec_module(synth)
    from ddpdoctor.runtime.writer import TraceWriter

    path = tmp_path / "w.jsonl"
    writer = TraceWriter(str(path), {"kind": "header"}, 3, interval=3600, max_bytes=None)
    stacks: dict[str, int] = {}
    wanted: list[str] = []
    try:
        for cid, op in enumerate([synth.INIT[2], synth.BUF_F, synth.BUCKET_OPS[1], synth.LOG],
                                 start=1):
            bucket = 1 if op.label == "ddp.bucket" else None
            tensors = tuple((shape, f"torch.{dt}") for shape, dt in zip(op.shapes, op.dtypes))
            site = writer.site(op.group, op.op, op.label, op.api, tensors, op.reduce_op,
                               op.root, None, synth.STACKS[op.stack])
            written_id = writer.write_at(site, cid, None, bucket, 7, 1790000001.25 + cid)
            writer.returned(cid, "completed")
            assert written_id == cid
            sid = stacks.setdefault(op.stack, len(stacks))
            wanted.append(synth.site_line(cid - 1, synth.static_json(op, sid)))
            wanted.append(synth.collective_line(cid, cid, 7, bucket, synth.site_ref(cid - 1)))
    finally:
        writer.close()
    written = [line for line in path.read_text().splitlines()
               if '"kind": "collective"' in line or '"kind": "site"' in line]
    assert written == wanted
    folder = tmp_path / "synth"
    info = synth.generate(folder, 3, 3000, diverge_rank=1)
    run = _assert_same(folder)
    root = diagnose(run).findings[0]
    assert root.seq == info["diverge_seq"] and 1 in root.ranks


def test_reading_in_small_chunks_changes_nothing(job: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.trace import compact, records

    monkeypatch.setattr(records, "CHUNK", 997)  # chunk edges fall inside lines everywhere
    monkeypatch.setattr(compact, "_ID_CACHE", 300)  # and most ids lie past the shared cache
    monkeypatch.setattr(compact, "_ID_PREFIXES", {})
    _assert_same(job)
    capped = writer_job(tmp_path / "capped", 8000, iterations=300)
    assert _assert_same(capped).ranks[0].cap is not None
    for name in ("junk-line", "swapped-collectives", "state-for-unknown-id"):
        _assert_same(_mutate(job, tmp_path / name, 0, DAMAGE[name]))
    size = (job / "rank-1.jsonl").stat().st_size
    for cut in (size - 1, size - 500, size - 1001):
        run = _assert_same(_mutate(job, tmp_path / f"cut{cut}", 1, lambda d, c=cut: d[:c]))
        assert isinstance(run.ranks[1].collectives, CollectiveLog) and run.ranks[1].truncated


# -- format 4: identical ranks compared by bytes ------------------------------------------------
def _synth():
    spec = importlib.util.spec_from_file_location("ddpdoctor_bench_synth_f4", BENCH / "synth.py")
    assert spec is not None and spec.loader is not None
    synth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = synth  # dataclasses look their module up
    spec.loader.exec_module(synth)
    return synth


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("f4") / "logs"
    return folder, _synth().generate(folder, 8, 1000, diverge_rank=5, diverge_at=0.95)


def _members(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Run, list[int]]:
    """The compact run of ``folder`` and the ranks read as members of a class."""
    from ddpdoctor.trace import identical

    read: list[int] = []
    real = identical._member_log

    def spy(trace, *args):  # type: ignore[no-untyped-def]
        read.append(trace.rank)
        return real(trace, *args)

    with monkeypatch.context() as m:
        m.setattr(identical, "_member_log", spy)
        return _assert_same(folder), read


def test_identical_ranks_are_read_from_their_own_records(
        synthetic: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, info = synthetic
    run, members = _members(folder, monkeypatch)
    # rank 0 founds the class, rank 5 diverges; every other rank is read without a line pass
    assert sorted(members) == [1, 2, 3, 4, 6, 7]
    log = run.ranks[3].collectives
    assert isinstance(log, CollectiveLog) and log.codes is run.ranks[0].collectives.codes
    # each rank keeps its own issue times (the synthetic ranks' clocks differ by 10 µs)
    assert run.ranks[3].collectives[100].t - run.ranks[0].collectives[100].t == \
        pytest.approx(3e-5, abs=1e-6)
    root = diagnose(run).findings[0]
    assert root.seq == info["diverge_seq"] and 5 in root.ranks


def test_the_writer_puts_issue_times_in_done_records(tmp_path: Path) -> None:
    folder = writer_job(tmp_path / "logs", None, iterations=40, eval_rank=None)
    lines = (folder / "rank-1.jsonl").read_bytes().splitlines()
    assert all(b'"t": ' not in line for line in lines if line.startswith(b'{"id": '))
    dones = [json.loads(line) for line in lines if line.startswith(b'{"kind": "done"')]
    issued = [run for d in dones for run in issued_of(d)]
    assert issued and sum(len(times) for _, times in issued) == \
        sum(1 for line in lines if line.startswith(b'{"id": '))
    assert all(len(run) == 3 and all(type(us) is int and us >= 0 for us in run[2])
               for d in dones for run in d.get("issued", []))  # format 9: µs after the first
    run = load_run([folder])
    log = run.ranks[1].collectives
    for first, times in issued:
        assert [c.t for c in log[first - 1:first - 1 + len(times)]] == times


def test_a_rank_killed_before_its_issue_times_were_written(
        synthetic: tuple[Path, dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last collectives' lines are on disk, their times were not: they get the rank's
    clock (the last done record's time) and the same reading on both paths."""
    folder, _ = synthetic

    def cut_after_last_collective(data: bytes) -> bytes:
        lines = data.split(b"\n")
        last = max(i for i, line in enumerate(lines) if line.startswith(b'{"id": '))
        return b"\n".join(lines[:last + 1]) + b"\n"

    cut = _mutate(folder, tmp_path / "cut", 2, cut_after_last_collective)
    run, members = _members(cut, monkeypatch)
    assert 2 in members  # its collective lines are still the class's (it only lost records)
    log = run.ranks[2].collectives
    done = [json.loads(line) for line in (cut / "rank-2.jsonl").read_bytes().splitlines()
            if line.startswith(b'{"kind": "done"')]
    covered = done[-1]["upto"]
    assert len(log) > covered
    assert all(c.t == done[-1]["t"] for c in log[covered:])
    assert log[covered - 1].t == issued_of(done[-1])[-1][1][-1]
    assert all(c.state == "pending" for c in log[covered:])


def _edit_done(k: int, old: bytes, new: bytes):
    """The ``k``-th done record edited (it must hold ``old``)."""
    def change(d: bytes) -> bytes:
        lines = _lines(d)
        i = [j for j, line in enumerate(lines) if line.startswith(b'{"kind": "done"')][k]
        assert old in lines[i]
        lines[i] = lines[i].replace(old, new, 1)
        return b"\n".join(lines)
    return change


@pytest.mark.parametrize("name,change", [
    ("junk-line", _insert(300, b"\xff\xfe junk")),
    ("issued-not-numbers", _edit_done(10, b'"issued": [[', b'"issued": [["x", ')),
    ("done-with-pending-from", _edit_done(11, b'"pending": [', b'"pending_from": 9, "pending": [')),
    ("times-not-json", _edit_done(12, b', "issued": [[', b', "issued": [[1.2.3, ')),
    ("time-a-string", _edit_done(13, b'"issued": [[', b'"issued": [[1, ["x"]], [')),
    ("done-reordered", _edit_done(14, b'{"kind": "done", ', b'{"kind": "done", "x": 1, ')),
    ("state-failed", _insert(700, b'{"kind": "state", "id": 30, "state": "failed", "t": 5.0}')),
    ("lost-collective-line", _drop(800)),
    ("foreign-stack", _insert(900, b'{"kind": "stack", "id": 99, "frames": []}')),
])
def test_damaged_members_read_the_same(synthetic: tuple[Path, dict], tmp_path: Path,
                                       name: str, change) -> None:  # type: ignore[no-untyped-def]
    folder, _ = synthetic
    _assert_same(_mutate(folder, tmp_path / name, 3, change))


def _as_format3(data: bytes) -> bytes:
    """A format-9 trace rewritten as format 3 wrote it (rank, time, state and static part on
    every collective line; no site records)."""
    lines = data.split(b"\n")
    head = json.loads(lines[0])
    times = {}
    for line in lines:
        if line.startswith(b'{"kind": "done"'):
            for first, ts in issued_of(json.loads(line)):
                times.update({first + k: t for k, t in enumerate(ts)})
    out = [json.dumps({**head, "version": 3}).encode()]
    sites: dict[int, dict] = {}  # written by the writer: every site record is whole
    for line in lines[1:]:
        if line.startswith(b'{"kind": "site"'):
            rec = json.loads(line)
            sites[rec["id"]] = site_fields(rec)
            continue
        if line.startswith(b'{"id": '):
            rec = json.loads(line)
            cid = rec["id"]
            old = {"kind": "collective", "id": cid, "rank": head["rank"], "seq": rec["seq"],
                   "iteration": rec["iteration"], "t": times[cid], "state": "pending"}
            old.update((k, rec[k]) for k in ("p2p_seq", "bucket") if k in rec)
            old.update(sites[rec["site"]])
            line = json.dumps(old).encode()
        elif line.startswith(b'{"kind": "done"'):
            rec = json.loads(line)
            del rec["issued"]
            line = json.dumps(rec).encode()
        out.append(line)
    return b"\n".join(out)


def _as_format8(data: bytes) -> bytes:
    """A format-9 trace rewritten as format 8 wrote it (``state`` and the static part on every
    collective line, in the writer's layout of then, no site records; issue times in full)."""
    lines = data.split(b"\n")
    out = [json.dumps({**json.loads(lines[0]), "version": 8}).encode()]
    sites: dict[int, str] = {}
    for line in lines[1:]:
        if line.startswith(b'{"kind": "site"'):
            rec = json.loads(line)
            sites[rec["id"]] = json.dumps(site_fields(rec))[1:-1]
            continue
        if line.startswith(b'{"id": '):
            rec = json.loads(line)
            extra = "".join(f', "{k}": {rec[k]}' for k in ("p2p_seq", "bucket") if k in rec)
            line = (f'{{"id": {rec["id"]}, "kind": "collective", "seq": {rec["seq"]}, '
                    f'"iteration": {rec["iteration"]}, "state": "pending"{extra}, '
                    f'{sites[rec["site"]]}}}').encode()
        elif line.startswith(b'{"kind": "done"'):  # issue times in full, not as offsets
            rec = json.loads(line)
            if "issued" in rec:
                rec["issued"] = [[first, [round(t, 6) for t in ts]]
                                 for first, ts in issued_of(rec)]
            line = json.dumps(rec).encode()
        out.append(line)
    return b"\n".join(out)


def test_format_8_traces_still_take_the_fast_path(synthetic: tuple[Path, dict],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Folders written before format 9 read as they did: compactly, identical ranks as members
    of a class, with the same collectives as their format-9 form."""
    folder, info = synthetic
    old = tmp_path / "v8"
    old.mkdir()
    for path in folder.glob("rank-*.jsonl"):
        (old / path.name).write_bytes(_as_format8(path.read_bytes()))
    assert b'"state": "pending", "group": "0"' in (old / "rank-0.jsonl").read_bytes()
    run, members = _members(old, monkeypatch)
    assert all(t.version == 8 and isinstance(t.collectives, CollectiveLog)
               for t in run.ranks.values())
    assert len(members) >= 6  # 8 ranks, one diverging: the others read through one class
    new = load_run([folder])

    def fields(c: Collective) -> dict:  # issue times agree to the microsecond
        return {**dataclasses.asdict(c), "t": round(c.t * 1e6)}

    for r, trace in run.ranks.items():
        assert [fields(c) for c in trace.collectives[-50:]] == \
            [fields(c) for c in new.ranks[r].collectives[-50:]]
    assert diagnose(run).findings[0].seq == info["diverge_seq"]


def test_format_3_traces_still_take_the_fast_path(synthetic: tuple[Path, dict],
                                                  tmp_path: Path) -> None:
    folder, info = synthetic
    old = tmp_path / "v3"
    old.mkdir()
    for path in folder.glob("rank-*.jsonl"):
        (old / path.name).write_bytes(_as_format3(path.read_bytes()))
    run = _assert_same(old)
    assert all(t.version == 3 and isinstance(t.collectives, CollectiveLog)
               for t in run.ranks.values())
    new = load_run([folder])
    for r, trace in run.ranks.items():
        assert [dataclasses.asdict(c) for c in trace.collectives[-50:]] == \
            [dataclasses.asdict(c) for c in new.ranks[r].collectives[-50:]]
    assert diagnose(run).findings[0].seq == info["diverge_seq"]
