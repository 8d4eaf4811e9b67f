"""Live progress of a running job, read from the ranks' traces as they grow.

The launcher tails each ``rank-*.jsonl`` (complete lines only) and keeps, per rank, the
collectives completed, the ones still pending, the DDP iteration and when the rank last made
progress. :func:`hang_verdict` applies the hang rule: some rank has waited in a collective for
``timeout`` seconds and no rank has completed one meanwhile.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.trace import schema


@dataclass
class RankProgress:
    """What the launcher knows of one rank while the job runs."""

    rank: int
    completed: int = 0
    pending: dict[int, tuple[float, str]] = field(default_factory=dict)  # id -> (seen, what)
    iteration: int = 0
    last_op: str = ""
    last_progress: float = 0.0
    status: str = "running"  # running | finished | exception

    def oldest_pending(self) -> tuple[float, str] | None:
        return min(self.pending.values(), default=None)


class _Tail:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.rank: int | None = None

    def lines(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.rest + data
        parts = data.split(b"\n")
        self.rest = parts.pop()
        return parts


class JobProgress:
    """Follows every rank trace in ``logdir``."""

    def __init__(self, logdir: str) -> None:
        self.logdir = Path(logdir)
        self.ranks: dict[int, RankProgress] = {}
        self._tails: dict[str, _Tail] = {}
        self.started = time.time()

    def poll(self, now: float | None = None) -> None:
        now = now or time.time()
        for path in self.logdir.glob(schema.TRACE_GLOB):
            tail = self._tails.get(path.name)
            if tail is None:
                tail = self._tails[path.name] = _Tail(path)
            for raw in tail.lines():
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(rec, dict):
                    continue
                if rec.get("kind") == schema.HEADER:
                    tail.rank = int(rec.get("rank", -1))
                    self.ranks.setdefault(tail.rank, RankProgress(tail.rank, last_progress=now))
                elif tail.rank is not None:
                    self._apply(self.ranks[tail.rank], rec, now)

    @staticmethod
    def _apply(prog: RankProgress, rec: dict, now: float) -> None:
        kind = rec.get("kind")
        if kind == schema.COLLECTIVE:
            prog.last_op = f"{rec.get('op')} ({rec.get('label')})"
            prog.iteration = rec.get("iteration") or prog.iteration
            if rec.get("state") == schema.PENDING:
                prog.pending[rec["id"]] = (now, prog.last_op)
            else:
                prog.completed += 1
                prog.last_progress = now
        elif kind == schema.STATE:
            if prog.pending.pop(rec.get("id"), None) is not None:
                prog.completed += 1
                prog.last_progress = now
        elif kind == schema.INIT:
            # Waiting in init_process_group counts as waiting in a collective (key 0).
            if rec.get("state") == schema.PENDING:
                prog.pending[0] = (now, "init_process_group")
            elif prog.pending.pop(0, None) is not None:
                prog.last_progress = now
        elif kind == schema.EXCEPTION:
            prog.status = "exception"
        elif kind == schema.EXIT:
            prog.status = rec.get("status", "finished")
            prog.pending.clear()

    def last_progress(self) -> float:
        return max((p.last_progress for p in self.ranks.values()), default=self.started)

    def hang_verdict(self, timeout: float, now: float | None = None) -> bool:
        """True when a rank waits in a collective for ``timeout`` s and nobody progressed."""
        now = now or time.time()
        if now - self.last_progress() < timeout:
            return False
        return any(p.pending and now - p.oldest_pending()[0] >= timeout
                   for p in self.ranks.values())

    def stall_verdict(self, timeout: float, now: float | None = None) -> bool:
        """No collective completed for ``timeout`` s while no rank waits in one (long compute)."""
        now = now or time.time()
        return (bool(self.ranks) and now - self.last_progress() >= timeout
                and not any(p.pending for p in self.ranks.values()))

    def summary_line(self, now: float | None = None) -> str:
        now = now or time.time()
        parts = []
        for rank in sorted(self.ranks):
            p = self.ranks[rank]
            state = p.status if p.status != "running" else (
                f"waiting {now - p.oldest_pending()[0]:.0f}s in {p.oldest_pending()[1]}"
                if p.pending else f"iter {p.iteration}")
            parts.append(f"r{rank}: {p.completed} done, {state}")
        return "; ".join(parts) or "waiting for ranks to start"


def hang_request_path(logdir: str) -> str:
    from ddpdoctor.runtime.watchdog import REQUEST_FILE

    return os.path.join(logdir, REQUEST_FILE)
