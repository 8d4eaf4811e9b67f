"""The live view while a job runs: one line per rank, redrawn in place below the job's output.

On a terminal, :class:`LiveView` keeps a region at the bottom with a line per rank —
iteration, collectives per second, and what it does: running, busy (CPU or I/O) or blocked
(neither) in a function of its own for N s, waiting in a collective for N s. The job runs on a
pseudo-terminal of its own (``launch/job.py``), so its ranks see a terminal as under plain
torchrun (``isatty()``, colours, progress bars drawn with ``\\r``); its bytes reach the
terminal as written, above the region: the region is erased, the bytes written, and the
region drawn again once the job's output ends a line. While a line of the job's output is
unfinished (a progress bar updating in place) the region stays away, so nothing is drawn over
it. Without a terminal, :func:`plain_line` gives one line for a periodic log entry.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from ddpdoctor.render.safe import clean

if TYPE_CHECKING:
    from ddpdoctor.launch.monitor import JobProgress

MAX_RANKS = 8  # lines of the view; the rest are counted


class LiveView:
    """A region redrawn in place with each rank's state; the job's output scrolls above."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._lock = threading.Lock()  # the job's output and the redraws come from two threads
        self._shown = 0  # lines of the region on the screen now
        self._lines: list[Text] = []
        self._line_start = True  # the job's output so far ends a line
        self._last: dict[int, tuple[float, int]] = {}  # rank -> (time, completed)
        self._rates: dict[int, float] = {}

    def __enter__(self) -> LiveView:
        self._draw([Text("ddpdoctor: starting the job", style="dim")])
        return self

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self._erase()
            if not self._line_start:
                self.console.file.write("\n")  # the report starts on a line of its own
            self.console.file.flush()

    def _erase(self) -> None:
        if self._shown:
            self.console.file.write(f"\r\x1b[{self._shown}A\x1b[J")
            self._shown = 0

    def _render(self) -> None:
        """Draw :attr:`_lines` where the cursor is (the start of a line)."""
        width = max(self.console.width - 1, 20)
        with self.console.capture() as capture:
            for line in self._lines:
                line = line.copy()
                line.truncate(width, overflow="ellipsis")  # one row each: the count is exact
                self.console.print(line, soft_wrap=True)
        text = capture.get()
        self.console.file.write(text)
        self._shown = text.count("\n")

    def _draw(self, lines: list[Text]) -> None:
        with self._lock:
            self._lines = lines
            if not self._line_start:
                return  # a line of the job's output is unfinished: wait for its end
            self._erase()
            self._render()
            self.console.file.flush()

    def output(self, text: str, is_err: bool) -> None:
        """Bytes of the job's output (any amount, as written), shown above the region."""
        if not text:
            return
        with self._lock:
            self._erase()
            self.console.file.write(text)
            self._line_start = text.endswith("\n")
            if self._line_start:
                self._render()
            self.console.file.flush()

    def status(self, progress: JobProgress, event: str) -> None:
        """Redraw the view (called by the launcher's loop)."""
        now = time.time()
        lines = [Text(f"ddpdoctor {time.strftime('%H:%M:%S')}  (hang timeout applies to "
                      f"waiting ranks only)", style="dim")]
        ranks = sorted(progress.ranks)
        for rank in ranks[:MAX_RANKS]:
            p = progress.ranks[rank]
            prev = self._last.get(rank)
            if prev is not None and now > prev[0]:
                rate = (p.completed - prev[1]) / (now - prev[0])
                self._rates[rank] = 0.5 * self._rates.get(rank, rate) + 0.5 * rate
            self._last[rank] = (now, p.completed)
            state = clean(progress.rank_line(p, now))
            style = "yellow" if state.startswith("waiting") else (
                "cyan" if state.startswith("busy") else
                "red" if state.startswith("blocked") else "")
            lines.append(Text(f"rank {rank:<4} iter {p.iteration:<6} "
                              f"{self._rates.get(rank, 0.0):7.1f} coll/s  ") + Text(state,
                                                                                     style=style))
        if len(ranks) > MAX_RANKS:
            lines.append(Text(f"… and {len(ranks) - MAX_RANKS} more ranks", style="dim"))
        if not ranks:
            lines.append(Text("waiting for the ranks to start", style="dim"))
        self._draw(lines)


def plain_line(progress: JobProgress) -> str:
    """One line for a log: each rank's collectives completed and state."""
    return progress.summary_line()
