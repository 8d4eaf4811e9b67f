"""The ranks wake the launcher when one of them starts to wait, so it need not poll often.

Between two polls the launcher sleeps; on a 2-core VM every wake-up costs it milliseconds of
CPU with its caches cold (bench/RESULTS.md, session 37), so it sleeps long while every rank
makes progress. What must be seen quickly is a rank that waits in a collective (a provable
mismatch is called within 2 s, a stuck peer at its timeout): each rank's writer thread, when
the oldest collective it has running has run for :data:`~ddpdoctor.trace.progress_block.
WAITED` seconds, writes a byte into a FIFO the launcher made (its path in
:data:`~ddpdoctor.runtime.env.WAKE`), and the launcher, which sleeps in ``select`` on it and
on the job's process, polls at once and then fast for as long as some rank waits.

The FIFO lives in a private temporary folder, never in the log folder (whose readers open
what they find there; opening a FIFO blocks).
"""

from __future__ import annotations

import os
import shutil
import tempfile


class Wake:
    """The launcher's end of the FIFO: readable when some rank has written to it."""

    def __init__(self, folder: str, path: str, fd: int) -> None:
        self._folder = folder
        self.path = path
        self.fd = fd

    @classmethod
    def create(cls) -> Wake | None:
        """A new FIFO, opened for reading; None where one cannot be made (the launcher then
        polls at its running rate, as without one)."""
        folder = tempfile.mkdtemp(prefix="ddpdoctor-wake-")
        path = os.path.join(folder, "wake")
        try:
            os.mkfifo(path, 0o600)
            # Read and write: a FIFO open for reading alone reads as at its end (always
            # ready) whenever no rank has it open for writing.
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        except (OSError, AttributeError):  # no FIFOs here (AttributeError: no os.mkfifo)
            shutil.rmtree(folder, ignore_errors=True)
            return None
        return cls(folder, path, fd)

    def drain(self) -> None:
        """Take what the ranks wrote: the FIFO is not ready again until one writes anew."""
        try:
            while os.read(self.fd, 4096):
                pass
        except OSError:  # EAGAIN: nothing more
            pass

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
        shutil.rmtree(self._folder, ignore_errors=True)
