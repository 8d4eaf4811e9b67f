"""A rank's trace file, appended to through a shared mapping of it.

Whatever is stored survives however the rank dies next (an exception, ``os._exit``, SIGABRT
from gloo, SIGKILL): a store into a ``MAP_SHARED`` mapping of the file lands in the kernel's
page cache just as an ``os.write`` does, and survives the process the same way, without a
system call per line (on a busy 2-core rank a ``write`` cost the training thread ~8 µs per
collective). A collective's fields are in the rank's issue ring before it is issued
(:mod:`ddpdoctor.trace.issue_ring`); its line follows here at the writer's next look.

The file is extended a window at a time (``posix_fallocate``: the blocks are reserved, so a
full disk shows as an error here, never as a SIGBUS on a store) and trimmed to its data when
closed. A rank killed before it closes its trace leaves up to :data:`~ddpdoctor.trace.schema.
PAD_MAX` NUL bytes after its last line; readers stop there. Where a window cannot be
allocated or mapped (a file size limit, a full disk, a file system without shared mappings),
or with ``DDPDOCTOR_TRACE_WRITE=1``, the file is trimmed and written with ``pwrite`` from
then on. The writer's looks fault in, ahead of the data, the pages the next lines will be
stored into (:meth:`TraceFile.prefault`): a page's first store otherwise costs the thread
that issues the collectives a page fault (7-8 µs on a busy 2-core VM, one in ~14 collectives).
Standard library only.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable

from ddpdoctor.runtime import env
from ddpdoctor.trace import schema

WINDOW = schema.PAD_MAX  # bytes reserved and mapped at a time
_GRAIN = mmap.ALLOCATIONGRANULARITY
_PAGE = mmap.PAGESIZE
# madvise(MADVPOPULATE_WRITE) (Linux 5.14): fault pages in, writable, in one call, without
# changing what they hold. Python names it only when built against headers that have it.
POPULATE_WRITE: int | None = getattr(mmap, "MADVPOPULATE_WRITE", 23) \
    if sys.platform.startswith("linux") else None


def _no_window(data: bytes) -> int:
    raise ValueError("no mapped window")


class TraceFile:
    """Appends bytes at the end of one file; the mapping is this class's alone.

    :attr:`fast_write` is the hot path: the ``write`` of the mapped window itself (one call,
    no Python frame), which raises ValueError, writing nothing, when the data does not fit in
    the window or there is none (closed, or written with ``pwrite``); :meth:`append` then
    does what is needed."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self._pos = os.fstat(self.fd).st_size  # the data's end while unmapped (appended to)
        self._map: mmap.mmap | None = None
        self._start = self._pos  # the file offset the mapping begins at
        self._mapped = os.environ.get(env.TRACE_WRITE) != "1"
        self.fast_write: Callable[[bytes], int] = _no_window
        self._faulted: tuple[mmap.mmap | None, int] = (None, 0)  # a mapping, faulted to here
        self._populate = POPULATE_WRITE

    @property
    def pos(self) -> int:
        """Where the data ends."""
        m = self._map
        return self._start + m.tell() if m is not None else self._pos

    def append(self, data: bytes) -> None:
        """Write ``data`` after what is there; raises OSError when it cannot."""
        try:
            self.fast_write(data)
        except ValueError:  # past the window's end, or no window
            if self._mapped and self._remap(len(data)):
                self.fast_write(data)  # the new window holds it
            else:
                self._pwrite(data)

    def prefault(self, ahead: int) -> None:
        """Fault in the mapped pages that the next ``ahead`` bytes will be stored into (up
        to the window's end), for another thread than the one that appends: it changes no
        byte, and a mapping closed meanwhile only makes it return. Nothing where the kernel
        cannot (before Linux 5.14) or nothing is mapped."""
        m = self._map
        if m is None or self._populate is None:
            return
        try:
            here = m.tell()
            start = here - here % _PAGE
            if self._faulted[0] is m:
                start = max(start, self._faulted[1])
            end = here + ahead
            end += -end % _PAGE  # the kernel faults whole pages: note the end of the last one
            if end > start:  # the length is cut at the mapping's end
                m.madvise(self._populate, start, end - start)
                self._faulted = (m, end)
        except ValueError:  # unmapped by the appending thread meanwhile, or at its end
            pass
        except OSError:  # a kernel without it (EINVAL), or a mapping it cannot fault in
            self._populate = None

    def close(self) -> None:
        """Unmap, trim the file to its data and close it."""
        self._unmap()
        try:
            os.ftruncate(self.fd, self._pos)
        except OSError:
            pass
        os.close(self.fd)

    def _remap(self, need: int) -> bool:
        """Map a window from the page that holds the end of the data, large enough for
        ``need`` more bytes; False (and writes from now on) when it cannot be had."""
        self._unmap()
        pos = self._pos
        start = pos - pos % _GRAIN
        length = max(WINDOW, pos + need - start)
        try:
            os.posix_fallocate(self.fd, start, length)
            self._map = mmap.mmap(self.fd, length, offset=start)
        except (OSError, ValueError):
            self._mapped = False
            try:  # no reserved bytes past the data: what follows is written, not mapped
                os.ftruncate(self.fd, pos)
            except OSError:
                pass
            return False
        self._map.seek(pos - start)
        self._start = start
        self.fast_write = self._map.write
        return True

    def _unmap(self) -> None:
        if self._map is not None:
            self._pos = self.pos
            self.fast_write = _no_window
            self._map.close()
            self._map = None

    def _pwrite(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a short write is rare, but possible
            written = os.pwrite(self.fd, view, self._pos)
            self._pos += written
            view = view[written:]
