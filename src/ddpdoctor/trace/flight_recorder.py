"""PyTorch flight-recorder dumps, read as ddpdoctor traces.

A flight-recorder dump (``TORCH_FR_BUFFER_SIZE`` set; written on an NCCL timeout, by
``torch._C._distributed_c10d._dump_fr_trace()`` / ``_dump_fr_trace_json()``, or by
``ddpdoctor run`` on a hang of a job it did not record itself) holds a rank's last collectives:
op (``gloo:all_reduce``), process group, sequence number, input sizes and dtypes, state, and,
in the pickle form, the Python frames that issued each. :func:`read_dump` turns one into a
:class:`~ddpdoctor.trace.model.RankTrace` (labels in DDP terms from the frames, see
:mod:`ddpdoctor.trace.ddp_sites`) so that ``ddpdoctor diff`` analyses jobs that were never run
under ddpdoctor. The dumps hold no reduce op, no root, no DDP iteration and no exit status.

Safety: JSON is parsed as JSON; a pickle is read by an unpickler that refuses every global
(a genuine dump holds only dicts, lists, tuples, strings and numbers), so a crafted file
cannot run code. Files are read by size-bounded reads of regular files only.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import stat
from pathlib import Path
from typing import Any

from ddpdoctor.trace import ddp_sites, ops, schema
from ddpdoctor.trace.basics import numel
from ddpdoctor.trace.model import (
    Collective,
    Group,
    RankTrace,
    Site,
    is_internal_file,
    site_from,
)

MAX_DUMP_BYTES = 512 * 1024 * 1024
# Containers a dump may decode to, at most, counted before it is parsed (a JSON ``{`` or
# ``[``; a pickle's bytes that open one, strings included, so an upper bound): a buffer of
# 20,000 entries with 30 frames each holds about 650,000. A 100 MB file of empty entries
# would decode to 25 million dicts, 2.7 GB.
MAX_CONTAINERS = 4_000_000
_PICKLE_OPENERS = (b"}", b"]", b")", b"(")  # EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE, MARK
# A dump's file name ends with its rank: torch's default is /tmp/nccl_trace_rank_<N>.
_RANK_IN_NAME = re.compile(r"(\d+)(\.(json|pkl|pickle))?$")

_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


class DumpError(Exception):
    """A file that is not a readable flight-recorder dump."""


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a flight-recorder dump holds "
                                     f"plain data only")


def rank_of(path: Path) -> int | None:
    """The rank a dump's file name ends with (``nccl_trace_rank_3``, ``fr-rank-3.json``)."""
    found = _RANK_IN_NAME.search(path.name)
    if not found or len(found.group(1)) > 6:  # no job has a million ranks: a damaged name
        return None
    return int(found.group(1))


def _read_bytes(path: Path) -> bytes:
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise DumpError(f"{path} is not a regular file")
        if info.st_size > MAX_DUMP_BYTES:
            raise DumpError(f"{path} is larger than {MAX_DUMP_BYTES >> 20} MB")
        with open(path, "rb") as fh:
            return fh.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc.strerror}") from None


def load(path: Path) -> dict:
    """The decoded dump (raises :class:`DumpError`)."""
    data = _read_bytes(path)
    containers = sum(map(data.count, _PICKLE_OPENERS if data[:1] == b"\x80" else (b"{", b"[")))
    if containers > MAX_CONTAINERS:
        raise DumpError(f"{path} would decode to {containers:,} objects, more than a "
                        f"flight-recorder dump holds ({MAX_CONTAINERS:,}): not read")
    try:
        if data[:1] == b"\x80":
            dump = _NoGlobals(io.BytesIO(data)).load()
        else:
            dump = json.loads(data.decode("utf-8"))
    except (pickle.UnpicklingError, EOFError, ValueError, UnicodeDecodeError, RecursionError,
            IndexError, TypeError) as exc:
        raise DumpError(f"{path} is not a flight-recorder dump ({exc})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise DumpError(f"{path} is not a flight-recorder dump (no entries)")
    return dump


def looks_like_dump(path: Path) -> bool:
    """Whether ``path`` is a regular file named with a rank that starts like a dump."""
    try:
        if rank_of(path) is None or not stat.S_ISREG(path.stat().st_mode):
            return False
        with open(path, "rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head[:1] == b"\x80" or (head.lstrip()[:1] == b"{" and b'"' in head)


def _frames(entry: dict) -> list[dict]:
    frames = entry.get("frames")
    return [f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else []


def _sites(frames: list[dict]) -> list[Site]:
    """The user's frames, innermost first (dumps list the innermost frame first), with the
    source ``ddpdoctor run`` captured into its own dumps."""
    sites = []
    for f in frames:
        try:
            sites.append(site_from({**f, "file": f.get("filename", "?"),
                                    "function": f.get("name", "?")}))
        except (TypeError, ValueError):
            continue
    return [s for s in sites if not is_internal_file(s.file)][:6]


def _collective(rank: int, entry: dict, index: int) -> Collective:
    name = str(entry.get("profiling_name", "")).split(":")[-1]
    p2p = bool(entry.get("is_p2p"))
    sizes = [list(map(int, s)) for s in entry.get("input_sizes") or [] if isinstance(s, list)]
    frames = _frames(entry)
    group = entry.get("process_group")
    state = str(entry.get("state", ""))
    return Collective(
        rank=rank, id=index + 1, group=str(group[0]) if isinstance(group, (list, tuple)) and group
        else str(entry.get("pg_id", "0")),
        seq=None if p2p else int(entry.get("collective_seq_id") or 0),
        p2p_seq=int(entry.get("p2p_seq_id") or 0) if p2p else None,
        op=ops.FR_NAMES.get(name, name), label=ddp_sites.label_from_frames(
            [(str(f.get("filename", "")), str(f.get("name", ""))) for f in frames]),
        shapes=sizes, dtypes=[_DTYPES.get(str(d), str(d).lower())
                              for d in entry.get("input_dtypes") or []],
        numel=numel(sizes), t=float(entry.get("time_created_ns") or 0) / 1e9,
        state=schema.COMPLETED if state == "completed" else schema.PENDING,
        stack=_sites(frames))


def read_dump(path: Path, rank: int | None = None) -> RankTrace:
    """One rank's dump as a :class:`RankTrace` (raises :class:`DumpError`, also for a dump
    whose fields are not of the types torch writes)."""
    try:
        return _read_dump(path, rank)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError,
            RecursionError) as exc:
        raise DumpError(f"{path}: a damaged flight-recorder dump ({type(exc).__name__}: "
                        f"{str(exc)[:200]})") from None


def _read_dump(path: Path, rank: int | None) -> RankTrace:
    """:func:`read_dump`. Only the last collective of each group keeps a state other than
    completed: a dump lists what was issued, and gloo's records never say completed."""
    dump = load(path)
    rank = rank if rank is not None else rank_of(path)
    if rank is None:
        raise DumpError(f"{path}: no rank in the file name (e.g. nccl_trace_rank_0)")
    entries = [e for e in dump["entries"] if isinstance(e, dict)]
    colls = [_collective(rank, e, i) for i, e in enumerate(entries)]
    last: dict[str, Collective] = {}
    for c in colls:
        if c.seq is not None:
            last[c.group] = c
    done = _completed_through(dump.get("pg_status"), entries, colls)
    for c in colls:
        if c.seq is not None and (last.get(c.group) is not c or
                                  (c.seq or 0) <= done.get(c.group, 0)):
            c.state = schema.COMPLETED
    trace = RankTrace(rank=rank, path=str(path), run_id="flight-recorder", version=0)
    trace.collectives = colls
    groups = dump.get("pg_config")
    world = None
    if isinstance(groups, dict):
        for name, cfg in groups.items():
            ranks = _ranks(cfg.get("ranks") if isinstance(cfg, dict) else None)
            trace.groups[str(name)] = Group(str(name), str((cfg or {}).get("desc", "")), ranks)
            world = max(world or 0, len(ranks))
    trace.process = {"rank": rank, "world_size": world, "source": "flight-recorder"}
    trace.init = "completed"
    return trace


def _completed_through(status: object, entries: list[dict],
                       colls: list[Collective]) -> dict[str, int]:
    """Per group, the sequence number up to which the dump's ``pg_status`` says every
    collective completed (a rank whose last collective completed waits in none of them).
    ``pg_status`` is keyed by the entries' ``pg_id``."""
    if not isinstance(status, dict):
        return {}
    group_of = {str(e.get("pg_id")): c.group for e, c in zip(entries, colls)}
    out: dict[str, int] = {}
    for pg_id, fields in status.items():
        group = group_of.get(str(pg_id))
        if group is None or not isinstance(fields, dict):
            continue
        try:
            out[group] = int(fields.get("last_completed_collective", -1))
        except (TypeError, ValueError):
            continue
    return out


def _ranks(value: object) -> list[int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return []
    return [int(r) for r in value if isinstance(r, int)] if isinstance(value, list) else []


def align_windows(traces: dict[int, RankTrace]) -> list[str]:
    """Make every rank's collectives of a group start at the same sequence number, renumbered
    from 1: a ring buffer keeps each rank's last N, which start at different points. Returns
    notes on what was cut."""
    first: dict[str, int] = {}
    for trace in traces.values():
        seen: dict[str, int] = {}
        for c in trace.collectives:
            if c.seq is not None:
                seen[c.group] = min(seen.get(c.group, c.seq), c.seq)
        for group, seq in seen.items():
            first[group] = max(first.get(group, 1), seq)
    notes = []
    for group, start in sorted(first.items()):
        if start > 1:
            notes.append(f"flight-recorder dumps: group {group} is compared from its collective "
                         f"#{start} on, the oldest every rank's ring buffer still held")
    for trace in traces.values():
        kept = []
        for c in trace.collectives:
            if c.seq is not None:
                start = first.get(c.group, 1)
                if c.seq < start:
                    continue
                c.seq -= start - 1
            kept.append(c)
        for i, c in enumerate(kept):
            c.id = i + 1
        trace.collectives = kept
    return notes
