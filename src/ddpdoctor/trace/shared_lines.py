"""Once a job has ended, keep the collective lines that ranks share once per folder (format 8).

Data-parallel ranks issue the same collectives from the same lines, and from format 4 on they
write them byte for byte alike: a node of 8 ranks writes its collective lines 8 times, and a
2,048-node job of 10,000 collectives 43 GB of traces that no machine reads in seconds.
:func:`share_lines` rewrites every rank of a log folder whose collective, ``stack`` and
``site`` lines are, in full, those of a rank read before it
(:func:`~ddpdoctor.trace.reader.membership`) as a *member file*: the same header and own
records (``done``, ``activity``, ``exit``, ...) on the same lines, each shared line left empty,
and a last ``shared`` record naming the file that holds them
(:mod:`ddpdoctor.trace.shared_ref`). A member is read by comparing nothing and decoding nothing
of the shared lines. Nothing else is rewritten: the first rank of each class, a rank whose
lines differ anywhere, a damaged, cut, capped or still growing file.

Each rewrite is checked before it replaces the file: the member's lines joined back with the
class's must give the original bytes. The new file is written beside the old one and renamed
over it, so a launcher killed in between leaves the original.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.trace import schema
from ddpdoctor.trace.identical import BULK_MAX, RankClass, Shared
from ddpdoctor.trace.reader import TraceError, membership
from ddpdoctor.trace.shared_ref import joined


@dataclass
class SharingDone:
    """What :func:`share_lines` did to a folder."""

    files: int = 0  # trace files looked at
    members: int = 0  # rewritten as member files
    bytes_before: int = 0  # of every trace file looked at
    bytes_after: int = 0


def share_lines(logdir: str | os.PathLike) -> SharingDone:
    """Rewrite the rank traces in ``logdir`` whose collective lines another rank's file of the
    folder holds in full as member files of that file (see the module's text)."""
    done = SharingDone()
    pool = Shared()
    for path in sorted(Path(logdir).glob(schema.TRACE_GLOB)):
        try:
            size = path.stat().st_size
        except OSError:
            continue
        done.files += 1
        done.bytes_before += size
        try:
            # A file over BULK_MAX is never a class's (read in chunks): not read for nothing.
            found = membership(path, pool) if size <= BULK_MAX else None
        except TraceError:
            found = None  # not a trace: left as it is
        if found is not None:
            written = _rewrite(path, *found)
            if written is not None:
                done.members += 1
                size = written
        done.bytes_after += size
    return done


def member_bytes(original: bytes, start: int, cls: RankClass,
                 own: list[tuple[int, bytes]], holder: str) -> bytes:
    """The member file of a rank whose file ``original`` holds its header up to byte
    ``start``, then ``cls``'s lines with its ``own`` records (each after so many class lines)
    among them; ``holder``: the name of the file of its folder that holds ``cls``'s lines."""
    parts = [original[:start]]
    before = 0
    for lines, line in own:
        parts.append(b"\n" * (lines - before))
        parts.append(line + b"\n")
        before = lines
    parts.append(b"\n" * (len(cls.starts) - 1 - before))
    parts.append(cls.ref(holder).line())
    return b"".join(parts)


def _rewrite(path: Path, cls: RankClass, own: list[tuple[int, bytes]]) -> int | None:
    """Replace ``path`` by its member file, when its class's first file lies in the same
    folder and the member joins back to the very bytes it replaces; its size, or None when
    the file was left as it is."""
    holder = Path(cls.path)
    if holder.parent != path.parent or holder == path:
        return None
    tmp = path.with_name(f".{path.name}.shared")
    try:
        original = path.read_bytes()
        start = original.find(b"\n") + 1
        member = member_bytes(original, start, cls, own, holder.name)
        if joined(member, start, cls.common) != original:
            return None
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(member)
        if os.stat(path).st_size != len(original):  # it grew meanwhile: a rank still writes
            tmp.unlink()
            return None
        os.replace(tmp, path)
        return len(member)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
