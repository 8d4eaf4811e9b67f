"""The live view while a job runs: one line per rank, redrawn in place below the job's output.

On a terminal, :class:`LiveView` keeps a region at the bottom (rich's ``Live``) with a line per
rank — iteration, collectives per second, and what it does: running, busy (CPU or I/O) or
blocked (neither) in a function of its own for N s, waiting in a collective for N s — and
prints the job's output above it (the launcher pipes the job's output through
:meth:`LiveView.output`). Without a terminal,
:func:`plain_line` gives one line for a periodic log entry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ddpdoctor.render.safe import clean

if TYPE_CHECKING:
    from ddpdoctor.launch.monitor import JobProgress

MAX_RANKS = 8  # lines of the view; the rest are counted


class LiveView:
    """A region redrawn in place with each rank's state; the job's output scrolls above."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = Live(console=console, auto_refresh=False, transient=True,
                         redirect_stdout=False, redirect_stderr=False)
        self._last: dict[int, tuple[float, int]] = {}  # rank -> (time, completed)
        self._rates: dict[int, float] = {}

    def __enter__(self) -> LiveView:
        self.live.start()
        self.live.update(Text("ddpdoctor: starting the job", style="dim"), refresh=True)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.live.stop()

    def output(self, text: str, is_err: bool) -> None:
        """A line of the job's output, printed above the view."""
        self.live.console.print(Text(clean(text.rstrip("\n"))), soft_wrap=True)

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
            state = progress.rank_line(p, now)
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
        self.live.update(Group(*lines), refresh=True)


def plain_line(progress: JobProgress) -> str:
    """One line for a log: each rank's collectives completed and state."""
    return progress.summary_line()
