"""The writer's issue log: the ring read back column by column, the lines formatted from the
columns, each group's last sequence number."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddpdoctor.runtime import issue_log
from ddpdoctor.runtime.issue_log import IssueLog
from ddpdoctor.trace import issue_ring

SLOTS = issue_ring.SLOTS


def _ring(ids: range) -> bytearray:
    """A ring holding collectives ``ids``: seq = id, p2p_seq on every fifth (seq 0), a bucket
    on every third, iteration id // 10, site id % 4, issue time 1000 + id / 8."""
    ring = bytearray(issue_ring.size())
    for cid in ids:
        p2p = cid % 5 == 0
        issue_ring.SLOT.pack_into(ring, issue_ring.HEAD.size + (cid % SLOTS) * issue_ring.SLOT.size,
                                  cid, 1000 + cid / 8, 0 if p2p else cid, cid if p2p else 0,
                                  cid // 10, cid % 7 if cid % 3 == 0 else 0, cid % 4, cid)
    return ring


def _columns(log: IssueLog) -> list[list]:
    return [log.ids, log.times, log.seqs, log.p2p_seqs, log.iterations, log.buckets, log.sites]


@pytest.mark.parametrize("first", [1, SLOTS - 3])  # without and across the wrap
def test_the_ring_is_read_back_alike_in_bulk_and_slot_by_slot(
        first: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = range(first, first + 40)
    ring = _ring(ids)
    bulk = IssueLog()
    bulk.read_ring(ring, ids[0], ids[-1])
    monkeypatch.setattr(issue_log, "_BULK", False)
    one_by_one = IssueLog()
    one_by_one.read_ring(ring, ids[0], ids[-1])
    assert _columns(bulk) == _columns(one_by_one)
    assert bulk.ids == list(ids) and bulk.consecutive()
    assert bulk.times == [1000 + cid / 8 for cid in ids]
    assert bulk.fields(0) == (1000 + first / 8, None if first % 5 == 0 else first,
                              first if first % 5 == 0 else None, first // 10,
                              first % 7 - 1 if first % 3 == 0 and first % 7 else None)


def test_the_lines_from_the_columns_are_the_writers_lines() -> None:
    """Plain lines in one pass, lines with buckets, and any p2p op among them: each the line
    issue_ring.collective_line writes for the same fields, ending in a newline."""
    for ids in (range(1, 3), range(3, 4), range(1, 30)):  # plain; with a bucket; p2p among them
        log = IssueLog()
        log.read_ring(_ring(ids), ids[0], ids[-1])
        expected = []
        for i, cid in enumerate(log.ids):
            _, seq, p2p_seq, iteration, bucket = log.fields(i)
            expected.append(issue_ring.collective_line(cid, seq, iteration, log.sites[i],
                                                       p2p_seq, bucket) + "\n")
        assert log.text(0) == "".join(expected) and log.text(1) == "".join(expected[1:])
        assert log.text(len(log)) == ""
    log = IssueLog()
    log.append(7, 1.5, 3, None, 2, None, 1)
    log.append(8, 1.6, 4, None, 2, 0, 1)
    assert log.text(0) == (
        '{"id": 7, "kind": "collective", "seq": 3, "iteration": 2, "site": 1}\n'
        '{"id": 8, "kind": "collective", "seq": 4, "iteration": 2, "site": 1, "bucket": 0}\n')
    assert log.text(1) == \
        '{"id": 8, "kind": "collective", "seq": 4, "iteration": 2, "site": 1, "bucket": 0}\n'
    plain = IssueLog()  # the usual lines, one % over them all: fields that vary line to line
    for cid in range(100, 400):
        plain.append(cid, float(cid), cid * 3 + 1, None, cid // 7, None, cid % 11)
    assert plain.text(0) == "".join(
        issue_ring.collective_line(cid, cid * 3 + 1, cid // 7, cid % 11, None, None) + "\n"
        for cid in range(100, 400))


def test_each_group_keeps_the_sequence_number_of_its_last_collective() -> None:
    """The last by position, not the highest (a group made again counts from 1); point-to-
    point ops have none."""
    sites = [SimpleNamespace(group=g) for g in ("0", "1", "0", "0")]
    log = IssueLog()
    for cid, (seq, p2p_seq, site) in enumerate([(8, None, 0), (5, None, 1), (9, None, 2),
                                                (None, 4, 3), (1, None, 0)], start=1):
        log.append(cid, float(cid), seq, p2p_seq, 0, None, site)
    assert log.last_by_group(sites) == {"0": 1, "1": 5}
    assert IssueLog().last_by_group(sites) == {}


def test_ids_with_a_gap_are_not_consecutive() -> None:
    log = IssueLog()
    for cid in (4, 5, 7):
        log.append(cid, 0.0, cid, None, 0, None, 0)
    assert not log.consecutive() and IssueLog().consecutive()
