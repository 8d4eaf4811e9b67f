"""Ranks whose collective lines are byte for byte the same, read by comparing bytes (format 4).

A format-4 collective line carries neither the rank nor a time, so ranks that issued the same
collectives from the same lines wrote the same collective, ``stack`` and (format 9) ``site``
lines; only their own records (``done``, ``activity``, ``exit``, ..., every line that begins
with ``{"kind": ``) differ. The first rank of such a class is read in full
(:func:`~ddpdoctor.trace.compact.read_compact`) and kept (:class:`Shared`, a few per
process); a later rank's file, mapped rather than read, is compared with the class's lines
block by block (:meth:`RankClass.own_records`: memcmp, no pass over its lines), and when every
other line is the class's, the rank is built from its own records alone (:func:`_member_log`;
the ``done`` records taken apart by C-level maps, :func:`_fold_in_bulk`) and decodes its
collectives through the first rank's log, with its own issue times, completion and ends.
Anything that does not hold is read in full. The traces and reports are the same as the
record-by-record reader's (``tests/unit/test_compact_reader.py``), with one difference known
and accepted: a ``done`` record of the writer's shape whose issue times are not valid JSON
numbers (only a hand-edited file has one) still counts here for its completion; that reader
drops the whole line.
"""

from __future__ import annotations

import itertools
import math
import mmap
import zlib
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from itertools import accumulate, compress, repeat
from operator import add, ge, itemgetter, le, methodcaller, not_, sub
from typing import BinaryIO

from ddpdoctor.trace import schema, shared_ref
from ddpdoctor.trace.compact import (
    BLOCK,
    DONE_LINE,
    DONE_PREFIX,
    CollectiveLog,
    LineReader,
    NotCompact,
    read_compact,
)
from ddpdoctor.trace.model import RankTrace
from ddpdoctor.trace.padding import file_size
from ddpdoctor.trace.records import Fold
from ddpdoctor.trace.shared_ref import BadMember, NeedsClass, SharedRef


@dataclass
class RankClass:
    """Ranks whose collective, ``stack`` and ``site`` lines are byte for byte the same
    (format 4): what the first of them read, which the others share."""

    common: bytes  # those lines, in order
    starts: array  # the byte offset of each in ``common``, then len(common)
    record_lines: list[int]  # which of them are stack or site records
    reader: LineReader  # the first rank's pass: tails, prototypes, stacks, tail codes
    log: CollectiveLog  # the first rank's, which decodes for all
    path: str = ""  # the file of the first rank
    _crc: int | None = None

    def crc(self) -> int:
        """CRC-32 of the class's lines (what a member file's ``shared`` record names)."""
        if self._crc is None:
            self._crc = zlib.crc32(self.common)
        return self._crc

    def ref(self, name: str) -> SharedRef:
        """The ``shared`` record of a member of this class whose folder holds its lines in
        the file ``name``."""
        return SharedRef(name, len(self.starts) - 1, len(self.common), self.crc())

    def own_records(self, data: bytes | mmap.mmap, start: int) -> list[tuple[int, bytes]] | None:
        """The records of its own in the file ``data`` (from byte ``start``), each with the
        number of this class's lines before it, when every other line of the file is this
        class's line, in order; else None.

        The file is compared with the class's lines block by block (memcmp): a block of
        lines that matches is skipped whole; where a block does not, the first line that
        differs is found by halving it and must be a record of the rank's own (a ``done``
        record, mostly). The next block is as long as the last stretch between two own
        records (the writer's records come at a steady pace), so a file is usually read
        with two comparisons per own record, never a pass over each line."""
        with memoryview(data) as view:
            return self._own_records(data, view, start)

    def _own_records(self, data: bytes | mmap.mmap, view: memoryview,
                     start: int) -> list[tuple[int, bytes]] | None:
        # The hot loop of reading a large run: the checks are written out, not called.
        starts, same = self.starts, self.common.startswith
        total = len(starts) - 1
        size = len(data)
        find = data.find
        own: list[tuple[int, bytes]] = []
        pos, li, gap = start, 0, 64
        while True:
            while find(_RANK_RECORD, pos, pos + _RANK_LEN) == pos:  # the rank's own records
                end = find(b"\n", pos)
                if end < 0:
                    return None
                line = data[pos:end]
                if line.startswith(_CLASS_RECORDS):  # a class line
                    break
                own.append((li, line))
                pos = end + 1
            if li == total:
                return own if pos == size else None
            lo, hi = li, min(li + gap, total)  # class lines before lo are the file's at pos
            while True:
                n = starts[hi] - starts[lo]
                if pos + n <= size and same(view[pos:pos + n], starts[lo]):
                    pos += n
                    lo = hi
                    if lo == total or find(_RANK_RECORD, pos, pos + _RANK_LEN) == pos:
                        break
                    hi = min(lo + lo - li, total)
                    continue
                while hi - lo > 1:  # lines lo..hi-1 hold the first that differs
                    mid = (lo + hi) // 2
                    n = starts[mid] - starts[lo]
                    if pos + n <= size and same(view[pos:pos + n], starts[lo]):
                        pos += n
                        lo = mid
                    else:
                        hi = mid
                break
            if lo == li:
                return None  # a line that is neither the class's nor the rank's own
            gap, li = lo - li, lo


@dataclass
class Shared:
    """What the ranks read by one process share: identical code lists, and (format 4) the
    last few classes of byte-identical ranks, whose later members are read without a pass
    over their lines."""

    codes: dict[bytes, list[int]] = field(default_factory=dict)
    classes: list[RankClass] = field(default_factory=list)
    by_path: dict[str, RankClass] = field(default_factory=dict)  # files read as a class's

    def class_of(self, data: bytes | mmap.mmap, start: int) -> tuple[RankClass, list] | None:
        """The class whose lines the file ``data`` holds, with the file's own records."""
        for cls in self.classes:
            own = cls.own_records(data, start)
            if own is not None:
                return cls, own
        return None

    def remember(self, path: str, cls: RankClass) -> None:
        """The file ``path`` holds ``cls``'s lines (member files of its folder name it): the
        last :data:`MAX_PATHS` files are kept (a member is read close to its file; one read
        after it was forgotten reads the file again)."""
        self.by_path[path] = cls
        if len(self.by_path) > MAX_PATHS:
            del self.by_path[next(iter(self.by_path))]

    def room(self, size: int) -> bool:
        """Make room for a class of ``size`` bytes, the oldest classes given up for it;
        False when it cannot be kept at all."""
        if size > MAX_CLASS_BYTES:
            return False
        while self.classes and (len(self.classes) >= MAX_CLASSES or size + sum(
                len(c.common) for c in self.classes) > MAX_CLASS_BYTES):
            gone = self.classes.pop(0)
            self.by_path = {p: c for p, c in self.by_path.items() if c is not gone}
        return True


MAX_CLASSES = 4  # classes kept at once (each holds its lines' bytes)
MAX_PATHS = 64  # files remembered as holding a class's lines
MAX_CLASS_BYTES = 64 * 1024 * 1024  # and the bytes they hold, at most
# A larger file is read in chunks, never whole: a class holds its lines' bytes, and a file is
# mapped while it is compared, so memory would grow with the file (8 ranks × 200,000
# collectives, 54 MB a file: 90 MB read in chunks, 220 MB through classes).
BULK_MAX = 32 * 1024 * 1024


Membership = tuple[RankClass, list[tuple[int, bytes]]]  # a class, and a member's own records


def read_shared(trace: RankTrace, fh: BinaryIO, start: int, truncated: bool,
                pool: Shared) -> Membership | None:
    """Fill ``trace`` (format 4) from the open trace file ``fh``, from byte ``start``, as
    :func:`~ddpdoctor.trace.compact.read_compact` does: from its own records alone when its
    other lines are a known class's (or, a member file of format 8, were left empty for the
    class's file to hold), else by reading it in full (and founding a class). Returns the
    class and the rank's own records when its file holds a known class's lines in full.
    Raises :class:`~ddpdoctor.trace.compact.NotCompact` as that function does,
    :class:`~ddpdoctor.trace.shared_ref.NeedsClass` for a member file read before the file
    that holds its lines, and :class:`~ddpdoctor.trace.shared_ref.BadMember` for one whose
    lines cannot be joined back."""
    size = file_size(fh)
    if truncated or not start < size <= BULK_MAX:
        read_compact(trace, fh, start, truncated, pool.codes)
        return None
    # Mapped, not read: a member of a known class is compared with it in place (a copy of
    # the file would cost more than the comparison). Trace files are only appended to; the
    # mapping ends where the data does (before a killed writer's padding).
    with mmap.mmap(fh.fileno(), size, flags=_MAP_FLAGS, prot=mmap.PROT_READ) as mapped:
        whole = mapped[-1:] == b"\n"  # else the file grew since it was looked at
        ref = shared_ref.find(mapped, size) if whole and trace.version >= 8 else None
        if ref is not None:
            trace.collectives = _read_member(trace, mapped, start, ref[0], ref[1], pool)
            return None
        found = pool.class_of(mapped, start) if whole else None
        if found is not None:
            trace.collectives = _member_log(trace, found[0], found[1], start, mapped)
            pool.remember(trace.path, found[0])
            return found
        mapped.seek(start)
        reader = read_compact(trace, mapped, start, truncated, pool.codes)  # type: ignore[arg-type]
        log = trace.collectives
        assert isinstance(log, CollectiveLog)
        if whole and not log.has_runs and not trace.damaged_lines and \
                pool.room(len(mapped) - start):
            cls = _new_class(mapped, start, reader, log)
            if cls is not None:
                cls.path = trace.path
                pool.classes.append(cls)
                pool.remember(trace.path, cls)
    return None


def _read_member(trace: RankTrace, data: mmap.mmap, start: int, ref: SharedRef, end: int,
                 pool: Shared) -> CollectiveLog:
    """The log of a member file (format 8): its empty lines are the lines of the class read
    from the file ``ref`` names, its other lines (up to byte ``end``, where the ``shared``
    record begins) its own records."""
    held_in = ref.path_beside(trace.path)
    cls = pool.by_path.get(held_in)
    if cls is None:
        raise NeedsClass(held_in)
    if (cls.crc(), len(cls.common), len(cls.starts) - 1) != (ref.crc32, ref.length, ref.lines):
        raise BadMember(f"{trace.path}: its collective lines were kept in {ref.file}, which "
                        f"now holds other lines (it was changed or replaced)")
    lines = data[start:end].split(b"\n")
    lines.pop()  # past the last line end
    own_lines = list(compress(lines, lines))
    if len(lines) - len(own_lines) != ref.lines or \
            not all(map(bytes.startswith, own_lines, repeat(_RANK_RECORD))) or \
            any(map(bytes.startswith, own_lines, repeat(_CLASS_RECORDS))):
        raise BadMember(f"{trace.path}: a member file whose lines do not fit {ref.file}'s "
                        f"(a damaged file)")
    own = list(zip(map(sub, compress(itertools.count(), lines), itertools.count()), own_lines))
    return _member_log(trace, cls, own, start, data, blank=True)


# The records a class of ranks shares with its collective lines: they define what those
# lines name (a call stack; from format 9 a site's static part).
_STACK_LINE = b'{"kind": "stack", '
_SITE_LINE = b'{"kind": "site", '
_CLASS_RECORDS = (_STACK_LINE, _SITE_LINE)
_RANK_RECORD = schema.RANK_RECORD
_RANK_LEN, _STACK_LEN, _SITE_LEN = len(_RANK_RECORD), len(_STACK_LINE), len(_SITE_LINE)
# The whole file is compared: mapping its pages at once costs less than faulting them in.
_MAP_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
_OWN_MARK = b"\n" + _RANK_RECORD


def _new_class(data: mmap.mmap, start: int, reader: LineReader,
               log: CollectiveLog) -> RankClass | None:
    """The class founded by the rank just read in full from ``data`` (from byte ``start``):
    its lines but its own records (``{"kind": `` begins every line but a collective line,
    and no JSON value can hold that text: a quote inside a string is escaped), when the
    reader took every one of them for a collective, a stack or a site record; else None."""
    common, own = class_lines(data, start)
    starts = array("q", [0])
    record_lines: list[int] = []
    end = common.find(b"\n")
    while end >= 0:  # once per class: the offsets its members are read by
        if common.startswith(_CLASS_RECORDS, starts[-1]):
            record_lines.append(len(starts) - 1)
        starts.append(end + 1)
        end = common.find(b"\n", end + 1)
    codes = log.codes
    if len(starts) - 1 - len(record_lines) != len(codes) or \
            len(reader.others) != len(record_lines) + own:
        return None
    return RankClass(common, starts, record_lines, reader, log)


def class_lines(data: bytes | mmap.mmap, start: int) -> tuple[bytes, int]:
    """The lines of the whole file ``data`` from byte ``start`` that a class of ranks shares
    (every line but the rank's own records), joined, and how many own records were left
    out."""
    find = data.find
    own = 0
    with memoryview(data) as view:
        pieces: list[memoryview] = []
        pos = start
        hit = find(_OWN_MARK, start - 1)
        while hit >= 0:
            begin = hit + 1
            if find(_STACK_LINE, begin, begin + _STACK_LEN) == begin or \
                    find(_SITE_LINE, begin, begin + _SITE_LEN) == begin:  # a class line
                hit = find(_OWN_MARK, begin)
                continue
            pieces.append(view[pos:begin])
            own += 1
            pos = find(b"\n", begin) + 1  # the file ends with a line end: checked
            hit = find(_OWN_MARK, pos - 1)
        pieces.append(view[pos:])
        common = b"".join(pieces)
        for piece in pieces:
            piece.release()
    return common, own


def _member_log(trace: RankTrace, cls: RankClass, own: list[tuple[int, bytes]], start: int,
                data: bytes | mmap.mmap, blank: bool = False) -> CollectiveLog:
    """The log of a rank whose collective, stack and site lines are its class's: its ``own``
    records (each after so many class lines) folded at the line numbers they have in its
    file (``data``), the rest shared. ``blank``: the file is a member file, whose class
    lines are empty."""
    first = cls.reader
    reader = LineReader(trace, False)
    reader.stacks, reader.fold = first.stacks, Fold(first.stacks, first.fold.sites)
    reader.tails, reader.tail_proto, reader.tail_state = \
        first.tails, first.tail_proto, first.tail_state
    reader.protos, reader.proto_ids = first.protos, first.proto_ids
    starts, records = cls.starts, cls.record_lines
    lines = [line for _, line in own]
    js = [j for j, _ in own]  # class lines before each
    # Collective lines before each: class lines less the stack and site lines among them
    # (these mostly come early: past the last one, a constant).
    after = bisect_right(js, records[-1]) if records else 0
    counts = [j - bisect_left(records, j) for j in js[:after]] + \
        list(map(sub, js[after:], repeat(len(records))))
    own_lines = array("q", map(add, js, range(1, len(own) + 1)))  # their line numbers
    reader.others.extend(sorted(counts + [k - i for i, k in enumerate(records)]))
    if not _fold_in_bulk(reader, lines, counts, own_lines):
        other, done, match = reader._other, reader._done, DONE_LINE.match
        for line, count, line_no in zip(lines, counts, own_lines):
            m = match(line)
            if (m is None or not done(m, line, count, line_no)) and other(line, count, line_no):
                raise NotCompact("a repeat record: read in full")
    reader.settle_done()
    sizes = list(accumulate((len(line) + 1 for line in lines), initial=0))
    total = len(starts) - 1 + len(own)
    common, sparse = cls.common, reader.sparse
    for k, line_no in enumerate(range(BLOCK, total + 1, BLOCK)):
        p = bisect_left(own_lines, line_no)  # own records before it
        j = line_no - 1 - p  # class lines before it
        offset = start + (j if blank else starts[j]) + sizes[p]
        sparse.append(offset)
        if k % 16 and line_no + BLOCK <= total:
            continue
        # Every 16th offset, and the last, begins the line it should: an own record's or a
        # class line's.
        if p < len(own_lines) and own_lines[p] == line_no:
            head = lines[p][:32]
        elif blank:
            head = b"\n"
        else:
            head = common[starts[j]:min(starts[j] + 32, starts[j + 1] - 1)]
        if data[offset - 1:offset + len(head)] != b"\n" + head:
            raise NotCompact("line offsets out of step")
    return CollectiveLog(trace.path, trace.rank, cls.log.codes, first.codes, reader, None,
                         cls.log)


def _fold_in_bulk(reader: LineReader, lines: list[bytes], counts: list[int],
                  line_nos: array) -> bool:
    """Fold a rank's own records as one pass of :meth:`LineReader._other` and
    :meth:`LineReader._done` over them would, with the ``done`` records (most of them) taken
    apart by C-level maps instead of one at a time; False, having changed nothing, when
    some ``done`` record is not of the writer's usual shape (then they are folded one by
    one)."""
    is_done = list(map(bytes.startswith, lines, repeat(DONE_PREFIX)))
    done = list(compress(lines, is_done))
    matches = list(map(DONE_LINE.match, done))
    if None in matches or not all(map(bytes.endswith, done, repeat(b"]]]}"))) or \
            list(map(bytes.find, done, repeat(b"]"), map(methodcaller("end"), matches))) != \
            [len(line) - 4 for line in done] or \
            any(line.startswith(b'{"kind": "done"')
                for line in compress(lines, map(not_, is_done))):
        return False
    groups = list(map(methodcaller("group", 1, 2, 3, 4), matches))
    uptos = list(map(int, map(itemgetter(1), groups)))
    firsts = list(map(int, map(itemgetter(3), groups)))
    if not all(map(ge, uptos, firsts)):
        return False
    # The rest in order, each one's clock read off the fold (see records.clock_time).
    fold, clock = reader.fold, reader.clock
    times: list[float] = list(map(float, map(itemgetter(0), groups)))
    stamps: list[float] = []
    k = 0
    for line, count, line_no, is_d in zip(lines, counts, line_nos, is_done):
        if is_d:
            stamps.append(times[k])
            k += 1
            continue
        fold.last_t = -math.inf
        if reader._other(line, count, line_no):
            raise NotCompact("a repeat record: read in full")
        stamps.append(fold.last_t)
    clock.counts, clock.times = array("q", counts), array("d", accumulate(stamps, max,
                                                                          initial=0.0))
    del clock.times[0]
    fold.last_t = clock.times[-1] if clock.times else 0.0
    if uptos:
        best = max(uptos)
        if best >= reader.trace.completion.upto:
            reader.best_upto = best
            reader.best_pending = groups[len(uptos) - 1 - uptos[::-1].index(best)][2]
        lengths = [upto - first + 1 for upto, first in zip(uptos, firsts)]
        clock.first, clock.n = array("q", firsts), array("q", lengths)
        clock.lines = array("q", compress(line_nos, is_done))
        clock.index = array("q", bytes(8 * len(firsts)))
        clock.sorted = all(map(le, map(add, firsts, lengths), firsts[1:]))
    return True


def expand_member(path: str, ref: SharedRef) -> bytes:
    """The member file at ``path`` with its empty lines filled from the file ``ref`` names,
    and its ``shared`` record left out: the file as the rank wrote it, for the record-by-record
    reader. Raises :class:`~ddpdoctor.trace.shared_ref.BadMember` when that cannot be done."""
    held_in = ref.path_beside(path)
    try:
        with open(path, "rb") as fh:
            member = fh.read()
        with open(held_in, "rb") as fh:
            held = fh.read()
    except OSError as exc:
        raise BadMember(f"{path}: its collective lines were kept in {ref.file}, which cannot "
                        f"be read ({exc.strerror})") from None
    head_end = held.find(b"\n") + 1
    common, _ = class_lines(held, head_end) if head_end and held.endswith(b"\n") else (b"", 0)
    if (zlib.crc32(common), len(common), common.count(b"\n")) != \
            (ref.crc32, ref.length, ref.lines):
        raise BadMember(f"{path}: its collective lines were kept in {ref.file}, which now "
                        f"holds other lines (it was changed or replaced)")
    return shared_ref.joined(member, member.find(b"\n") + 1, common)
