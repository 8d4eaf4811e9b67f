"""Trace records: a trace file's lines, decoded and folded into a rank's trace.

Both reading paths go through here: :mod:`ddpdoctor.trace.reader` decodes every line with
:func:`parse_line` and folds it with :func:`apply_record`; the fast path of
:mod:`ddpdoctor.trace.compact` decodes only the lines it cannot intern and folds those the same
way. :func:`line_chunks` is how both read a file (bounded memory, damage-tolerant), and
:func:`collective_from` is the one place a ``collective`` record becomes a
:class:`~ddpdoctor.trace.model.Collective`. JSON only: nothing is unpickled or evaluated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeGuard

from ddpdoctor.trace import ops, schema
from ddpdoctor.trace.basics import numel
from ddpdoctor.trace.model import (
    Collective,
    Completion,
    Group,
    RankTrace,
    Site,
    site_from,
)

STATES = frozenset({schema.PENDING, schema.COMPLETED, schema.FAILED})


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool (JSON ``true`` is not a number here)."""
    return isinstance(value, int) and not isinstance(value, bool)


# Bytes read at a time: memory stays bounded whatever the file size. Small enough that the
# buffers of one chunk are reused by the next: the launcher reads every rank's trace at the end
# of each job, and in a fresh process a chunk of 8 MB cost it ~0.1 µs of CPU per collective
# and rank more in page faults (bench/RESULTS.md, session 46).
CHUNK = 256 * 1024
MAX_LINE = 4 * 1024 * 1024  # a longer line is damage: never held whole
MAX_SKIP = 64 * 1024 * 1024  # this many bytes without a line end: the rest is not read


def line_chunks(fh: BinaryIO) -> Iterator[tuple[list[bytes | None], bool]]:
    """The file's lines, :data:`CHUNK` bytes at a time: each chunk's complete lines, then the
    cut-off last line (no newline) alone with True. A line longer than :data:`MAX_LINE` comes
    as None, its bytes skipped, never held whole; after :data:`MAX_SKIP` bytes without a line
    end, a None and nothing more. Both reading paths read files through this."""
    rest, skipping, skipped = b"", False, 0
    while True:
        data = fh.read(CHUNK)
        if not data:
            break
        lines: list[bytes | None] = list((rest + data).split(b"\n"))
        rest = lines.pop() or b""
        if skipping and lines:  # the first line end closes the overlong line
            lines[0], skipping = None, False
        if len(rest) > MAX_LINE:
            rest, skipping = b"", True
            skipped += len(data)
            if skipped > MAX_SKIP:  # megabytes without a line end: not a trace any more
                yield lines + [None], False
                return
        else:
            skipped = 0
        if lines:
            yield lines, False
    if skipping:
        yield [None], True
    elif rest:
        yield [rest], True


def parse_line(raw: bytes) -> object:
    """The decoded JSON of one line; None when it is not JSON (or too long to be a record)."""
    if len(raw) > MAX_LINE:
        return None
    if raw.startswith(_GROUP_LINE):
        return _parse_group(raw)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


# Every rank of a job records its groups' member lists, the default group's holding every
# rank: at 16,384 ranks that is 16,384 numbers on every rank's line, and decoding, checking and
# keeping a list per rank costs the whole job's square. Lists written alike are decoded once
# and shared by every rank that wrote them (they are never changed).
_GROUP_LINE = b'{"kind": "%s", ' % schema.GROUP.encode()
_RANKS_KEY = b'"ranks": ['
_MEMBER_LISTS: dict[bytes, list[int] | None] = {}  # the list's text -> the list, None if bad
_SHARED_LISTS: set[int] = set()  # ids of the lists in _MEMBER_LISTS, checked already
_MAX_MEMBER_LISTS = 64
_MISSING: Any = object()


def _parse_group(raw: bytes) -> object:
    begin = raw.find(_RANKS_KEY)
    end = raw.find(b"]", begin) + 1 if begin >= 0 else 0
    if end <= 0 or end - begin < 4096:  # a short list: decoded as it is
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
    text = raw[begin + len(_RANKS_KEY) - 1:end]
    members = _MEMBER_LISTS.get(text, _MISSING)
    if members is _MISSING:
        try:
            value = json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError):
            value = None
        members = value if isinstance(value, list) and \
            all(is_int(r) and 0 <= r < MAX_RANKS for r in value) else None
        if len(_MEMBER_LISTS) >= _MAX_MEMBER_LISTS:
            _MEMBER_LISTS.clear()
            _SHARED_LISTS.clear()
        _MEMBER_LISTS[text] = members
        if members is not None:
            _SHARED_LISTS.add(id(members))
    try:
        rec = json.loads(raw[:begin + len(_RANKS_KEY) - 1] + b"0" + raw[end:])
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if isinstance(rec, dict) and "ranks" in rec:
        rec["ranks"] = members if members is not None else "damaged"
    return rec


@dataclass
class Fold:
    """What folding a rank's records needs besides its trace: the call stacks defined so far
    and, when collective records are folded here (record-by-record reading), the rank's
    collectives in file order, by id and by position in their group (gaps None)."""

    stacks: dict[int, list[Site]] = field(default_factory=dict)
    sites: dict[int, dict] = field(default_factory=dict)  # version 9: static parts by site id
    collectives: list[Collective] | None = None  # None: collective records are not folded
    by_id: dict[int, Collective] = field(default_factory=dict)
    by_group: dict[str, list[Collective | None]] = field(default_factory=dict)
    last_t: float = 0.0  # the latest time known so far (see :func:`clock_time`)
    partial: bool = False  # another node's detail (trace/detail.py): it starts mid-run


MAX_THREAD_ERRORS = 16  # thread deaths kept per rank (a thread pool failing in a loop)


def apply_record(trace: RankTrace, rec: dict, fold: Fold) -> bool:
    """Fold one record into ``trace``; False when the record is malformed (or a collective or
    ``repeat`` record where ``fold`` does not collect collectives)."""
    kind = rec.get("kind")
    stacks, colls = fold.stacks, fold.collectives
    try:
        if kind == schema.COLLECTIVE:
            if colls is None:
                return False
            rec = with_site(rec, fold.sites)
            c = collective_from(trace.rank, rec, stacks)
            if "t" not in rec:  # format 4: the issue time comes with a later done record
                c.t = fold.last_t
            if c.state not in STATES:
                return False
            damaged = ("stack" in rec and rec["stack"] not in stacks) or \
                (colls and c.id != colls[-1].id + 1 and not fold.partial)
            known = len(fold.by_group.get(c.group, ()))
            if not place(fold.by_group, c, MAX_POSITIONS if fold.partial else MAX_GAP):
                return False
            damaged = damaged or (is_int(c.seq) and c.seq > known + 1 and not fold.partial)
            if damaged:  # a lost line before it, or a reference to nothing: kept, counted
                trace.damaged_lines += 1
            colls.append(c)
            fold.by_id[c.id] = c
        elif kind == schema.REPEAT:
            return colls is not None and expand_repeat(trace.rank, rec, fold)
        elif kind == schema.CAP:
            if not (is_int(rec.get("bytes")) and is_int(rec.get("max_bytes"))):
                return False
            trace.cap = rec
        elif kind == schema.DONE:
            done = completion_of(rec)
            if done.upto >= trace.completion.upto:
                trace.completion = done
            if colls is not None:
                for first, times in issued_of(rec):
                    for issued_id, issued in enumerate(times, start=first):
                        listed = fold.by_id.get(issued_id)
                        if listed is not None:
                            listed.t = issued
        elif kind == schema.ACTIVITY:
            trace.activity = rec
        elif kind == schema.STATE:
            cid = rec.get("id")
            target = fold.by_id.get(cid) if is_int(cid) else None
            if target is None:
                return False
            target.state = str(rec.get("state"))
            target.t_end = rec.get("t")
        elif kind == schema.STACK:
            frames = rec.get("frames", [])
            if not is_int(rec["id"]) or not isinstance(frames, list):
                return False
            stacks[rec["id"]] = [site_from(f) for f in frames]
        elif kind == schema.SITE:
            static = site_fields(rec)
            if static is None:
                return False
            fold.sites[rec["id"]] = static
        elif kind == schema.GROUP:
            members = rec.get("ranks", [])
            if not isinstance(rec["group"], str) or not isinstance(members, list) or \
                    id(members) not in _SHARED_LISTS and \
                    not all(is_int(r) and 0 <= r < MAX_RANKS for r in members):
                return False
            trace.groups[rec["group"]] = Group(rec["group"], str(rec.get("desc", "")), members)
        elif kind == schema.PROCESS_START:
            if not all(rec.get(k) is None or is_int(rec[k]) and 0 <= rec[k] < MAX_ID
                       for k in ("pid", "world_size", "rank", "local_rank")):
                return False
            trace.process = rec
        elif kind == schema.DDP_INIT:
            trace.ddp.append(rec)
        elif kind == schema.EXCEPTION:
            if not _timed(rec) or not isinstance(rec.get("frames", []), list):
                return False
            trace.exception = rec
        elif kind == schema.HANG:
            trace.hang = rec
        elif kind == schema.EXIT:
            if not _timed(rec) or not isinstance(rec.get("status"), str) or \
                    not (rec.get("code") is None or is_int(rec["code"])):
                return False
            trace.exit = rec
        elif kind == schema.WARNING:
            trace.warnings.append(str(rec.get("message", "")))
            if rec.get("lost") is True:  # the rank stopped recording a group: a cut trace
                trace.cut = True
                trace.lost = str(rec.get("message", ""))
        elif kind == schema.INIT:
            trace.init = str(rec.get("state"))
        elif kind == schema.THREAD_EXCEPTION:
            if not isinstance(rec.get("frames", []), list):
                return False
            if len(trace.thread_errors) < MAX_THREAD_ERRORS:
                trace.thread_errors.append(rec)
        elif kind in (schema.PROGRESS, schema.HEADER, schema.PEERS):
            pass
        else:
            return False  # unknown kinds of this version are damage; newer versions are refused
    except (KeyError, TypeError, ValueError):
        return False
    clock = clock_time(rec)
    if clock is not None:
        fold.last_t = max(fold.last_t, clock)
    return True


def _timed(rec: dict) -> bool:
    """Whether a record's ``t``, when it has one, is a number."""
    t = rec.get("t", 0)
    return type(t) in _NUMBER_TYPES


_CLOCK_KINDS = frozenset({schema.DONE, schema.ACTIVITY, schema.PROCESS_START})


def clock_time(rec: dict) -> float | None:
    """The time of a record that tells how far a rank's clock got (``done``, ``activity``,
    ``process_start``), else None. In format 4 a collective whose issue time never reached a
    ``done`` record (the rank was killed within the writer's interval) is given the latest
    such time before its line: at most the interval too early."""
    t = rec.get("t")
    if rec.get("kind") in _CLOCK_KINDS and isinstance(t, (int, float)) \
            and not isinstance(t, bool):
        return float(t)
    return None


def issued_run(run: object) -> tuple[int, list[float]] | None:
    """One entry of a ``done`` record's ``issued``, ``(first id, issue times)``; None when
    malformed. Format 9 writes ``[first id, first issue time, [µs after it, ...]]``, formats
    4 to 8 ``[first id, [issue time, ...]]``."""
    if not (isinstance(run, list) and len(run) in (2, 3) and is_int(run[0])
            and 0 < run[0] < MAX_ID and isinstance(run[-1], list)
            and set(map(type, run[-1])) <= _NUMBER_TYPES):
        return None
    if len(run) == 2:
        return run[0], list(map(float, run[1]))
    base = run[1]
    if type(base) not in _NUMBER_TYPES:
        return None
    return run[0], [base + us / 1e6 for us in run[2]]


_NUMBER_TYPES = {int, float}  # what json.loads makes of a number (bool is a type of its own)


def issued_of(rec: dict) -> list[tuple[int, list[float]]]:
    """The ``issued`` runs of a ``done`` record, the malformed ones left out."""
    runs = rec.get(schema.ISSUED)
    if not isinstance(runs, list):
        return []
    return [r for r in map(issued_run, runs) if r is not None]


def completion_of(rec: dict) -> Completion:
    """The :class:`Completion` a ``done`` record states (raises TypeError or ValueError)."""
    upto, pending, start = rec["upto"], rec.get("pending", []), rec.get("pending_from")
    if not is_int(upto) or not isinstance(pending, list) or \
            not all(is_int(i) and 0 < i < MAX_ID for i in pending) or \
            not (start is None or is_int(start) and 0 < start < MAX_ID) or \
            not 0 <= upto < MAX_ID:
        raise TypeError("malformed done record")
    return Completion(upto, frozenset(pending), start)


MAX_ID = 1 << 53  # ids, sequence numbers and counts beyond this are damage, not a long job
MAX_RANKS = 1 << 24  # a rank number beyond this is damage
# Collectives a trace's repeat runs may stand for, in all (a list of codes of this length is
# 256 MB; the record-by-record reader builds an object per member and stops at a 16th of it).
MAX_RUN_MEMBERS = 1 << 25
_MAX_TENSORS = 1 << 16  # tensors in one collective's list
# What a tensor's dtype is called in a trace: torch's dtype names without "torch." (float32,
# bfloat16, float8_e4m3fn, uint16, complex64, qint8, quint4x2, bits8, bool). Anything else is a
# damaged record, never a dtype that differs from a peer's.
_DTYPE = re.compile(r"(?:bool|(?:u?int|float|bfloat|complex|bits|qu?int)\d{1,3}[a-z0-9_]*)")


def _optional_count(rec: dict, name: str, least: int = 0) -> None:
    value = rec.get(name)
    if value is not None and not (is_int(value) and least <= value < MAX_ID):
        raise ValueError(f"{name}: {value!r}")


def check_collective(rec: dict) -> None:
    """Raise TypeError or ValueError when a ``collective`` record's fields are not of their
    types and ranges (a damaged line, never a collective that seems to differ): a known op,
    names that are strings, counts that are ints in range, shapes of non-negative ints whose
    element count is ``numel``."""
    if rec.get("op") not in ops.BY_NAME:
        raise ValueError(f"op: {rec.get('op')!r}")
    for name in ("group", "label"):
        if not isinstance(rec.get(name, ""), str):
            raise TypeError(name)
    for name in ("reduce_op", "api"):
        if rec.get(name) is not None and not isinstance(rec[name], str):
            raise TypeError(name)
    if rec.get("reduce_op") is not None and rec["reduce_op"] not in ops.REDUCE_OPS:
        raise ValueError("reduce_op")
    for name in ("seq", "p2p_seq"):
        _optional_count(rec, name, least=1)
    for name in ("id", "iteration", "bucket", "root", "peer", "stack"):
        _optional_count(rec, name)
    shapes, dtypes = rec.get("shapes", []), rec.get("dtypes", [])
    if not isinstance(shapes, list) or not isinstance(dtypes, list) or \
            len(shapes) > _MAX_TENSORS or len(dtypes) != len(shapes):
        raise TypeError("shapes")
    for shape in shapes:
        if not isinstance(shape, list) or len(shape) > 64 or \
                not all(is_int(d) and 0 <= d < MAX_ID for d in shape):
            raise TypeError("shape")
    total = numel(shapes)
    if not all(isinstance(d, str) and _DTYPE.fullmatch(d) for d in dtypes):
        raise ValueError("dtypes")
    if rec.get("numel", total) != total:
        raise ValueError("numel")


_STATIC_FIELDS = frozenset(schema.COLLECTIVE_STATIC)


def site_fields(rec: dict) -> dict | None:
    """The static part a ``site`` record holds (checked with the collective that names it,
    :func:`check_collective`); None when its id is no number or it holds other fields."""
    static = {k: v for k, v in rec.items() if k != "kind" and k != "id"}
    if not is_int(rec.get("id")) or not static.keys() <= _STATIC_FIELDS:
        return None
    return static


def with_site(rec: dict, sites: dict[int, dict]) -> dict:
    """A collective record with the static part of the site it names (version 9) in place of
    the name; one that names none, as it is. KeyError when the site was not defined before
    it (its line lost), TypeError when the name is no number."""
    ref = rec.get(schema.SITE_REF)
    if ref is None:
        return rec
    if not is_int(ref):
        raise TypeError("site")
    out = dict(sites[ref])
    out.update(rec)
    del out[schema.SITE_REF]
    return out


def collective_from(rank: int, rec: dict, stacks: dict[int, list[Site]]) -> Collective:
    """A :class:`Collective` from a decoded ``collective`` record (raises KeyError, TypeError or
    ValueError on a malformed one, see :func:`check_collective`). The one place both reading
    paths build collectives. A record without ``state`` is pending: from format 9 the line,
    written before the collective runs, leaves it out."""
    check_collective(rec)
    return Collective(
        rank=rank, id=int(rec["id"]), group=str(rec["group"]), seq=rec.get("seq"),
        op=str(rec["op"]), label=str(rec.get("label", "user")),
        shapes=list(rec.get("shapes", [])), dtypes=list(rec.get("dtypes", [])),
        numel=int(rec.get("numel", 0)), reduce_op=rec.get("reduce_op"),
        root=rec.get("root"), peer=rec.get("peer"), p2p_seq=rec.get("p2p_seq"),
        api=rec.get("api"), bucket=rec.get("bucket"), iteration=rec.get("iteration"),
        t=float(rec.get("t", 0.0)), state=str(rec.get("state", schema.PENDING)),
        stack=stacks.get(rec.get("stack", -1), []), sends=_counts(rec.get("sends")),
        recvs=_counts(rec.get("recvs")), row=_count(rec.get("row")), tag=_count(rec.get("tag")))


def _count(value: object) -> int | None:
    """An int field of format 7 (``row``, ``tag``); None when absent or not an int."""
    return value if type(value) is int else None


def _counts(value: object) -> tuple[int, ...] | None:
    """``sends`` / ``recvs`` as a tuple of ints; None when absent or malformed."""
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        return None
    return tuple(value)


def is_p2p(c: Collective) -> bool:
    """Point-to-point: the recording group gives these a ``p2p_seq`` instead of a ``seq``."""
    return c.peer is not None or c.op in ops.P2P


def repeat_fields(rec: dict) -> tuple[str, int, int, int, int] | None:
    """(group, seq, n, back, iteration_delta) of a well-formed ``repeat`` record, else None."""
    try:
        fields = (str(rec["group"]), rec["seq"], rec["n"], rec["back"], rec["iteration_delta"])
        ints = fields[1:] + (rec["id"], rec["id_last"])
        float(rec["t"]), float(rec["t_last"])
    except (KeyError, TypeError, ValueError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        return None
    _, seq, n, back, _ = fields
    span = float(rec["t_last"]) - float(rec["t"])
    # A run's members were issued one by one: no faster than one a microsecond (a damaged n
    # of 10**12 would otherwise be expanded), and no more than MAX_RUN_MEMBERS in a trace.
    if not (1 <= n <= min(MAX_RUN_MEMBERS, span * 1e6 + 1) and 1 <= back < seq < MAX_ID):
        return None
    return fields


def run_member(rank: int, rec: dict, off: int, src: Collective,
               iteration: int | None) -> Collective:
    """Member ``off`` of a ``repeat`` run: ``src``'s static part at the run's position, with
    the run's iteration, its id (exact when the run's ids are consecutive) and an interpolated
    time."""
    n, id0 = rec["n"], rec["id"]
    t0, t1 = float(rec["t"]), float(rec["t_last"])
    return Collective(
        rank=rank, id=id0 + off if rec["id_last"] - id0 == n - 1 else id0, group=src.group,
        seq=rec["seq"] + off, op=src.op, label=src.label, shapes=src.shapes, dtypes=src.dtypes,
        numel=src.numel, reduce_op=src.reduce_op, root=src.root, peer=src.peer, api=src.api,
        bucket=src.bucket, iteration=iteration, t=t0 + (t1 - t0) * off / (n - 1) if n > 1 else t0,
        state=schema.COMPLETED, stack=src.stack, sends=src.sends, recvs=src.recvs, row=src.row,
        tag=src.tag)


def expand_repeat(rank: int, rec: dict, fold: Fold) -> bool:
    """Append the members of a ``repeat`` run to ``fold``'s collectives (record-by-record
    reading). False when malformed."""
    fields = repeat_fields(rec)
    if fields is None or fold.collectives is None:
        return False
    name, seq, n, back, delta = fields
    if len(fold.collectives) + n > MAX_RUN_MEMBERS // 16:
        return False
    lst = fold.by_group.get(name)
    if lst is None or len(lst) != seq - 1 or \
            any(c is None for c in lst[seq - 1 - back:seq - 1 - back + min(n, back)]):
        return False
    for off in range(n):
        src = lst[seq - 1 + off - back]
        assert src is not None  # checked above: a run copies known collectives only
        it = src.iteration + delta if isinstance(src.iteration, int) else None
        c = run_member(rank, rec, off, src, it)
        fold.collectives.append(c)
        lst.append(c)
    return True


MAX_GAP = 1 << 16  # a sequence number this far past the collectives before it is damage
# A position beyond this is damage even where a trace may start mid-run (another node's
# detail): its positions before are held as None.
MAX_POSITIONS = 1 << 24


def place(by_group: dict[str, list[Collective | None]], c: Collective,
          max_gap: int = MAX_GAP) -> bool:
    """Put ``c`` at its position in ``by_group`` (gaps None; a repeated seq keeps the first).
    False for a seq more than ``max_gap`` beyond the group's collectives so far: damage, not
    a position."""
    seq = c.seq
    if seq is None or seq.__class__ is not int or seq < 1:
        return True
    lst = by_group.setdefault(c.group, [])
    if seq > len(lst) + max_gap or seq > MAX_POSITIONS:
        return False
    if seq > len(lst):
        lst.extend([None] * (seq - 1 - len(lst)))
        lst.append(c)
    return True
