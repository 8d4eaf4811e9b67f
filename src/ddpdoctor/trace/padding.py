"""Where a trace's data ends: before the NUL bytes a killed rank's writer left reserved.

A rank appends to its trace through a mapping of the file, which it extends a window at a
time and trims when it closes (``runtime/trace_file.py``). A rank killed before it closed
leaves NUL bytes after its last line, at most :data:`~ddpdoctor.trace.schema.PAD_MAX` of
them: the readers read up to the last byte that is not NUL. A file whose last ``PAD_MAX``
bytes are all NUL is damaged, not padded, and is read whole (its damage is reported as ever).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from ddpdoctor.trace import schema

_BLOCK = 64 * 1024


def data_end(fd: int, size: int) -> int:
    """The length of the file ``fd`` (``size`` bytes) without its NUL padding."""
    if size == 0 or os.pread(fd, 1, size - 1) != b"\0":
        return size  # the common case: a trace its writer trimmed
    end = size
    floor = max(0, size - schema.PAD_MAX)
    while end > floor:
        start = max(floor, end - _BLOCK)
        block = os.pread(fd, end - start, start).rstrip(b"\0")
        if block:
            return start + len(block)
        end = start
    return size if floor else 0


def trim(folder: str) -> None:
    """Cut the padding off every trace in ``folder`` whose writer could not (the launcher
    does this once the job's processes have ended, so that the files are plain JSON Lines)."""
    for path in Path(folder).glob(schema.TRACE_GLOB):
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                end = data_end(fh.fileno(), size)
            if end < size:
                os.truncate(path, end)
        except OSError:
            continue


def file_size(fh: BinaryIO) -> int:
    """The size of the open trace file ``fh`` as the readers see it (its padding left out)."""
    if isinstance(fh, Padded):
        return fh.end
    return os.fstat(fh.fileno()).st_size


class Padded:
    """A binary file read only up to ``end`` (where its NUL padding begins); the subset of the
    file interface the readers use."""

    def __init__(self, fh: BinaryIO, end: int) -> None:
        self._fh = fh
        self.end = end

    def fileno(self) -> int:
        return self._fh.fileno()

    def tell(self) -> int:
        return self._fh.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._fh.seek(offset, whence)

    def read(self, size: int = -1) -> bytes:
        room = max(0, self.end - self._fh.tell())
        return self._fh.read(room if size is None or size < 0 else min(size, room))

    def readline(self, size: int = -1) -> bytes:
        room = max(0, self.end - self._fh.tell())
        return self._fh.readline(room if size is None or size < 0 else min(size, room))


def open_data(fh: BinaryIO) -> BinaryIO:
    """``fh``, or a view of it that ends where its padding begins."""
    size = os.fstat(fh.fileno()).st_size
    end = data_end(fh.fileno(), size)
    return fh if end == size else Padded(fh, end)  # type: ignore[return-value]
