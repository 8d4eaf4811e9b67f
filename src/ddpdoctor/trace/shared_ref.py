"""The ``shared`` record that ends a member file (trace format 8), and how a reader finds it.

A rank whose collective, ``stack`` and ``site`` lines are byte for byte another rank's (the
usual case: data-parallel ranks issue the same collectives from the same lines) is rewritten by
``ddpdoctor run`` once the job has ended (:mod:`ddpdoctor.trace.shared_lines`): each of those
lines is left empty and the file ends with one record naming the file of the same folder that
holds them, with their count, length and CRC-32, so that a reader can tell the lines it joins
back are the ones that were taken out::

    {"kind": "shared", "file": "rank-0.jsonl", "lines": 10160, "bytes": 2617856,
     "crc32": 3735928559}

(one line in the file).

The rank's own records (``done``, ``activity``, ``exit``, ...) stay where they were, so every
line keeps its number. A file named there that is missing or holds other lines makes the member
unreadable (:class:`BadMember`), never read as a rank with fewer collectives.
"""

from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass

from ddpdoctor.trace import schema

PREFIX = b'{"kind": "%s", ' % schema.SHARED.encode()
_TAIL = 4096  # a shared record is far shorter: the end of a file read to look for one


class BadMember(Exception):
    """A member file whose shared lines cannot be joined back: the message says why."""


class NeedsClass(Exception):
    """A member file read before the file that holds its shared lines: read ``path`` first."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


@dataclass(frozen=True)
class SharedRef:
    """What a member file's last line says of the lines it left empty."""

    file: str  # a file name in the member's own folder
    lines: int  # how many lines were left empty
    length: int  # their bytes, each with its line end
    crc32: int  # zlib.crc32 of those lines, joined in order

    def line(self) -> bytes:
        """The record as the last line of a member file (with its line end)."""
        return json.dumps({"kind": schema.SHARED, "file": self.file, "lines": self.lines,
                           "bytes": self.length, "crc32": self.crc32}).encode() + b"\n"

    def path_beside(self, member: str) -> str:
        """The path of the file holding the lines, in the folder of the file ``member``."""
        return os.path.join(os.path.dirname(member), self.file)


def parse(line: bytes) -> SharedRef | None:
    """The reference in ``line`` (without its line end) when it is a well-formed ``shared``
    record naming a trace file of the same folder; else None."""
    if not line.startswith(PREFIX):
        return None
    try:
        rec = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    name, counts = rec.get("file"), [rec.get(k) for k in ("lines", "bytes", "crc32")]
    if not isinstance(name, str) or os.path.basename(name) != name or \
            not name.endswith(".jsonl") or name in ("", ".", ".."):
        return None
    ints = [n for n in counts if isinstance(n, int) and not isinstance(n, bool) and n >= 0]
    return SharedRef(name, *ints) if len(ints) == 3 else None


def find(data: bytes | mmap.mmap, size: int) -> tuple[SharedRef, int] | None:
    """The reference ending the whole file ``data`` (bytes or a mapping of ``size`` bytes,
    ending with a line end), with the offset its line begins at; None for any other file."""
    begin = data.rfind(b"\n", max(0, size - _TAIL), size - 1) + 1
    if begin <= 0:
        return None
    ref = parse(bytes(data[begin:size - 1]))
    return (ref, begin) if ref is not None else None


def of_file(path: str) -> SharedRef | None:
    """The reference ending the trace file at ``path``, if it is a member file."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < 2:
                return None
            start = max(0, size - _TAIL)
            fh.seek(start)
            tail = fh.read()
    except OSError:
        return None
    if not tail.endswith(b"\n"):
        return None
    found = find(tail, len(tail))
    return found[0] if found is not None else None


def joined(member: bytes, start: int, common: bytes) -> bytes:
    """A member file's bytes (its header up to byte ``start``) with its empty lines filled
    from ``common`` (the class's lines, in order) and its ``shared`` record left out: the
    file as the rank wrote it."""
    shared = iter(common.splitlines(keepends=True))
    lines = member[start:].splitlines(keepends=True)[:-1]
    return member[:start] + b"".join(line if line != b"\n" else next(shared, b"")
                                     for line in lines)
