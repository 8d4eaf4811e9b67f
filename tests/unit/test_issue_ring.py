"""The issue ring: a collective's fields stored before it is issued, its line formatted by the
writer's look, and what a rank killed before that look leaves readers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddpdoctor.runtime.writer import TraceWriter
from ddpdoctor.trace import detail, issue_ring, padding, schema
from ddpdoctor.trace.reader import load_run, read_rank, write_ring_tails

REPO = Path(__file__).resolve().parents[2]
STACK = (("/job/train.py", 3, "main"),)


def _writer(path: Path) -> TraceWriter:
    # No thread and no looks unless a test makes them: a look formats the lines.
    return TraceWriter(str(path), schema.header(0, "r", 0), 0, interval=3600, max_bytes=None,
                       thread=False)


def _issue(w: TraceWriter, seqs: range, label: str = "user", bucket: int | None = None) -> None:
    for seq in seqs:
        site = w.site("0", "all_reduce", label, "all_reduce", (((4,), "torch.float32"),),
                      "SUM", None, None, STACK)
        w.write_at(site, seq, None, bucket, seq // 10, 5.0 + seq)


def _kinds(path: Path) -> list[str]:
    text = path.read_bytes().rstrip(b"\0").decode()  # a mapped trace's padding left out
    return [json.loads(line)["kind"] for line in text.splitlines()]


def test_lines_wait_for_the_look_and_the_ring_holds_them_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 6), bucket=2)
    assert "collective" not in _kinds(path)  # the issuing thread formatted nothing
    tail = issue_ring.tail_lines(str(path), 0)
    assert [json.loads(line)["id"] for line in tail] == [1, 2, 3, 4, 5]
    assert json.loads(tail[0]) == {"id": 1, "kind": "collective", "seq": 1, "iteration": 0,
                                   "site": 0, "bucket": 2}
    w.look()
    lines = [line for line in path.read_bytes().rstrip(b"\0").decode().splitlines()
             if '"collective"' in line]
    assert lines == tail  # the look writes what readers would have made of the ring
    assert issue_ring.tail_lines(str(path), 0) == []  # the ring knows they are written
    w.close()
    assert not Path(issue_ring.path_of(str(path))).exists()


def test_the_trace_keeps_the_issue_order_around_other_records(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 3))
    w.put({"kind": "warning", "t": 1.0, "message": "between"})
    _issue(w, range(3, 5), label="other")  # a new site: its record after the lines before it
    w.close()
    kinds = _kinds(path)
    assert kinds[1:] == ["stack", "site", "collective", "collective", "warning", "site",
                         "collective", "collective", "done"], kinds


_KILLED = textwrap.dedent("""
    import os, signal, sys
    from ddpdoctor.runtime.writer import TraceWriter
    from ddpdoctor.trace import schema
    w = TraceWriter(sys.argv[1], schema.header(0, "r", 0), 0, interval=3600, max_bytes=None,
                    thread=False)
    stack = (("/job/train.py", 3, "main"),)
    n = int(sys.argv[2])
    for seq in range(1, n + 1):
        site = w.site("0", "all_reduce", "user", "all_reduce", (((4,), "torch.float32"),),
                      "SUM", None, None, stack)
        w.write_at(site, seq, None, None, seq // 10, 5.0 + seq)
        if seq == int(sys.argv[3]):
            w.look()
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("n, look_at", [(300, 120), (3 * issue_ring.SLOTS + 5, 0)])
def test_a_rank_killed_before_its_look_is_read_with_the_lines_its_ring_holds(
        tmp_path: Path, n: int, look_at: int) -> None:
    # (3 * SLOTS + 5, no look): the issuing thread wrote the lines itself before the ring
    # would have wrapped, three times over.
    path = tmp_path / "rank-0.jsonl"
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(path), str(n), str(look_at)],
                          cwd=REPO, timeout=60, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    in_file = path.read_bytes().count(b'"kind": "collective"')
    assert 0 < in_file < n  # the rest only in the ring
    trace = read_rank(path)
    assert [c.seq for c in trace.collectives] == list(range(1, n + 1))
    assert not trace.damaged_lines and not trace.truncated and trace.exit is None
    assert all(c.op == "all_reduce" and c.site.line == 3 for c in trace.collectives)
    assert len(load_run([tmp_path]).ranks[0].collectives) == n
    # What ddpdoctor run does at the job's end: the lines appended, the ring gone.
    padding.trim(str(tmp_path))
    write_ring_tails(tmp_path)
    assert not Path(issue_ring.path_of(str(path))).exists()
    assert path.read_bytes().count(b'"kind": "collective"') == n
    again = read_rank(path)
    assert [c.seq for c in again.collectives] == list(range(1, n + 1))
    assert not again.damaged_lines and not again.truncated


def test_a_line_cut_off_by_the_kill_is_replaced_by_the_rings_whole_one(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 5))
    with open(path, "r+b") as fh:  # the look was storing id 1's line when the rank died
        data = padding.open_data(fh).read()
        fh.seek(len(data))
        fh.write(b'{"id": 1, "kind": "coll')
    assert [c.id for c in read_rank(path).collectives] == [1, 2, 3, 4]
    padding.trim(str(tmp_path))
    write_ring_tails(tmp_path)
    trace = read_rank(path)
    assert [c.id for c in trace.collectives] == [1, 2, 3, 4] and not trace.damaged_lines


def test_a_slot_torn_by_the_kill_ends_the_tail_before_it(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 11))
    ring = Path(issue_ring.path_of(str(path)))
    data = bytearray(ring.read_bytes())
    last = issue_ring.HEAD.size + 8 * issue_ring.SLOT.size  # id 8's slot: its closing id
    data[last + issue_ring.SLOT.size - 8:last + issue_ring.SLOT.size] = (7).to_bytes(8, "little")
    ring.write_bytes(bytes(data))
    assert [c.id for c in read_rank(path).collectives] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("damage", [b"", b"NOTARING" + b"\0" * 56, b"short"])
def test_a_ring_of_another_format_or_cut_short_adds_nothing(tmp_path: Path,
                                                            damage: bytes) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 4))
    ring = Path(issue_ring.path_of(str(path)))
    ring.write_bytes(damage + ring.read_bytes()[len(damage):] if damage[:1] == b"N"
                     else damage)
    assert len(read_rank(path).collectives) == 0
    assert issue_ring.tail_lines(str(path), 0) == []


def test_without_a_ring_each_line_is_written_as_its_collective_is_issued(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, trace_path: str) -> None:
        raise OSError("no room")

    monkeypatch.setattr("ddpdoctor.runtime.ring_file.RingFile.__init__", refuse)
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 4))
    assert _kinds(path).count("collective") == 3
    assert not os.path.exists(issue_ring.path_of(str(path)))
    w.close()
    assert [c.seq for c in read_rank(path).collectives] == [1, 2, 3]


def test_the_detail_sent_to_other_nodes_holds_the_lines_only_the_ring_has(tmp_path: Path) -> None:
    path = tmp_path / "rank-3.jsonl"
    w = _writer(path)
    _issue(w, range(1, 4))
    assert b'"kind": "collective"' not in path.read_bytes()
    lines = [json.loads(line) for line in detail.extract(path).splitlines()]
    assert [rec["id"] for rec in lines if rec["kind"] == "collective"] == [1, 2, 3]
    assert lines[0]["partial"] is True


def test_a_ring_is_read_with_the_slot_count_its_head_gives(tmp_path: Path) -> None:
    # A ring another ddpdoctor made with fewer slots: ids at id % 16.
    path = tmp_path / "rank-0.jsonl"
    w = _writer(path)
    _issue(w, range(1, 4))
    ring = Path(issue_ring.path_of(str(path)))
    data = ring.read_bytes()
    small = bytearray(issue_ring.HEAD.pack(issue_ring.MAGIC, issue_ring.VERSION,
                                           issue_ring.SLOT.size, 16, 0))
    small += bytes(16 * issue_ring.SLOT.size)
    for cid in (1, 2, 3):
        at = issue_ring.HEAD.size + cid * issue_ring.SLOT.size
        small[at:at + issue_ring.SLOT.size] = data[at:at + issue_ring.SLOT.size]
    ring.write_bytes(bytes(small))
    assert [c.id for c in read_rank(path).collectives] == [1, 2, 3]
