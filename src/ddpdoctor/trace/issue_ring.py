"""A rank's issue ring: its latest collectives' per-call fields, where a killed rank leaves them.

Next to each trace the rank keeps ``<trace>.ring``, a file it maps and stores into: before it
issues a collective, the issuing thread packs the collective's per-call fields into the next
of :data:`SLOTS` fixed-size slots (a few stores, no line formatted); the writer's look
formats their lines into the trace later, every ``writer.BUSY_LOOK_SECONDS`` at most (and at once
before any other record, so the trace's order is the issue order). A rank killed before a
look leaves in the ring what its trace lacks; :func:`tail_lines` gives readers those
collectives as the lines the writer would have written. The writer removes the file when it
closes the trace (every line written).

Layout, little-endian: a 64-byte head ``<8s H H I q 40x>`` (:data:`MAGIC`, :data:`VERSION`,
slot size, slot count, ``lined``: the last id whose line is in the trace, then reserved),
then the slots. Slot ``id % SLOTS`` holds ``<q d q q q q q q>``: id, issue time, seq, p2p_seq,
iteration, bucket, site, id again. ``seq`` and ``p2p_seq`` are stored as is with 0 for none
(both count from 1), ``bucket`` plus one (0: none), ``site`` the id of the trace's ``site``
record. A slot whose two ids differ was being written when the rank died: it and every later
id are left out. Standard library only: the rank side runs inside every training process.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from itertools import chain

from ddpdoctor.trace import schema

MAGIC = b"DDPRING\x00"
VERSION = 1
SUFFIX = ".ring"
# A power of two. The writer formats the lines itself before the ring would wrap: 32,768 hold a
# second of a loop at 32,000 collectives a second, two looks' worth (2 MB of file per rank).
SLOTS = 32768
MAX_SLOTS = 1 << 20  # a head that claims more is damage
HEAD = struct.Struct("<8sHHIq40x")
SLOT = struct.Struct("<qdqqqqqq")
LINED_AT = 16  # the head's ``lined`` field: its offset
SINCE_VERSION = 10  # the first trace format whose writer keeps a ring


def path_of(trace_path: str) -> str:
    """The ring of the rank writing ``trace_path``."""
    return trace_path + SUFFIX


def size() -> int:
    """Bytes of a ring file."""
    return HEAD.size + SLOTS * SLOT.size


# A collective's line (format 9 on): schema's COLLECTIVE_HEAD and SITE_REF, with ``seq``
# formatted by the caller ("null" for none), then ``p2p_seq`` and ``bucket`` when present.
_HEAD = (f'{{"id": %d, "kind": "{schema.COLLECTIVE}", "seq": %s, "iteration": %d, '
         f'"{schema.SITE_REF}": %d')
_PLAIN = _HEAD + "}"
_PLAIN_LINE = _PLAIN + "\n"
_BUCKET = _HEAD + ', "bucket": %d}'


def collective_line(cid: int, seq: int | None, iteration: int, site: int,
                    p2p_seq: int | None, bucket: int | None) -> str:
    """A collective's line as the writer writes it, without its newline."""
    extra = ""
    if p2p_seq is not None:
        extra = f', "p2p_seq": {p2p_seq}'
    if bucket is not None:
        extra += f', "bucket": {bucket}'
    return _HEAD % (cid, "null" if seq is None else seq, iteration, site) + extra + "}"


def collective_text(ids: Sequence[int], seqs: Sequence[int], p2p_seqs: Sequence[int],
                    iterations: Sequence[int], buckets: Sequence[int],
                    sites: Sequence[int]) -> str:
    """The lines (:func:`collective_line`) of many collectives, each ending in a newline,
    given column by column as their slots hold them (``seq``, ``p2p_seq`` 0 for none,
    ``bucket`` plus one). The writer's look formats its lines here, except a capped trace's
    while it folds runs (one by one, with :func:`collective_line`). The usual lines, of
    collectives with a sequence number and neither ``p2p_seq`` nor ``bucket``, are one ``%``
    over all their fields: 290 ns a line in one process, against 370 for a ``%`` per line
    joined (bench/RESULTS.md, session 44)."""
    if 0 not in seqs and not any(p2p_seqs):
        if not any(buckets):
            return (_PLAIN_LINE * len(ids)) % tuple(
                chain.from_iterable(zip(ids, seqs, iterations, sites)))
        lines = [_BUCKET % (cid, seq, it, site, bucket - 1) if bucket else
                 _PLAIN % (cid, seq, it, site)
                 for cid, seq, it, site, bucket in zip(ids, seqs, iterations, sites, buckets)]
    else:
        lines = [collective_line(cid, seq or None, it, site, p2p or None,
                                 bucket - 1 if bucket else None)
                 for cid, seq, p2p, it, bucket, site in zip(ids, seqs, p2p_seqs, iterations,
                                                              buckets, sites)]
    return "\n".join(lines) + "\n" if lines else ""


def _slots(data: bytes, after: int) -> Iterator[tuple[int, ...]]:
    """The whole slots of ``data`` (a ring file's bytes) with ids above ``after``."""
    for offset in range(HEAD.size, len(data) - SLOT.size + 1, SLOT.size):
        fields = SLOT.unpack_from(data, offset)
        if fields[0] > after and fields[0] == fields[-1]:
            yield fields


def tail_lines(trace_path: str, after: int) -> list[str]:
    """The lines of the collectives the ring of ``trace_path`` holds beyond the trace:
    consecutive ids from ``after + 1`` (and past the ring's own ``lined``), in issue order;
    none when there is no ring, or it is no ring of this format."""
    try:
        with open(path_of(trace_path), "rb") as fh:
            data = fh.read(HEAD.size)
            if len(data) < HEAD.size:
                return []
            magic, version, slot_size, slots, lined = HEAD.unpack(data)
            if magic != MAGIC or version != VERSION or slot_size != SLOT.size or \
                    not 0 < slots <= MAX_SLOTS:
                return []
            data += fh.read(slots * SLOT.size)  # the count its writer made it with
    except OSError:
        return []
    start = max(after, lined)
    found = {fields[0]: fields for fields in _slots(data, start)}
    out = []
    cid = start + 1
    while cid in found:  # a gap: a slot torn, or overwritten since
        _, _t, seq, p2p_seq, iteration, bucket, site, _ = found[cid]
        out.append(collective_line(cid, seq or None, iteration, site, p2p_seq or None,
                                   bucket - 1 if bucket else None))
        cid += 1
    return out


def remove(trace_path: str) -> None:
    """Delete the ring of ``trace_path`` (its trace holds every line); nothing if none."""
    try:
        os.unlink(path_of(trace_path))
    except OSError:
        pass
