"""The fast path of the trace reader: a rank's collectives kept compact, materialised on demand.

A long job writes tens of thousands of collective lines per rank that differ only in their
ids (format 3: and times): the part the writer caches (group, op, label, tensors, stack; see
``TraceWriter._write_site``; from format 9 a ``site`` record that the lines name) repeats.
:func:`read_compact` therefore reads a trace file written in the writer's exact layout without
decoding every line: each collective line is reduced to its tail, the bytes from its
``"state"`` field (format 9: its ``"site"`` field) to its end, which are interned (one dict
lookup per line), and only the first line of every distinct tail is decoded (with the site it
names) and checked field by field against the layout. What a rank keeps is a
:class:`CollectiveLog`: one prototype :class:`~ddpdoctor.trace.model.Collective` per distinct
static part, a list of small ints (which prototype each collective is, shared by every rank
whose list is identical) and a sparse index of line offsets. A full ``Collective`` (its id,
seq, iteration, time, state) is decoded from its line only when the analysis asks for it:
around a divergence, at the end of a rank, for point-to-point pairing. The file is read in
chunks of :data:`CHUNK` bytes, so memory grows with the number of collectives (a few bytes
each), not with the file's size.

Anything outside the layout (keys in another order, a collective line that decodes but does not
match, a redefined stack or site) raises :class:`NotCompact` and the reader falls back to
decoding every line; damaged lines are counted as the record-by-record reader counts them. The
checks that make the positions trustworthy: every collective line must carry the next ``id``
(the recorder numbers collectives 1, 2, 3, ...), so a lost, repeated or reordered line sends
the file down the record-by-record path; and the first and last collective of each group carry
``seq`` equal to their position in the group. (Sequence numbers in between are not decoded: two
threads issuing on one group at once could write two of them in swapped order, and such a trace
is read in file order.)

Ranks whose collective lines are byte for byte the same (format 4) are read by comparing bytes
(:mod:`ddpdoctor.trace.identical`); such a rank's log decodes through the first one's
(``twin``).

A size-capped trace (``repeat`` records, :mod:`ddpdoctor.runtime.trace_cap`) of a rank with one
group and no point-to-point ops is expanded here at C speed (list slices: a run copies the
codes ``back`` positions earlier); its members are built from their run when asked for. Other
capped traces are read record by record (:func:`~ddpdoctor.trace.records.expand_repeat`).
"""

from __future__ import annotations

import json
import re
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, BinaryIO, overload

from ddpdoctor.trace import schema
from ddpdoctor.trace.issue_times import IssueTimes
from ddpdoctor.trace.model import Collective, Completion, GroupPositions, RankTrace, Site
from ddpdoctor.trace.records import (
    MAX_RUN_MEMBERS,
    STATES,
    Fold,
    apply_record,
    collective_from,
    is_int,
    is_p2p,
    line_chunks,
    parse_line,
    repeat_fields,
    run_member,
    with_site,
)

# How a collective line begins, before its id: formats 4 and 5 (the same lines), and format 3.
_PREFIX_V4 = b'{"id": %d, "kind": "collective", '
# Versions 4 to 6 have the same collective lines.
# Format 4 and every later one share the line layout of version 4.
_PREFIXES = {3: b'{"kind": "collective", "id": %d, ',
             **{v: _PREFIX_V4 for v in range(4, schema.VERSION + 1)}}
_HEADS = {3: list(schema.COLLECTIVE_HEAD_V3),
          **{v: list(schema.COLLECTIVE_HEAD) for v in range(4, schema.VERSION + 1)}}
_PREFIX_LEN = len(b'{"id": ')  # a line's tail lies past this in every format
STATE_MARK = b'"state": "'  # where the tail of a collective line begins, formats 3 to 8
SITE_MARK = b'"%s": ' % schema.SITE_REF.encode()  # and from format 9
_TAIL_MARKS = {**{v: STATE_MARK for v in range(3, 9)},
               **{v: SITE_MARK for v in range(9, schema.VERSION + 1)}}
_STATE_PREFIX = b'{"kind": "state", "id": '
_STATE_LINE = re.compile(
    rb'\{"kind": "state", "id": (\d+), "state": "([a-z_]+)", "t": (-?\d+(?:\.\d+)?)\}')
# Greedy, not possessive (Python 3.10 has no possessive quantifiers): each part ends at a
# character the next cannot start with, so nothing backtracks.
_NUMBER = rb'-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?'
_INT = rb'(?:0|[1-9]\d*)'
DONE_PREFIX = b'{"kind": "done", "t": '
# A done record as the writer writes it in format 4 (no ``pending_from``, one ``issued`` run):
# what comes before the issue times, which are counted here and decoded only when needed. A
# record of any other shape is decoded as JSON.
DONE_LINE = re.compile(rb'\{"kind": "done", "t": (' + _NUMBER + rb'), "upto": (' + _INT
                        + rb'), "pending": \[((?:' + _INT + rb'(?:, ' + _INT + rb')*)?)\], "'
                        + schema.ISSUED.encode() + rb'": \[\[(' + _INT + rb'), (?:'
                        + _NUMBER + rb', )?\[')  # format 9: the run's first time, then offsets
_ITERATION = re.compile(rb', "iteration": (\d+), "')  # in the head, before the tail
_VARIABLE_TAIL = schema.COLLECTIVE_VARIABLE
_TAIL_FIELDS = frozenset(schema.COLLECTIVE_VARIABLE + schema.COLLECTIVE_STATIC
                         + (schema.SITE_REF,))
BLOCK = 64  # lines per entry of the sparse offset index


class NotCompact(Exception):
    """The file is not in the writer's exact layout: read it record by record instead."""


@dataclass
class _Runs:
    """The ``repeat`` runs of a capped trace, in order: each run's first position in the log,
    its record, the collective lines before it and the run members before it."""

    starts: array = field(default_factory=lambda: array("q"))
    recs: list[dict] = field(default_factory=list)
    counts: array = field(default_factory=lambda: array("q"))
    before: array = field(default_factory=lambda: array("q"))


class GroupView(Sequence[Collective]):
    """One rank's collectives in one group, by position (``seq - 1``), materialised lazily."""

    def __init__(self, log: CollectiveLog, ordinals: list[int] | None, length: int) -> None:
        self._log = log
        self._ordinals = ordinals  # position -> index in the rank's log; None: the same
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Collective: ...

    @overload
    def __getitem__(self, index: slice) -> list[Collective]: ...

    def __getitem__(self, index: int | slice) -> Collective | list[Collective]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        return self._log[index if self._ordinals is None else self._ordinals[index]]


class CollectiveLog(Sequence[Collective]):
    """A rank's collectives in file order, read compactly: a read-only ``Sequence[Collective]``
    and a :class:`~ddpdoctor.trace.model.CollectiveIndex`.

    ``protos`` holds one prototype per distinct static part (variable fields left at their
    defaults) and ``codes`` which prototype each collective is. Indexing decodes that
    collective's line from the file (cached), with its later ``state`` record applied, exactly
    as the record-by-record reader would have built it. Built by :func:`read_compact` from
    what one pass over the file (:class:`LineReader`) found; raises :class:`NotCompact` when what
    it found does not hold together.
    """

    def __init__(self, path: str, rank: int, codes: list[int], tail_codes: list[int],
                 reader: LineReader, runs: _Runs | None, twin: CollectiveLog | None = None) -> None:
        """``twin``: the log of a rank whose collective lines are this rank's, byte for byte
        (format 4): a collective is decoded once there and given this rank's own fields."""
        self.path = path
        self.rank = rank
        self.protos = reader.protos
        self.codes = codes
        self.stacks = reader.stacks
        self.sites = reader.fold.sites
        self.groups: dict[str, tuple[list[int], list[int] | None]] = {}
        self.p2p_ordinals: list[int] = []
        self.incomplete_ordinals: list[int] = []
        self._others = reader.others  # per non-collective line: collectives before it
        self._sparse = reader.sparse  # byte offset of every BLOCK-th line
        self._clock = reader.clock  # format 4: issue times, and the clock where none came
        # Later state records, sorted by id (stable: the last record of an id comes last).
        order = sorted(range(len(reader.state_ids)), key=reader.state_ids.__getitem__)
        self._state_ids = array("q", [reader.state_ids[i] for i in order])
        self._state_words = [reader.state_words[i] for i in order]
        self._state_t = [reader.state_t[i] for i in order]
        self._cache: dict[int, Collective] = {}
        self._twin = twin
        self._last_iterations: dict[int, int] = {}
        self._head_damaged: set[int] = set()  # decoded from their tail alone
        self.version = reader.trace.version
        self.completion = reader.trace.completion
        self._runs = runs or _Runs()
        self.has_runs = runs is not None  # a capped trace's repeat runs were expanded
        self._index(tail_codes, reader)
        if twin is None:
            self._check()
        else:  # its lines are the twin's, checked there; its offsets by _member_log
            self._load(self.p2p_ordinals)

    # -- Sequence ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, index: int) -> Collective: ...

    @overload
    def __getitem__(self, index: slice) -> list[Collective]: ...

    def __getitem__(self, index: int | slice) -> Collective | list[Collective]:
        n = len(self.codes)
        if isinstance(index, slice):
            wanted = range(*index.indices(n))
            self._load([k for k in wanted if k not in self._cache])
            return [self._cache[k] for k in wanted]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        c = self._cache.get(index)
        if c is None:
            self._load([index])
            c = self._cache[index]
        return c

    def __iter__(self) -> Iterator[Collective]:
        for start in range(0, len(self.codes), 4096):
            yield from self[start:start + 4096]

    # -- what the analysis asks for (CollectiveIndex) ----------------------------------------
    def by_group(self) -> dict[str, GroupPositions]:
        """Per process group, this rank's collectives by position, decoded when looked at."""
        return {name: GroupPositions(codes, GroupView(self, ordinals, len(codes)))
                for name, (codes, ordinals) in self.groups.items()}

    def p2p(self) -> list[Collective]:
        """The point-to-point operations (decoded when the log was built)."""
        return [c for c in (self[k] for k in self.p2p_ordinals) if c.peer is not None]

    def incomplete(self, window: int) -> list[Collective]:
        """The collectives among the last ``window`` that never completed, in order."""
        first = max(0, len(self.codes) - window)
        ordinals = self.incomplete_ordinals[bisect_left(self.incomplete_ordinals, first):]
        return [c for c in (self[k] for k in ordinals) if c.state != schema.COMPLETED]

    def used_stacks(self) -> list[list[Site]]:
        """The distinct call stacks of this rank's collectives."""
        return list({id(p.stack): p.stack for p in self.protos}.values())

    def last_iteration(self, window: int) -> int:
        """The highest DDP iteration among the last ``window`` collectives, read off their
        lines without decoding them (every rank asks: 1024 ranks × 64 lines); a line it does
        not recognise, and a run member, is decoded."""
        if self._twin is not None:  # the same lines
            return self._twin.last_iteration(window)
        known = self._last_iterations.get(window)
        if known is None:
            known = self._last_iterations[window] = self._read_last_iteration(window)
        return known

    def _read_last_iteration(self, window: int) -> int:
        first = max(0, len(self.codes) - window)
        best = 0
        lines: dict[int, int] = {}
        for k in range(first, len(self.codes)):
            e = self.explicit(k)
            if e is None or k in self._cache:
                best = max(best, self[k].iteration or 0)
            else:
                lines[self.line_index(e)] = k
        if lines:
            for n, raw in self.read_lines(list(lines)).items():
                m = _ITERATION.search(raw, _PREFIX_LEN)
                it = int(m[1]) if m is not None else self[lines[n]].iteration or 0
                best = max(best, it)
        return best

    # -- decoding ---------------------------------------------------------------------------
    def line_index(self, explicit: int) -> int:
        """Line number (0 = header) of the ``explicit``-th collective line."""
        return 1 + explicit + bisect_right(self._others, explicit)

    def _run_of(self, ordinal: int) -> int | None:
        r = bisect_right(self._runs.starts, ordinal) - 1
        if r >= 0 and ordinal < self._runs.starts[r] + self._runs.recs[r]["n"]:
            return r
        return None

    def explicit(self, ordinal: int) -> int | None:
        """Which collective line the ``ordinal``-th collective is; None for a run member."""
        if not self._runs.recs:
            return ordinal
        r = bisect_right(self._runs.starts, ordinal) - 1
        if r < 0:
            return ordinal
        end = self._runs.before[r] + self._runs.recs[r]["n"]
        return None if ordinal < self._runs.starts[r] + self._runs.recs[r]["n"] \
            else ordinal - end

    def ordinal(self, explicit: int) -> int:
        """The position in the log of the ``explicit``-th collective line."""
        if not self._runs.recs:
            return explicit
        r = bisect_right(self._runs.counts, explicit) - 1
        return explicit if r < 0 else explicit + self._runs.before[r] + self._runs.recs[r]["n"]

    def _member(self, ordinal: int, r: int) -> Collective:
        """A run member, from the explicit collective its static part was copied from."""
        rec = self._runs.recs[r]
        off = ordinal - self._runs.starts[r]
        delta, k = 0, ordinal
        run: int | None = r
        while run is not None:  # follow the copies back to a collective line
            start, back = self._runs.starts[run], self._runs.recs[run]["back"]
            hops = (k - start) // back + 1
            delta += hops * self._runs.recs[run]["iteration_delta"]
            k -= hops * back
            run = self._run_of(k)
        src = self[k]
        it = src.iteration + delta if isinstance(src.iteration, int) else None
        c = run_member(self.rank, rec, off, src, it)
        c.state = self.state_of(c.id, c.state)
        return c

    def state_of(self, cid: int, written: str) -> str:
        """The state of collective ``cid`` whose line (or run) says ``written``: its last
        ``state`` record, else, in format 3 (lines written before the collective ran), what
        the last ``done`` record says."""
        ids = self._state_ids
        i = bisect_right(ids, cid)
        if i and ids[i - 1] == cid:  # the last state record of this id wins
            return self._state_words[i - 1]
        if self.version >= 3:
            return schema.COMPLETED if self.completion.completed(cid) else schema.PENDING
        return written

    def _load(self, ordinals: list[int]) -> None:
        if self._runs.recs:
            lines = []
            for k in ordinals:
                r = self._run_of(k)
                if r is None:
                    lines.append(k)
                else:
                    self._cache[k] = self._member(k, r)
            ordinals = lines
        if not ordinals:
            return
        if self._twin is not None:
            self._load_from_twin(self._twin, ordinals)
            return
        want: dict[int, int] = {}
        done_lines: set[int] = set()
        for k in ordinals:
            e = self.explicit(k)
            assert e is not None  # run members were built above
            want[self.line_index(e)] = k
            if self.version >= 4:  # its issue time, most likely: read in the same pass
                done = self._clock.line_of(k + 1)
                if done is not None:
                    done_lines.add(done)
        raw = self.read_lines(list(want) + list(done_lines))
        for line_no in done_lines:
            self._clock.prime(line_no, raw[line_no])
        for line_no, k in want.items():
            self._cache[k] = self._decode(raw[line_no], k)

    def _load_from_twin(self, twin: CollectiveLog, ordinals: list[int]) -> None:
        """Decode as :meth:`_decode` would from this rank's own identical lines: the twin's
        collective with this rank's rank, issue time, completion and end."""
        twin._load([k for k in ordinals if k not in twin._cache])
        clock = self._clock
        done_lines = {n for n in map(clock.line_of, (k + 1 for k in ordinals))
                      if n is not None and not clock.primed(n)}
        if done_lines:
            raw = self.read_lines(list(done_lines))
            for line_no in done_lines:
                clock.prime(line_no, raw[line_no])
        ids, ends = self._state_ids, self._state_t
        for k in ordinals:
            c = clone(twin._cache[k])
            c.rank, c.t_end = self.rank, None
            if k in twin._head_damaged:
                self._head_damaged.add(k)
            else:
                c.t = clock.issue_time(c.id, k, self.line_index(k), self.read_lines)
            i = bisect_right(ids, c.id)
            if i and ids[i - 1] == c.id:
                c.t_end = ends[i - 1]
            c.state = self.state_of(c.id, schema.PENDING)
            self._cache[k] = c

    def read_lines(self, line_numbers: list[int]) -> dict[int, bytes]:
        """The file's lines with these numbers (0 = header), in one read of the span."""
        first, last = min(line_numbers), max(line_numbers)
        start = self._sparse[first // BLOCK]
        block_end = last // BLOCK + 1
        end = self._sparse[block_end] if block_end < len(self._sparse) else None
        with open(self.path, "rb") as fh:
            fh.seek(start)
            data = fh.read() if end is None else fh.read(end - start)
        lines = data.split(b"\n")
        base = (first // BLOCK) * BLOCK
        return {n: lines[n - base] if n - base < len(lines) else b"" for n in line_numbers}

    def _decode(self, raw: bytes, ordinal: int) -> Collective:
        try:
            rec = json.loads(raw.decode("utf-8"))
            c = collective_from(self.rank, with_site(rec, self.sites), self.stacks) \
                if rec.get("kind") == schema.COLLECTIVE else None
            if c is not None and "t" not in rec:  # format 4
                e = self.explicit(ordinal)
                assert e is not None  # run members are not decoded from a line
                c.t = self._clock.issue_time(c.id, e, self.line_index(e), self.read_lines)
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError,
                RecursionError):
            c = None
        if c is None:
            # A line whose variable head is damaged: what its tail says, at its position.
            self._head_damaged.add(ordinal)
            p = self.protos[self.codes[ordinal]]
            c = Collective(rank=self.rank, id=ordinal + 1, group=p.group, seq=None, op=p.op,
                           label=p.label, shapes=p.shapes, dtypes=p.dtypes, numel=p.numel,
                           reduce_op=p.reduce_op, root=p.root, peer=p.peer, api=p.api,
                           stack=p.stack, sends=p.sends, recvs=p.recvs, row=p.row, tag=p.tag)
        ids = self._state_ids
        i = bisect_right(ids, c.id)
        if i and ids[i - 1] == c.id:
            c.t_end = self._state_t[i - 1]
        c.state = self.state_of(c.id, c.state)
        return c

    # -- built once, from the reading pass ----------------------------------------------
    def _index(self, tail_codes: list[int], reader: LineReader) -> None:
        """Per-group positions, point-to-point ops and collectives that never completed."""
        protos, codes = self.protos, self.codes
        p2p = {i for i, p in enumerate(protos) if is_p2p(p)}
        names = {p.group for i, p in enumerate(protos) if i not in p2p}
        twin = self._twin
        if twin is not None and twin.codes is codes and twin.protos is protos:
            # The same lines: the same positions (16,384 ranks of several groups would each
            # hold a copy).
            self.p2p_ordinals, self.groups = twin.p2p_ordinals, twin.groups
        elif p2p:
            self.p2p_ordinals = [k for k, c in enumerate(codes) if c in p2p]
        if not self.groups and len(names) == 1 and not p2p:
            self.groups[names.pop()] = (codes, None)
        elif not self.groups:
            for name in names:
                members = {i for i, p in enumerate(protos) if p.group == name and i not in p2p}
                ordinals = [k for k, c in enumerate(codes) if c in members]
                self.groups[name] = ([codes[k] for k in ordinals], ordinals)
        # Never completed. Format 3: not covered by the last ``done`` record (its listed ids, those
        # after it) or failed. Before: written pending or failed and not completed by a later
        # state record, or failed by one; run members completed by construction.
        candidates = {cid - 1 for cid in self._state_ids}
        n = len(codes)
        if self.version >= 3:
            done = self.completion
            candidates.update(range(min(done.upto, n), n))
            candidates.update(cid - 1 for cid in done.pending)
            if done.pending_from is not None:
                candidates.update(range(max(0, done.pending_from - 1), n))
        else:
            unfinished = {i for i, s in enumerate(reader.tail_state) if s != schema.COMPLETED}
            if unfinished:
                candidates.update(self.ordinal(e) for e, c in enumerate(tail_codes)
                                  if c in unfinished)
        incomplete = []
        for k in sorted(candidates):
            if not 0 <= k < n:
                continue
            e = self.explicit(k)
            if e is None:
                written = schema.COMPLETED
            elif e < len(tail_codes):
                written = reader.tail_state[tail_codes[e]]
            else:
                continue
            if self.state_of(k + 1, written) != schema.COMPLETED:
                incomplete.append(k)
        self.incomplete_ordinals = incomplete

    def _check(self) -> None:
        """The first and last collective of each group sit where their seq says. Point-to-point
        lines are decoded here (the pairing needs them all)."""
        def record(k: int) -> dict | None:
            e = self.explicit(k)
            if e is None:
                return None  # a run member: its run was checked when expanded
            n = self.line_index(e)
            rec = parse_line(self.read_lines([n])[n])
            if not isinstance(rec, dict) or rec.get("id") != k + 1:
                raise NotCompact("collective ids out of order")
            return rec

        for name, (group_codes, ordinals) in self.groups.items():
            n = len(group_codes)
            for pos in (0, n - 1):
                rec = record(pos if ordinals is None else ordinals[pos])
                if rec is not None and rec.get("seq") != pos + 1:
                    raise NotCompact(f"group {name}: sequence numbers out of order")
        if self.codes:
            record(0)
            record(len(self.codes) - 1)
        for k in self.p2p_ordinals:
            rec = record(k)
            if rec is None or rec.get("seq") is not None:
                raise NotCompact("point-to-point op with a sequence number")
        self._load(self.p2p_ordinals)


_ID_PREFIXES: dict[int, list[bytes]] = {}  # per format version
_ID_CACHE = 1 << 18  # ids whose prefixes are kept for every rank (about 20 MB at most)


def _id_prefixes(version: int, first: int, count: int) -> tuple[list[bytes], int]:
    """``(prefixes, i)``: ``prefixes[i + j]`` is the start of the writer's collective line
    with id ``first + j``, for j up to at least ``count + 1``. Ids below :data:`_ID_CACHE`
    come from a cache shared by every rank; later ones are made for the chunk."""
    prefix = _PREFIXES[version]
    if first + count + 2 >= _ID_CACHE:
        return [prefix % i for i in range(first, first + count + 2)], 0
    cache = _ID_PREFIXES.setdefault(version, [])
    have = len(cache)
    if have <= first + count + 2:
        cache.extend(prefix % i for i in range(have, min(_ID_CACHE, first + count + 1024)))
    return cache, first


class LineReader:
    """One pass over a rank's lines; see :func:`read_compact`."""

    def __init__(self, trace: RankTrace, truncated: bool) -> None:
        if trace.version not in _PREFIXES:
            raise NotCompact(f"format {trace.version} is read record by record")
        self.trace = trace
        self.version = trace.version
        self.head = _HEADS[trace.version]
        self.truncated = truncated
        self.last = False  # feeding the file's cut-off last line
        self.codes: list[int] = []  # per collective line, the code of its tail
        self.nid = 1  # the id the next collective line must carry
        self.sparse = array("q", [0])  # byte offset of every BLOCK-th line
        self.line_no = 1  # number of the next line (0 = header)
        self.offset = 0  # byte offset of the next line
        self.stacks: dict[int, list[Site]] = {}
        self.fold = Fold(self.stacks)  # the other records; collective lines are interned here
        self.tails: dict[bytes, int] = {}
        self.tail_proto: list[int] = []
        self.tail_state: list[str] = []
        self.protos: list[Collective] = []
        self.proto_ids: dict[str, int] = {}
        self.others = array("q")
        self.state_ids: list[int] = []
        self.state_words: list[str] = []
        self.state_t: list[Any] = []  # as written (damage included): t_end of a collective
        self.runs: list[tuple[int, dict]] = []  # (collective lines before it, repeat record)
        self.members = 0  # collectives in those runs
        self.clock = IssueTimes()
        self.best_upto = 0  # the completion of the latest done record folded by _done
        self.best_pending: bytes | None = None

    def read(self, fh: BinaryIO, start: int) -> list[int]:
        """Read the file from byte ``start`` (the line after the header) in chunks of
        :data:`CHUNK`; returns the tail code of every collective line, in file order."""
        self.offset = start
        for chunk, cut_off in line_chunks(fh):
            if None in chunk:  # an endless line (a sparse or damaged file)
                raise NotCompact("a line longer than the limit")
            lines: list[bytes] = chunk  # type: ignore[assignment]  # no None: checked above
            self._index_lines(lines)
            self.last = cut_off  # no newline at the end: the cut-off last line
            self.feed(lines)
        self.settle_done()
        return self.codes

    def _index_lines(self, lines: list[bytes]) -> None:
        """Note the byte offset of every :data:`BLOCK`-th line among ``lines``."""
        if not lines:
            return
        ends = list(accumulate(map(len, lines)))  # bytes of lines[:j + 1], newlines aside
        first = self.line_no
        for j in range((-first) % BLOCK, len(lines), BLOCK):
            self.sparse.append(self.offset + (ends[j - 1] if j else 0) + j)
        self.line_no += len(lines)
        self.offset += ends[-1] + len(lines)

    def feed(self, lines: list[bytes]) -> None:
        """Fold ``lines`` in: collective lines become tail codes, the rest records."""
        tails_get = self.tails.get
        codes = self.codes
        append = codes.append
        others = self.others
        other = self._other
        new_tail = self._new_tail
        mark, plen = _TAIL_MARKS[self.version], _PREFIX_LEN
        # A collective line must start with the id that comes next: a lost, repeated or
        # reordered collective line sends the file down the record-by-record path.
        version = self.version
        expect, k = _id_prefixes(version, self.nid, len(lines))
        shift = self.nid - k  # expect[k] is the start of the line with id k + shift
        for line in lines:
            if line.startswith(expect[k]):
                tail = line[line.find(mark, plen):]
                code = tails_get(tail)
                if code is None:
                    code = new_tail(tail, line)
                    if code < 0:
                        others.append(len(codes))
                        continue
                append(code)
                k += 1
            else:
                others.append(len(codes))
                k += other(line, len(codes), len(codes) + len(others))
                if k >= len(expect) - 1:  # a repeat record jumped past the prefixes made
                    nid = k + shift
                    expect, k = _id_prefixes(version, nid, len(lines))
                    shift = nid - k
        self.nid = k + shift

    def _damaged(self, line: bytes) -> None:
        if not (self.truncated and self.last):  # a cut-off last line is expected
            self.trace.damaged_lines += 1

    def _new_tail(self, tail: bytes, line: bytes) -> int:
        """Intern a tail not seen before; -1 when the line is damaged."""
        rec = parse_line(line)
        if not isinstance(rec, dict):
            self._damaged(line)
            return -1
        tail_rec = parse_line(b"{" + tail) if tail.startswith(_TAIL_MARKS[self.version]) \
            else None
        head = self.head
        if (not isinstance(tail_rec, dict) or list(rec)[:len(head)] != head
                or list(rec)[len(head):] != list(tail_rec)
                or not set(tail_rec) <= _TAIL_FIELDS
                or tail_rec.get("state", schema.PENDING) not in STATES):
            raise NotCompact("collective line outside the writer's layout")
        try:  # a site named before its record: a lost line, read record by record
            tail_rec = with_site(tail_rec, self.fold.sites)
        except (KeyError, TypeError):
            raise NotCompact("collective line naming no site") from None
        if "stack" in tail_rec and not (is_int(tail_rec["stack"])
                                        and tail_rec["stack"] in self.stacks):
            raise NotCompact("collective line naming no stack")
        try:
            proto = collective_from(self.trace.rank, {**tail_rec, "id": 0}, self.stacks)
        except (KeyError, TypeError, ValueError):
            raise NotCompact("malformed collective") from None
        static = {k: v for k, v in tail_rec.items() if k not in _VARIABLE_TAIL}
        canon = json.dumps(static, sort_keys=True)
        pid = self.proto_ids.get(canon)
        if pid is None:
            pid = self.proto_ids[canon] = len(self.protos)
            proto.state, proto.bucket, proto.p2p_seq = schema.COMPLETED, None, None
            self.protos.append(proto)
        code = self.tails[tail] = len(self.tail_proto)
        self.tail_proto.append(pid)
        self.tail_state.append(str(tail_rec.get("state", schema.PENDING)))
        return code

    def _other(self, line: bytes, count: int, line_no: int) -> int:
        """Fold line ``line_no``, which is not the next collective; returns how many
        collectives it stands for (the members of a ``repeat`` run, else 0)."""
        if line[:len(DONE_PREFIX)] == DONE_PREFIX:
            m = DONE_LINE.match(line)
            if m is not None and self._done(m, line, count, line_no):
                return 0
        if line[:len(_STATE_PREFIX)] == _STATE_PREFIX:
            m = _STATE_LINE.fullmatch(line)
            if m is not None:
                t = m[3]
                self._state(int(m[1]), m[2].decode(), float(t) if b"." in t else int(t),
                            count, line)
                return 0
        rec = parse_line(line)
        if not isinstance(rec, dict):
            self._damaged(line)
            return 0
        kind = rec.get("kind")
        if kind == schema.COLLECTIVE:
            raise NotCompact("collective line out of order or outside the writer's layout")
        if kind == schema.STATE:
            cid = rec.get("id")
            if isinstance(cid, int) and not isinstance(cid, bool):
                self._state(cid, str(rec.get("state")), rec.get("t"), count, line)
            else:
                self._damaged(line)
            return 0
        if kind == schema.STACK and (not is_int(rec.get("id")) or rec["id"] in self.stacks):
            raise NotCompact("stack redefined, or a stack id that is not a number")
        if kind == schema.SITE and (not is_int(rec.get("id")) or rec["id"] in self.fold.sites):
            raise NotCompact("site redefined, or a site id that is not a number")
        if kind == schema.REPEAT:
            if repeat_fields(rec) is None or self.members + rec["n"] > MAX_RUN_MEMBERS:
                self._damaged(line)
                return 0
            self.runs.append((count, rec))
            self.members += rec["n"]
            return rec["n"]
        before = self.fold.last_t
        if kind == schema.DONE:
            self.settle_done()
        if not apply_record(self.trace, rec, self.fold):
            self._damaged(line)
        elif kind == schema.DONE:
            self.best_upto = self.trace.completion.upto
            raw = rec.get(schema.ISSUED)
            runs = [(run[0], len(run[-1]), i) for i, run in enumerate(raw)
                    if isinstance(run, list) and len(run) in (2, 3) and is_int(run[0])
                    and isinstance(run[-1], list)] if isinstance(raw, list) else []
            self.clock.note(count, self.fold.last_t, line_no, runs)
        elif self.fold.last_t != before:
            self.clock.note(count, self.fold.last_t, line_no)
        return 0

    def _done(self, m: re.Match, line: bytes, count: int, line_no: int) -> bool:
        """Fold a ``done`` line of the writer's usual shape (:data:`DONE_LINE`) without
        decoding its issue times (decoded when a collective's time is asked for); False
        when it is not of that shape after all. The run's length is taken as at most
        ``upto - first + 1`` (every id it lists was written before the record), the exact
        one when it is decoded. The completion it states is kept as bytes until
        :meth:`settle_done`."""
        if line.find(b"]", m.end()) != len(line) - 4 or not line.endswith(b"]]]}"):
            return False
        t, upto_text, pending, first_text = m.group(1, 2, 3, 4)
        upto, first = int(upto_text), int(first_text)
        if not (0 <= upto <= count + self.members + 1 and 1 <= first):
            return False  # ids never written: read as a record (and found damaged)
        if upto >= self.best_upto:
            self.best_upto, self.best_pending = upto, pending
        fold, clock = self.fold, self.clock
        when = float(t)
        if when > fold.last_t:
            fold.last_t = when
            clock.counts.append(count)
            clock.times.append(when)
        if upto >= first:
            clock.add_run(first, upto - first + 1, line_no, 0)
        return True

    def settle_done(self) -> None:
        """The completion the ``done`` lines folded by :meth:`_done` state, into the trace."""
        if self.best_pending is not None:
            pending = self.best_pending
            self.trace.completion = Completion(
                self.best_upto, frozenset(map(int, pending.split(b", "))) if pending
                else frozenset(), None)
            self.best_pending = None

    def _state(self, cid: int, word: str, t: Any, count: int, line: bytes) -> None:
        if not 1 <= cid <= count + self.members:  # no such collective yet: damage, as ever
            self._damaged(line)
            return
        self.state_ids.append(cid)
        self.state_words.append(word)
        self.state_t.append(t)


def read_compact(trace: RankTrace, fh: BinaryIO, start: int, truncated: bool,
                 pool: dict[bytes, list[int]] | None = None) -> LineReader:
    """Fill ``trace`` from the open trace file ``fh``, from byte ``start`` (the header line
    already read), its collectives as a :class:`CollectiveLog`; the other records are folded
    as the record-by-record reader folds them. ``pool`` shares identical code lists between
    ranks. Returns the pass over the file (what a class of identical ranks shares, see
    :mod:`ddpdoctor.trace.identical`). Raises :class:`NotCompact` when the file is not in
    the writer's layout."""
    reader = LineReader(trace, truncated)
    tail_codes = reader.read(fh, start)
    tail_proto = reader.tail_proto
    codes = list(map(tail_proto.__getitem__, tail_codes))
    runs = None
    if reader.runs:
        codes, runs = _expand(codes, reader)
    if pool is not None and codes:
        key = array("i", codes).tobytes()
        shared = pool.get(key)
        if shared is None:
            pool[key] = codes
        else:
            codes = shared
    trace.collectives = CollectiveLog(trace.path, trace.rank, codes, tail_codes, reader, runs)
    return reader


def clone(c: Collective) -> Collective:
    """A shallow copy (its lists shared with ``c``: collectives are never changed in place
    once read), without :func:`copy.copy`'s generic protocol."""
    twin = object.__new__(Collective)
    twin.__dict__.update(c.__dict__)
    return twin


def _expand(explicit: list[int], reader: LineReader) -> tuple[list[int], _Runs]:
    """The codes of a capped trace with its runs expanded (list slices, C speed), and the
    runs' bookkeeping. Only for one group and no point-to-point ops, where a collective's
    position in its group is its position in the log; anything else is read record by
    record."""
    protos = reader.protos
    if len({p.group for p in protos}) > 1 or any(is_p2p(p) for p in protos):
        raise NotCompact("capped trace with several groups or point-to-point ops")
    codes: list[int] = []
    runs = _Runs()
    members = prev = 0
    for count, rec in reader.runs:
        codes.extend(explicit[prev:count])
        prev = count
        fields = repeat_fields(rec)
        assert fields is not None  # checked when the record was read
        _, seq, n, back, _ = fields
        if len(codes) != seq - 1 or rec["id"] != seq or rec["id_last"] != seq + n - 1 or \
                (protos and rec["group"] != protos[0].group):
            raise NotCompact("repeat record out of place")
        src = codes[seq - 1 - back:seq - 1 - back + min(n, back)]
        block = src * (n // back) + src[:n % back] if n > back else src
        runs.starts.append(len(codes))
        runs.counts.append(count)
        runs.before.append(members)
        runs.recs.append(rec)
        codes.extend(block)
        members += n
    codes.extend(explicit[prev:])
    return codes, runs
