"""A timeline of every rank in Chrome's trace-event format, for Perfetto and chrome://tracing.

One process per rank and one thread per process group of that rank; each collective is a
slice named in DDP terms ("DDP gradient bucket 2 of iteration 7"), from its issue to its
completion (the first ``done`` record that covers it: within 2 s while the rank issues
collectives, 500 ms once it is quiet), with its op, tensors,
sequence number and source line as arguments. A collective that never completed stays open
to the end of its rank's trace. The root finding is marked on each rank involved, with flow
arrows joining the collectives that met at the first divergence; a hang is marked where
ddpdoctor asked for the stacks. Format: the "JSON Object Format" of the Trace Event Format
(``traceEvents``, ``ph`` X/i/s/f/M, times in microseconds).

A run of more than :data:`COLLAPSE_FROM` ranks draws one process per *class* of identical
ranks instead (:func:`rank_classes`: the same collectives, from the same lines, ending the
same way), named by its ranks ("ranks 0-8191, 8193-16383"), with the times of its lowest
rank: 16,384 identical ranks are one track, and the rank that diverged is a track of its own.
"""

from __future__ import annotations

import json
import os
from array import array
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from ddpdoctor.analysis.report import Report
from ddpdoctor.analysis.terms import describe, op_text, site_text
from ddpdoctor.trace import schema
from ddpdoctor.trace.index import index_of
from ddpdoctor.trace.model import Collective, RankTrace, Run
from ddpdoctor.trace.rank_text import rank_list

COLLAPSE_FROM = 32  # ranks: a larger run draws one track per class of identical ranks


def completion_times(path: str) -> dict[int, float]:
    """When each collective of a format-3 trace was first known complete (its ``done``
    record's time), by id; a light pass over the file's ``done`` lines."""
    out: dict[int, float] = {}
    ended = 0
    waiting: set[int] = set()
    try:
        with open(path, "rb") as fh:
            for raw in fh:
                if not raw.startswith(b'{"kind": "done"'):
                    continue
                try:
                    rec = json.loads(raw)
                    t, upto, pending = float(rec["t"]), int(rec["upto"]), set(rec["pending"])
                except (ValueError, KeyError, TypeError):
                    continue
                for cid in list(waiting) + list(range(ended + 1, upto + 1)):
                    if cid in pending:
                        waiting.add(cid)
                    else:
                        out.setdefault(cid, t)
                        waiting.discard(cid)
                ended = max(ended, upto)
    except OSError:
        pass
    return out


def _slice(c: Collective, pid: int, tid: int, end: float) -> dict[str, Any]:
    return {"name": describe(c), "cat": c.label, "ph": "X", "ts": round(c.t * 1e6, 1),
            "dur": round(max(end - c.t, 1e-6) * 1e6, 1), "pid": pid, "tid": tid,
            "args": {"op": op_text(c), "seq": c.seq if c.seq is not None else c.p2p_seq,
                     "group": c.group, "state": c.state, "site": site_text(c.site)}}


def rank_classes(run: Run) -> list[list[int]]:
    """The ranks of ``run`` in classes of ranks that issued the same collectives (ops,
    tensors, labels, source lines, groups, order) and ended the same way (finished or not,
    the same collectives left incomplete); each class sorted, the classes by their lowest
    rank."""
    # By id of a list or prototypes that ranks share; each kept alive here, so that no other
    # object can take its id.
    seen: dict[int, tuple[Any, Hashable]] = {}

    def once(obj: Any, key: Any) -> Hashable:
        known = seen.get(id(obj))
        if known is None or known[0] is not obj:
            known = seen[id(obj)] = (obj, key(obj))
        return known[1]

    def codes_key(codes: list[int]) -> Hashable:
        return array("q", codes).tobytes()

    def protos_key(protos: Any) -> Hashable:
        return tuple((p.group, describe(p), site_text(p.site)) for p in protos)

    classes: dict[Hashable, list[int]] = {}
    for rank, trace in sorted(run.ranks.items()):
        index = index_of(trace.collectives)
        groups = tuple((name, once(pos.codes, codes_key))
                       for name, pos in sorted(index.by_group().items()))
        ending = (trace.finished, trace.hang is not None,
                  tuple(c.id for c in index.incomplete(8)))
        key = (once(index.protos, protos_key), groups, len(index.p2p()), ending)
        classes.setdefault(key, []).append(rank)
    return sorted(classes.values())


def build(run: Run, report: Report | None = None) -> dict[str, Any]:
    """The trace-event document of ``run`` (with ``report``'s root finding and hang marks)."""
    events: list[dict[str, Any]] = []
    tids: dict[str, int] = {}
    where: dict[tuple[int, str, int], dict] = {}
    tracks = rank_classes(run) if len(run.ranks) > COLLAPSE_FROM else \
        [[rank] for rank in sorted(run.ranks)]
    for ranks in tracks:
        rank, trace = ranks[0], run.ranks[ranks[0]]
        name = f"rank {rank}" if len(ranks) == 1 else \
            f"{rank_list(ranks)} ({len(ranks)} identical ranks; rank {rank}'s times)"
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": name}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                       "args": {"sort_index": rank}})
        _draw_rank(trace, rank, events, tids, where)
    root = report.root if report is not None else None
    if root is not None and root.group is not None and root.seq is not None:
        matched = sorted((where[k] for k in where if k[1] == root.group and k[2] == root.seq),
                         key=lambda e: e["ts"])
        for event in matched:
            events.append({"name": f"first divergence: {root.kind}", "ph": "i", "s": "t",
                           "pid": event["pid"], "tid": event["tid"], "ts": event["ts"],
                           "args": {"summary": root.summary, "cause": root.cause}})
        for i, (a, b) in enumerate(zip(matched, matched[1:]), start=1):
            common = {"name": "met at the divergence", "cat": "divergence", "id": i}
            events.append({**common, "ph": "s", "pid": a["pid"], "tid": a["tid"],
                           "ts": a["ts"]})
            events.append({**common, "ph": "f", "bp": "e", "pid": b["pid"], "tid": b["tid"],
                           "ts": b["ts"]})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "metadata": {"verdict": report.verdict if report else None,
                         "root": root.kind if root else None, "ranks": len(run.ranks),
                         "tracks": len(tracks)}}


def _draw_rank(trace: RankTrace, rank: int, events: list[dict[str, Any]], tids: dict[str, int],
               where: dict[tuple[int, str, int], dict]) -> None:
    """One rank's slices (one thread per group) and hang mark, as process ``rank``; each
    collective's slice is kept in ``where`` by (rank, group, seq)."""
    ends = completion_times(trace.path) if trace.version >= 3 else {}
    colls = list(trace.collectives)
    last = max((c.t for c in colls), default=0.0)
    for key in ("hang", "exit", "exception"):
        rec = getattr(trace, key) or {}
        if isinstance(rec.get("t"), (int, float)):
            last = max(last, float(rec["t"]))
    for c in colls:
        tid = tids.setdefault(c.group, len(tids))
        end = c.t_end if isinstance(c.t_end, (int, float)) else ends.get(c.id)
        if end is None:
            end = last if c.state != schema.COMPLETED else c.t
        event = _slice(c, rank, tid, end)
        events.append(event)
        if c.seq is not None:
            where[(rank, c.group, c.seq)] = event
    for group, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                       "args": {"name": f"group {group}"}})
    if trace.hang and isinstance(trace.hang.get("t"), (int, float)):
        events.append({"name": "hang: ddpdoctor asked for the stacks", "ph": "i", "s": "p",
                       "pid": rank, "tid": 0, "ts": round(trace.hang["t"] * 1e6, 1)})


def write(run: Run, report: Report | None, out: Path) -> int:
    """Write the timeline to ``out`` (readable by the user only, as every report file: it
    quotes the job's source lines and messages); returns the number of events."""
    doc = build(run, report)
    with open(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
              encoding="utf-8") as fh:
        fh.write(json.dumps(doc))
    return len(doc["traceEvents"])
