"""A size cap for long jobs that never loses the first divergence: ``DDPDOCTOR_MAX_TRACE_MB``.

A ring buffer bounds a trace by forgetting its beginning, where the first divergence may sit.
Here the trace keeps every collective in full until it reaches the cap; from then on a
collective is written only when it breaks the rank's own pattern. Every collective of a group
that repeats the static part (op, label, tensors, reduce op, root, call stack) of the one
``back`` positions earlier in the same group, in the same iteration offset and bucket, joins a
*run*, and a run is one ``repeat`` record::

    {"kind": "repeat", "group": "0", "seq": 4001, "n": 700, "back": 7, "iteration_delta": 1,
     "id": 4001, "id_last": 4700, "t": ..., "t_last": ...}

Collective ``seq`` of the group equals collective ``seq - back`` except for its iteration
(``+ iteration_delta``), its id and its time (interpolated between ``t`` and ``t_last``). The
sequence of static parts is therefore kept exactly, and with it every position at which two
ranks can differ: whatever differs between ranks breaks at least one rank's pattern, and that
rank writes the collective in full. What is written in full after the cap: a collective whose
static part is new or out of pattern (positions are remembered from the cap on, so the first
round of each pattern after it is new), point-to-point ops, one collective per second (a keyframe
for the times), and every other record kind. Run
members complete like any collective (``done`` records). Runs are closed once a second, as
soon as the rank issues nothing for the writer's interval (a rank blocked in a collective), and
whenever the trace is flushed (hang evidence, exit): a rank killed outright within that
interval of its last repeat loses those repeats, never a collective that broke the pattern.

:meth:`Compressor.fold` runs where the writer formats its lines (its look, or the issuing
thread when it must write them itself), under the writer's lock. Standard library only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable
from typing import Any

from ddpdoctor.runtime import env
from ddpdoctor.trace import schema

WINDOW = 8192  # positions of each group the writer remembers to find a repeat's source
KEYFRAME_SECONDS = 1.0


def cap_from_env() -> int | None:
    """The cap in bytes from ``DDPDOCTOR_MAX_TRACE_MB``; None when unset or not a number."""
    raw = os.environ.get(env.MAX_TRACE_MB)
    if not raw:
        return None
    try:
        mb = float(raw)
    except ValueError:
        return None
    return max(0, int(mb * 1024 * 1024)) if mb >= 0 else None


class _Run:
    __slots__ = ("seq", "n", "back", "delta", "id", "id_last", "t", "t_last")

    def __init__(self, seq: int, cid: int, t: float, back: int, delta: int) -> None:
        self.seq, self.n, self.back, self.delta = seq, 1, back, delta
        self.id = self.id_last = cid
        self.t = self.t_last = t

    def record(self, group: str) -> str:
        return json.dumps({"kind": schema.REPEAT, "group": group, "seq": self.seq, "n": self.n,
                           "back": self.back, "iteration_delta": self.delta, "id": self.id,
                           "id_last": self.id_last, "t": round(self.t, 6),
                           "t_last": round(self.t_last, 6)})


class _Group:
    """The last :data:`WINDOW` positions of one group: static part, iteration, bucket."""

    __slots__ = ("statics", "iterations", "buckets", "top", "last", "run")

    def __init__(self) -> None:
        self.statics: list[object] = [None] * WINDOW
        self.iterations: list[int] = [0] * WINDOW
        self.buckets: list[int | None] = [None] * WINDOW
        self.top = 0  # highest seq noted
        self.last: dict[Hashable, int] = {}  # static part -> latest seq with it
        self.run: _Run | None = None

    def note(self, seq: int, static: Hashable, iteration: int, bucket: int | None) -> None:
        i = seq % WINDOW
        self.statics[i], self.iterations[i], self.buckets[i] = static, iteration, bucket
        self.last[static] = seq
        self.top = seq

    def same(self, pos: int, static: Hashable, iteration: int, bucket: int | None,
             delta: int) -> bool:
        """Whether the collective at ``pos`` has this static part, bucket and iteration offset."""
        if pos < 1 or self.top - pos >= WINDOW:
            return False
        i = pos % WINDOW
        return (self.statics[i] == static and self.buckets[i] == bucket
                and self.iterations[i] + delta == iteration)


class Compressor:
    """Decides, collective by collective, what a capped trace writes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.active = False
        self.groups: dict[str, _Group] = {}
        self._last_key = 0.0
        self._key_due = False

    def begin(self, now: float, written: int, lines: list[str]) -> None:
        """Start of a drain: switch on at the cap; every second close the runs and ask for a
        keyframe."""
        if not self.active:
            if written < self.max_bytes:
                return
            self.active = True
            self._last_key = now
            lines.append(json.dumps({"kind": schema.CAP, "t": round(now, 6), "bytes": written,
                                     "max_bytes": self.max_bytes}))
            return
        if now - self._last_key >= KEYFRAME_SECONDS:
            self._last_key = now
            self._key_due = True
            self.close_all(lines)

    def fold(self, group: str, cid: int, seq: int, iteration: Any, bucket: int | None,
             t: float, static: Hashable, lines: list[str]) -> bool:
        """True when collective ``cid`` (of ``group``, issued at ``t``, its static part named
        by ``static``: the writer's site id) joins a run and needs no line of its own. Below
        the cap nothing is folded and nothing remembered (the caller need not call this):
        positions are noted from the cap on, so the first round of a pattern after it is
        written in full."""
        if not self.active:
            return False
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = _Group()
        if seq != g.top + 1 or not isinstance(iteration, int):
            self._close(group, g, lines)  # out of order: write it in full, start afresh
            g.note(seq, static, iteration if isinstance(iteration, int) else 0, bucket)
            return False
        run = g.run
        if self._key_due:
            self._key_due = False
            self._close(group, g, lines)
            g.note(seq, static, iteration, bucket)
            return False
        if run is not None and run.seq + run.n == seq and \
                g.same(seq - run.back, static, iteration, bucket, run.delta):
            run.n += 1
            run.id_last, run.t_last = cid, t
            g.note(seq, static, iteration, bucket)
            return True
        self._close(group, g, lines)
        src = g.last.get(static)
        if src is not None and g.top - src < WINDOW and g.buckets[src % WINDOW] == bucket:
            g.run = _Run(seq, cid, t, seq - src, iteration - g.iterations[src % WINDOW])
            g.note(seq, static, iteration, bucket)
            return True
        g.note(seq, static, iteration, bucket)
        return False

    def _close(self, name: str, g: _Group, lines: list[str]) -> None:
        if g.run is not None:
            lines.append(g.run.record(name))
            g.run = None

    def close_all(self, lines: list[str]) -> None:
        """Write every open run (on flush, at exit, once a second)."""
        for name, g in self.groups.items():
            self._close(name, g, lines)
