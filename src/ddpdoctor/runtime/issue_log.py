"""The trace writer's issue log: the collectives numbered since its last look, column by column.

The look reads the issue ring's slots (:mod:`ddpdoctor.trace.issue_ring`) back into these
columns with a few bulk copies, formats their lines from them in one pass and settles their
completions without a step per collective where none is still running: at a high collective
rate the look's work per collective is a rank's CPU (bench/RESULTS.md, session 43: a step per
slot, per line and per completion cost the look 1.1 µs a collective in one process, about
three times that in a busy job). The columns hold the ring's encoding: ``seq`` and
``p2p_seq`` 0 for none, ``bucket`` plus one (0 for none), the site as its record's id.
Standard library only: this runs inside every rank.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ddpdoctor.trace import issue_ring

_SLOT_BYTES = issue_ring.SLOT.size
_RING_HEAD = issue_ring.HEAD.size
_RING_MASK = issue_ring.SLOTS - 1
_unpack_slot = issue_ring.SLOT.unpack_from
# The slot's fields are eight 8-byte words (id, issue time, seq, p2p_seq, iteration, bucket,
# site, id again), little-endian: read as native words where the host is little-endian.
_WORDS = _SLOT_BYTES // 8
_BULK = issue_ring.SLOT.format == "<qdqqqqqq" and sys.byteorder == "little"


class IssueLog:
    """Collectives by their ring fields, in issue order (ids grow)."""

    __slots__ = ("ids", "times", "seqs", "p2p_seqs", "iterations", "buckets", "sites")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.times: list[float] = []
        self.seqs: list[int] = []
        self.p2p_seqs: list[int] = []
        self.iterations: list[int] = []
        self.buckets: list[int] = []
        self.sites: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, cid: int, t: float, seq: int | None, p2p_seq: int | None,
               iteration: int, bucket: int | None, site: int) -> None:
        """One collective, by its fields as the writer knows them (None for none)."""
        self.ids.append(cid)
        self.times.append(t)
        self.seqs.append(seq or 0)
        self.p2p_seqs.append(p2p_seq or 0)
        self.iterations.append(iteration)
        self.buckets.append(0 if bucket is None else bucket + 1)
        self.sites.append(site)

    def read_ring(self, ring: Any, first: int, upto: int) -> None:
        """Append the collectives ``first`` to ``upto`` from the ring mapping ``ring`` (fewer
        than its slot count; no thread storing into them meanwhile)."""
        start, end = first & _RING_MASK, (upto & _RING_MASK) + 1
        spans = [(start, end)] if start < end else [(start, _RING_MASK + 1), (0, end)]
        for a, b in spans:
            if not _BULK:
                for offset in range(_RING_HEAD + a * _SLOT_BYTES, _RING_HEAD + b * _SLOT_BYTES,
                                    _SLOT_BYTES):
                    cid, t, seq, p2p_seq, iteration, bucket, site, _ = _unpack_slot(ring, offset)
                    self.ids.append(cid)
                    self.times.append(t)
                    self.seqs.append(seq)
                    self.p2p_seqs.append(p2p_seq)
                    self.iterations.append(iteration)
                    self.buckets.append(bucket)
                    self.sites.append(site)
                continue
            # Every view released before returning: the ring's mapping cannot close while
            # one is held.
            with memoryview(ring) as whole, \
                    whole[_RING_HEAD + a * _SLOT_BYTES:_RING_HEAD + b * _SLOT_BYTES] as span, \
                    span.cast("q") as words, span.cast("d") as floats:
                self.ids += words[0::_WORDS].tolist()
                self.times += floats[1::_WORDS].tolist()
                self.seqs += words[2::_WORDS].tolist()
                self.p2p_seqs += words[3::_WORDS].tolist()
                self.iterations += words[4::_WORDS].tolist()
                self.buckets += words[5::_WORDS].tolist()
                self.sites += words[6::_WORDS].tolist()

    def fields(self, i: int) -> tuple[float, int | None, int | None, int, int | None]:
        """The ``i``-th collective's (issue time, seq, p2p_seq, iteration, bucket), None for
        none."""
        bucket = self.buckets[i]
        return (self.times[i], self.seqs[i] or None, self.p2p_seqs[i] or None,
                self.iterations[i], bucket - 1 if bucket else None)

    def consecutive(self) -> bool:
        """Whether the ids run without a gap (the ``i``-th is the first plus ``i``)."""
        ids = self.ids
        return not ids or ids[-1] - ids[0] == len(ids) - 1

    def text(self, start: int) -> str:
        """The lines of the collectives from the ``start``-th on, each ending in a newline."""
        return issue_ring.collective_text(self.ids[start:], self.seqs[start:],
                                          self.p2p_seqs[start:], self.iterations[start:],
                                          self.buckets[start:], self.sites[start:])

    def last_by_group(self, sites: Sequence[Any]) -> dict[str, int]:
        """Per group, the sequence number of its last collective here (point-to-point ops,
        which have none, left out); ``sites``: the writer's sites by id (their ``group``)."""
        last_at = dict(zip(self.sites, range(len(self.ids))))  # each site's last index
        best: dict[str, int] = {}
        for site, i in last_at.items():
            if self.seqs[i]:
                group = sites[site].group
                if i > best.get(group, -1):
                    best[group] = i
        return {group: self.seqs[i] for group, i in best.items()}
