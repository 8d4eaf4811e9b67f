"""A rank's trace file, appended to through a shared mapping of it.

A collective's line must be in the file before the collective is issued, so that it survives
however the rank dies next (an exception, ``os._exit``, SIGABRT from gloo, SIGKILL). A store
into a ``MAP_SHARED`` mapping of the file lands in the kernel's page cache just as an
``os.write`` does, and survives the process the same way, without a system call per line
(on a busy 2-core rank a ``write`` cost the training thread ~8 µs per collective).

The file is extended a window at a time (``posix_fallocate``: the blocks are reserved, so a
full disk shows as an error here, never as a SIGBUS on a store) and trimmed to its data when
closed. A rank killed before it closes its trace leaves up to :data:`~ddpdoctor.trace.schema.
PAD_MAX` NUL bytes after its last line; readers stop there. Where a window cannot be
allocated or mapped (a file size limit, a full disk, a file system without shared mappings),
or with ``DDPDOCTOR_TRACE_WRITE=1``, the file is trimmed and written with ``pwrite`` from
then on. Standard library only.
"""

from __future__ import annotations

import mmap
import os

from ddpdoctor.runtime import env
from ddpdoctor.trace import schema

WINDOW = schema.PAD_MAX  # bytes reserved and mapped at a time
_GRAIN = mmap.ALLOCATIONGRANULARITY


class TraceFile:
    """Appends bytes at the end of one file; the mapping is this class's alone."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.pos = os.fstat(self.fd).st_size  # an existing file is appended to
        self._map: mmap.mmap | None = None
        self._start = self._end = self.pos  # the file span the mapping covers
        self._mapped = os.environ.get(env.TRACE_WRITE) != "1"

    def append(self, data: bytes) -> None:
        """Write ``data`` after what is there; raises OSError when it cannot."""
        end = self.pos + len(data)
        if end <= self._end and self._map is not None:
            self._map[self.pos - self._start:end - self._start] = data
            self.pos = end
        elif self._mapped and self._remap(len(data)):
            self.append(data)
        else:
            self._pwrite(data)

    def close(self) -> None:
        """Unmap, trim the file to its data and close it."""
        self._unmap()
        try:
            os.ftruncate(self.fd, self.pos)
        except OSError:
            pass
        os.close(self.fd)

    def _remap(self, need: int) -> bool:
        """Map a window from the page that holds the end of the data, large enough for
        ``need`` more bytes; False (and writes from now on) when it cannot be had."""
        self._unmap()
        start = self.pos - self.pos % _GRAIN
        length = max(WINDOW, self.pos + need - start)
        try:
            os.posix_fallocate(self.fd, start, length)
            self._map = mmap.mmap(self.fd, length, offset=start)
        except (OSError, ValueError):
            self._mapped = False
            try:  # no reserved bytes past the data: what follows is written, not mapped
                os.ftruncate(self.fd, self.pos)
            except OSError:
                pass
            return False
        self._start, self._end = start, start + length
        return True

    def _unmap(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
            self._start = self._end = self.pos

    def _pwrite(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a short write is rare, but possible
            written = os.pwrite(self.fd, view, self.pos)
            self.pos += written
            view = view[written:]
