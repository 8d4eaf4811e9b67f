"""The rank's side of its progress block (:mod:`ddpdoctor.trace.progress_block`).

The trace writer owns one and tells it, under its lock, what the launcher needs to watch the
rank: from its writer thread, the collectives issued and completed since it last looked and
those still running; from whichever thread writes them, the rare records (a group, an
activity record, ``init_process_group``, an exception, the exit). The block is rewritten with
one ``pwrite`` only when one of them changed it, so a rank that issues a thousand collectives
a second rewrites it once every 2 s (twice a second once it is quiet), and the training thread
never does. Standard
library only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ddpdoctor.trace import progress_block, schema


class ProgressBlock:
    """One rank's block file, and what it says."""

    def __init__(self, trace_path: str, header: dict) -> None:
        self.path = progress_block.path_of(trace_path)
        self._generation = 0
        self._fd: int | None = None
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:  # the trace is the record; without a block the launcher knows less
            pass
        self.state: dict[str, Any] = {
            "rank": header.get("rank"), "round": header.get("round", 0),
            "attempt": header.get("attempt", 0), "world_size": None, "issued_id": 0,
            "last_issue": None,
            "completed": 0, "iteration": 0, "last_op": "", "issued": {}, "groups": {},
            "init": None, "status": schema.RUNNING, "exited": False, "cut": False, "activity_n": 0,
            "activity": None, "activity_before": None, "pending_count": 0}
        self._pending = "[]"  # the JSON of the listed pending collectives
        self.write()

    def note(self, record: dict) -> None:
        """Take in a rare record the trace got, and rewrite the block if it matters."""
        kind, state = record.get("kind"), self.state
        if kind == schema.PROCESS_START:
            if not isinstance(record.get("world_size"), int):
                return
            state["world_size"] = record["world_size"]
        elif kind == schema.GROUP:
            state["groups"][str(record.get("group"))] = record.get("ranks", [])
        elif kind == schema.ACTIVITY:
            state["activity_before"], state["activity"] = state["activity"], record
            state["activity_n"] += 1
        elif kind == schema.INIT:
            state["init"] = record.get("state")
        elif kind == schema.EXCEPTION:
            state["status"] = schema.EXIT_EXCEPTION
        elif kind == schema.EXIT:
            state["status"] = str(record.get("status", schema.EXIT_FINISHED))
            state["exited"] = True
        else:
            return
        self.write()

    def progressed(self, issued_id: int, completed: int, iteration: int, last_op: str,
                   last_issue: float | None, issued: dict[str, int], pending: list[str],
                   pending_count: int) -> None:
        """The writer thread's news: the last collective written (its id, iteration, op and
        issue time), how many completed, per group the highest sequence number issued, the
        records of the oldest still running (JSON) and how many run."""
        state = self.state
        state.update(issued_id=issued_id, completed=completed, iteration=iteration,
                     last_op=last_op, last_issue=last_issue, issued=issued,
                     pending_count=pending_count)
        self._pending = "[" + ", ".join(pending) + "]"
        self.write()

    def cut(self) -> None:
        """The trace can no longer be written: what the rank does from now on is unknown."""
        self.state["cut"] = True
        self.write()

    def write(self) -> None:
        if self._fd is None:
            return
        self._generation += 1
        payload = f'{json.dumps(self.state)[:-1]}, "pending": {self._pending}}}'
        try:
            os.pwrite(self._fd, progress_block.encode(self._generation, payload.encode()), 0)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
