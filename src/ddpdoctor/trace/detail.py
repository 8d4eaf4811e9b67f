"""A rank's detail for the other nodes: the end of its trace, small enough to pass through the
job's store once.

When a job of several nodes is stopped for a hang, the diagnosis on each node needs the ranks a
verdict names (``analysis/digest.py``), wherever they ran. The node that holds such a rank
cuts from its trace what the analysis reads of the end of a run: the header, the records that
describe the process and its groups, the last :data:`KEEP` collectives of each group (with
the site and stack records they refer to) and what the rank did at the end (its last
``done``, hang, exception, exit and warning records). Every other node writes that as
``remote-<rank>.jsonl`` in its log folder: a trace whose earlier positions are unknown (the
header says ``"partial": true``), read beside the node's own traces. Standard library only.
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path

from ddpdoctor.trace import schema

KEEP = 8  # collectives kept per group
MAX_BYTES = 256 * 1024  # a detail larger than this loses its largest end records first
_DESCRIBE = {schema.PROCESS_START, schema.GROUP, schema.INIT, schema.DDP_INIT}
_END = {schema.HANG, schema.EXCEPTION, schema.EXIT, schema.WARNING, schema.THREAD_EXCEPTION}


def extract(path: Path, keep: int = KEEP) -> bytes:
    """The detail of the rank whose trace is ``path``: trace lines, the header first (those
    of a rank killed before its writer wrote them taken from its issue ring)."""
    from ddpdoctor.trace.reader import TraceError, trace_data  # the reader reads details too

    try:
        data = trace_data(path)
    except TraceError as exc:
        raise ValueError(str(exc)) from None
    head, _, body = data.partition(b"\n")
    header = json.loads(head)
    if not isinstance(header, dict) or header.get("kind") != schema.HEADER:
        raise ValueError(f"{path.name}: no trace header")
    header["partial"] = True
    kept: list[tuple[int, bytes]] = []  # (line number, line)
    stacks: dict[int, tuple[int, bytes]] = {}
    sites: dict[int, tuple[int, bytes, dict]] = {}  # format 9: a site's line and record
    groups: dict[str, deque[tuple[int, bytes, int | None, int | None]]] = {}
    last_done: tuple[int, bytes] | None = None
    for number, raw in enumerate(body.split(b"\n")):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue  # a cut-off last line
        if not isinstance(rec, dict):
            continue
        kind = rec.get("kind")
        if kind == schema.COLLECTIVE:
            site = rec.get(schema.SITE_REF)
            site = site if isinstance(site, int) and site in sites else None
            static = sites[site][2] if site is not None else rec
            key = str(static.get("group")) if rec.get("seq") is not None else "p2p"
            stack = static.get("stack")
            groups.setdefault(key, deque(maxlen=keep)).append(
                (number, raw, stack if isinstance(stack, int) else None, site))
        elif kind == schema.STACK and isinstance(rec.get("id"), int):
            stacks.setdefault(rec["id"], (number, raw))
        elif kind == schema.SITE and isinstance(rec.get("id"), int):
            sites.setdefault(rec["id"], (number, raw, rec))
        elif kind == schema.DONE:
            last_done = (number, raw)
        elif kind == schema.STATE:
            kept.append((number, raw))  # a failure: small, and rare
        elif kind in _DESCRIBE or kind in _END:
            kept.append((number, raw))
    used = {stack for lines in groups.values() for _, _, stack, _ in lines}
    kept += [stacks[s] for s in used if s in stacks]
    named = {site for lines in groups.values() for _, _, _, site in lines if site is not None}
    kept += [sites[s][:2] for s in named]
    kept += [(n, raw) for lines in groups.values() for n, raw, _, _ in lines]
    if last_done is not None:
        kept.append(last_done)
    kept.sort()
    lines = [json.dumps(header).encode()] + [raw for _, raw in kept]
    while sum(map(len, lines)) > MAX_BYTES and len(lines) > 1:
        lines.remove(max(lines[1:], key=len))
    return b"\n".join(lines) + b"\n"


def write(folder: Path, rank: int, detail: bytes) -> Path:
    """Store another node's rank's detail in this node's log folder (0600)."""
    path = folder / schema.remote_filename(rank)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        fh.write(detail)
    return path
