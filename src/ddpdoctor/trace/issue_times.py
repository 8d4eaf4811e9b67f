"""Format 4's issue times of one rank's collectives, found in its ``done`` records.

A collective line of format 4 carries no time: the writer thread lists the issue times of the
collectives written since its last ``done`` record in that record's ``issued`` runs. A reader
keeps where each run is (its first id, length, line) and decodes a run's times from its line
only when a collective's time is asked for. A collective whose time never reached a ``done``
record (its rank was killed within the writer's interval) gets the rank's clock at its line
(:func:`~ddpdoctor.trace.records.clock_time`), as the record-by-record reader gives it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable

from ddpdoctor.trace import schema
from ddpdoctor.trace.records import issued_run, parse_line


class IssueTimes:
    """Format 4's times of one rank's collectives: where its ``done`` records' ``issued``
    runs are (the times decoded from their line when a collective is), and the rank's clock
    (:func:`~ddpdoctor.trace.records.clock_time`) at each point of the file it changed, for
    a collective whose issue time never reached a ``done`` record."""

    def __init__(self) -> None:
        self.counts = array("q")  # collective lines before the clock changed
        self.times = array("d")  # the clock from there on
        self.first = array("q")  # per issued run: its first id,
        self.n = array("q")  # its length,
        self.lines = array("q")  # the line of its done record,
        self.index = array("q")  # and its place in that record
        self._runs: dict[tuple[int, int], tuple[int, list[float]] | None] = {}
        self._issued: dict[int, object] = {}  # done line -> its decoded ``issued``
        self.sorted = True  # the runs come in order of their ids, none overlapping

    def add_run(self, first: int, n: int, line_no: int, index: int) -> None:
        """An ``issued`` run of ``n`` ids from ``first``: entry ``index`` of the ``done``
        record on line ``line_no``."""
        if self.first and first < self.first[-1] + self.n[-1]:
            self.sorted = False
        self.first.append(first)
        self.n.append(n)
        self.lines.append(line_no)
        self.index.append(index)

    def note(self, count: int, clock: float, line_no: int,
             runs: Iterable[tuple[int, int, int]] = ()) -> None:
        """A record folded after ``count`` collective lines, at line ``line_no``: ``clock``,
        the rank's clock after it; ``runs``, its ``issued`` runs as (first id, length,
        place in the record)."""
        if not self.times or self.times[-1] != clock:
            self.counts.append(count)
            self.times.append(clock)
        for first, n, index in runs:
            if n > 0:
                self.add_run(first, n, line_no, index)

    def line_of(self, cid: int) -> int | None:
        """The line of the ``done`` record that most likely holds ``cid``'s issue time (to be
        read together with the collective's own line)."""
        if not self.sorted:
            return None
        i = bisect_right(self.first, cid) - 1
        return self.lines[i] if i >= 0 and cid < self.first[i] + self.n[i] else None

    def primed(self, line_no: int) -> bool:
        return line_no in self._issued

    def prime(self, line_no: int, raw: bytes) -> None:
        """The ``done`` record on line ``line_no``, read along with collective lines."""
        if line_no not in self._issued:
            rec = parse_line(raw)
            self._issued[line_no] = rec.get(schema.ISSUED) if isinstance(rec, dict) else None

    def issue_time(self, cid: int, explicit: int, line_no: int,
                   read_lines: Callable[[list[int]], dict[int, bytes]]) -> float:
        """The issue time of collective ``cid``, the ``explicit``-th collective line (line
        ``line_no``), as the record-by-record reader sets it: from the last ``done`` record
        after its line that lists it, else the clock at its line."""
        first, n, lines = self.first, self.n, self.lines
        if self.sorted:
            i = bisect_right(first, cid) - 1
            found: Iterable[int] = (i,) if i >= 0 else ()
        else:  # damaged or reordered records: the last one in the file wins
            found = reversed(range(len(first)))
        for i in found:
            if not (first[i] <= cid < first[i] + n[i] and lines[i] > line_no):
                continue
            key = (lines[i], self.index[i])
            if key not in self._runs:
                if lines[i] not in self._issued:
                    self.prime(lines[i], read_lines([lines[i]])[lines[i]])
                raw = self._issued[lines[i]]
                self._runs[key] = issued_run(raw[self.index[i]]) \
                    if isinstance(raw, list) and self.index[i] < len(raw) else None
            run = self._runs[key]
            if run is not None and cid - run[0] < len(run[1]):
                return run[1][cid - run[0]]
        j = bisect_right(self.counts, explicit) - 1
        return self.times[j] if j >= 0 else 0.0
