"""The rank's end of the launcher's wake FIFO (:mod:`ddpdoctor.launch.wake`): the writer
thread writes one byte when the rank starts to wait in a collective, so that a launcher that
sleeps long between polls looks at once. Standard library only."""

from __future__ import annotations

import os


class LauncherWake:
    """Writes to the FIFO at ``path`` (:data:`~ddpdoctor.runtime.env.WAKE`), never blocking."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def wake(self) -> None:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(self._fd, b"w")
        except OSError:  # no launcher reads it (ENXIO, EPIPE), or it is full (EAGAIN): awake
            pass

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
