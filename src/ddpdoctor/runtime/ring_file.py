"""The rank's side of its issue ring (:mod:`ddpdoctor.trace.issue_ring`): the mapped file.

The trace writer owns one. Its issuing thread stores a collective's per-call fields into
:attr:`RingFile.map` (``issue_ring.SLOT.pack_into``, one call) before issuing it; its looks
note how far the trace's lines go (:meth:`RingFile.lined`). A store into a ``MAP_SHARED``
mapping lands in the kernel's page cache, so a rank killed outright leaves the slots behind;
the blocks are reserved up front (``posix_fallocate``), so a full disk shows here, as an
OSError, never as a SIGBUS on a store. Standard library only.
"""

from __future__ import annotations

import mmap
import os
import struct

from ddpdoctor.runtime.trace_file import POPULATE_WRITE
from ddpdoctor.trace import issue_ring

_LINED = struct.Struct("<q")


class RingFile:
    """One rank's ring file, mapped; raises OSError when it cannot be made."""

    def __init__(self, trace_path: str) -> None:
        self.path = issue_ring.path_of(trace_path)
        size = issue_ring.size()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            self.map: mmap.mmap | None = mmap.mmap(fd, size)
        except (OSError, ValueError, AttributeError) as exc:  # no posix_fallocate: not Linux
            os.close(fd)
            issue_ring.remove(trace_path)
            raise OSError(f"cannot map {self.path}: {exc}") from None
        os.close(fd)  # the mapping keeps the file
        if POPULATE_WRITE is not None:  # its pages faulted in now, not by the issuing thread
            try:
                self.map.madvise(POPULATE_WRITE)
            except (OSError, ValueError):  # a kernel without it (before Linux 5.14)
                pass
        issue_ring.HEAD.pack_into(self.map, 0, issue_ring.MAGIC, issue_ring.VERSION,
                                  issue_ring.SLOT.size, issue_ring.SLOTS, 0)

    def lined(self, cid: int) -> None:
        """Every collective up to id ``cid`` has its line in the trace."""
        if self.map is not None:
            _LINED.pack_into(self.map, issue_ring.LINED_AT, cid)

    def close(self) -> None:
        """Unmap and delete the file: the trace holds every line."""
        if self.map is not None:
            self.map.close()
            self.map = None
            try:
                os.unlink(self.path)
            except OSError:
                pass
