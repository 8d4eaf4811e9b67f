"""A generator of damaged log folders: every way a real log is seen to break, applied to a
base folder, each variant named.

The bases are written by the real trace writer (:mod:`tests.unit.writer_jobs`): a healthy job,
one whose rank 1 alone evaluates through DDP (diverged) and one whose rank 1 raised (crashed).
Each damage is deterministic (seeded), so a failing variant is reproduced by its name. What a
damaged variant may be diagnosed as is in :data:`ALLOWED`: damage may hide what happened (an
*incomplete* verdict, or a one-line refusal) but never invent it; a verdict other than the
undamaged folder's must carry a note the undamaged folder's report does not (the damaged
evidence named: a cut trace, a left-out file, lost lines).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from ddpdoctor.trace import schema

from .writer_jobs import writer_job

# Verdicts a damaged variant of each base may get ("error": refused with a message, exit 2).
ALLOWED = {
    "healthy": {"clean", "incomplete", "error"},
    "capped": {"clean", "incomplete", "error"},
    "diverged": {"diverged", "incomplete", "error"},
    "crashed": {"crashed", "incomplete", "error"},
}

Change = Callable[[Path], None]


def make_base(kind: str, folder: Path) -> Path:
    """A real writer's log folder of ``kind`` (healthy, capped: healthy past its size cap, with
    ``repeat`` runs; diverged or crashed), 2 ranks."""
    writer_job(folder, 8000 if kind == "capped" else None, world=2,
               iterations=300 if kind == "capped" else 40,
               eval_rank=1 if kind == "diverged" else None, eval_at=30)
    (folder / "exits-99.json").write_text(json.dumps({"exit_codes": {"100": 0, "101": 1 if kind
                                                                     == "crashed" else 0}}))
    if kind == "crashed":  # rank 1 raised in its last step instead of finishing
        path = folder / "rank-1.jsonl"
        lines = path.read_text().splitlines()
        lines[-1] = json.dumps({"kind": schema.EXCEPTION, "t": 2000.0, "type": "ValueError",
                                "message": "bad batch", "frames": [
                                    {"file": "/job/train.py", "line": 21, "function": "step"}]})
        lines.append(json.dumps({"kind": schema.EXIT, "t": 2000.1, "status": "exception",
                                 "code": 1}))
        path.write_text("\n".join(lines) + "\n")
    return folder


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")


def _write(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines))


def _drop_exit_codes(folder: Path) -> None:
    """Remove what the launcher recorded of the ranks' exit codes."""
    for p in folder.glob("exits-*.json"):
        p.unlink()


def _truncate_lines(rank: int, keep: int, drop_exits: bool) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        _write(path, _lines(path)[:keep] + [b""])
        if drop_exits:
            _drop_exit_codes(folder)
    return change


def _truncate_bytes(rank: int, fraction: float) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        data = path.read_bytes()
        path.write_bytes(data[:int(len(data) * fraction)])
    return change


def _nul_padded_header(rank: int) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        path.write_bytes(_lines(path)[0] + b"\n" + b"\0" * 4096)
    return change


def _line_edit(rank: int, seed: int, how: str) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        lines = _lines(path)
        rng = random.Random(seed)
        i = rng.randrange(1, max(2, len(lines) - 1))
        if how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "swap":
            j = rng.randrange(1, max(2, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "flip":
            if lines[i]:
                k = rng.randrange(len(lines[i]))
                lines[i] = lines[i][:k] + bytes([lines[i][k] ^ 0x20]) + lines[i][k + 1:]
        _write(path, lines)
    return change


# Values of other types and out of range, put into one field of one record.
ODD_VALUES: list[object] = ["abc", 10**30, -1, None, [[1]], {"a": 1}, 1.5, True, "\ud800",
                            [[[4160]]], 10**12, 3 * 10**8]


def _field(rank: int, kind: str, field: str, value: object) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        out = []
        done = False
        for raw in _lines(path):
            if not done and raw.strip():
                try:
                    rec = json.loads(raw)
                except ValueError:
                    out.append(raw)
                    continue
                if isinstance(rec, dict) and rec.get("kind") == kind and field in rec:
                    rec[field] = value
                    raw = json.dumps(rec).encode("utf-8", "surrogatepass")
                    done = True
            out.append(raw)
        _write(path, out)
    return change


def _drop_records(rank: int, kinds: tuple[str, ...], drop_exits: bool) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        _write(path, [ln for ln in _lines(path)
                      if not any(f'"kind": "{k}"'.encode() in ln[:40] for k in kinds)])
        if drop_exits:
            _drop_exit_codes(folder)
    return change


def _append(rank: int, rec: dict) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        lines = [ln for ln in _lines(path) if ln]
        _write(path, lines[:-1] + [json.dumps(rec).encode(), lines[-1], b""])
    return change


def _extra_file(name: str, content: Callable[[Path], bytes]) -> Change:
    def change(folder: Path) -> None:
        (folder / name).write_bytes(content(folder))
    return change


def _remove(name: str) -> Change:
    def change(folder: Path) -> None:
        (folder / name).unlink()
    return change


def _header_rank(rank: int, new: object) -> Change:
    def change(folder: Path) -> None:
        path = folder / f"rank-{rank}.jsonl"
        lines = _lines(path)
        head = json.loads(lines[0])
        head["rank"] = new
        lines[0] = json.dumps(head).encode()
        _write(path, lines)
    return change


def damages(seed: int = 0) -> Iterator[tuple[str, Change]]:
    """(name, change) of every damage, in a fixed order."""
    for rank in (0, 1):
        for keep in (1, 2, 5, 10, 17, 40, 120):
            for drop in (False, True):
                yield f"r{rank}-keep-{keep}-lines{'-no-exits' if drop else ''}", \
                    _truncate_lines(rank, keep, drop)
        for fraction in (0.1, 0.33, 0.5, 0.77, 0.99):
            yield f"r{rank}-cut-at-{fraction}", _truncate_bytes(rank, fraction)
        yield f"r{rank}-header-and-nul", _nul_padded_header(rank)
        for k in range(6):
            for how in ("delete", "duplicate", "swap", "flip"):
                yield f"r{rank}-{how}-{k}", _line_edit(rank, seed * 1000 + rank * 100 + k, how)
        for kind, fields in ((schema.COLLECTIVE, ("seq", "shapes", "op", "group", "stack",
                                                  "iteration", "numel", "sends", "tag")),
                             (schema.DONE, ("upto", "pending", "issued", "t")),
                             (schema.PROCESS_START, ("pid", "world_size", "rank")),
                             (schema.GROUP, ("ranks", "group")),
                             (schema.STACK, ("frames", "id")),
                             (schema.REPEAT, ("n", "back", "seq", "id_last", "t_last")),
                             (schema.EXIT, ("status", "code", "t")),
                             # A call site's static part (format 9): what collectives match on.
                             (schema.SITE, ("dtypes", "shapes", "op", "numel", "reduce_op"))):
            for field in fields:
                for v, value in enumerate(ODD_VALUES):
                    yield f"r{rank}-{kind}.{field}={v}", _field(rank, kind, field, value)
        # Values of the right type outside the schema (issue 53: a dtype set to "x" read as
        # a dtype mismatch on a collective that completed on both ranks).
        for field, value in (("dtypes", ["x"]), ("op", "all_reduce_x"), ("shapes", [[-4]])):
            yield f"r{rank}-site.{field}={value}", _field(rank, schema.SITE, field, value)
        for kinds in ((schema.EXIT,), (schema.EXCEPTION, schema.EXIT), (schema.DONE,)):
            for drop in (False, True):
                yield f"r{rank}-without-{'+'.join(kinds)}{'-no-exits' if drop else ''}", \
                    _drop_records(rank, kinds, drop)
        for new in (5, 131071, -1, "1", None):
            yield f"r{rank}-header-rank-{new}", _header_rank(rank, new)
        yield f"r{rank}-file-deleted", _remove(f"rank-{rank}.jsonl")
        yield f"r{rank}-file-empty", _extra_file(f"rank-{rank}.jsonl", lambda f: b"")
    for n in (10**12, 3 * 10**8):
        yield f"repeat-n-{n}", _append(1, {"kind": schema.REPEAT, "group": "0", "seq": 200,
                                            "n": n, "back": 5, "iteration_delta": 1,
                                            "id": 400, "id_last": 400 + n, "t": 1.0,
                                            "t_last": 2.0})
    yield "extra-rank-2", _extra_file("rank-2.jsonl",
                                      lambda f: (f / "rank-1.jsonl").read_bytes())
    yield "stray-dump-rank-5", _extra_file("nccl_trace_rank_5", lambda f: b'{"entries": []}')
    yield "stray-dump-huge-rank", _extra_file("nccl_trace_rank_99999999999",
                                              lambda f: b'{"entries": []}')
    yield "stray-empty-rank-5", _extra_file("rank-5.jsonl", lambda f: b"")
    yield "stray-foreign-rank-6", _extra_file("rank-6.jsonl", lambda f: b'{"rank": 6}\n')
    yield "job-json-garbage", _extra_file(schema.JOB_FILE, lambda f: b'{"stopped": [1], "n')
    yield "exits-garbage", _extra_file("exits-7.json", lambda f: b'{"exit_codes": {"x": "y"}}')
    yield "exits-deep", _extra_file("exits-8.json", lambda f: b"[" * 100_000 + b"]" * 100_000)


def variants(base: Path, out: Path, seed: int = 0) -> Iterator[tuple[str, Path]]:
    """Each damage applied to a fresh copy of ``base`` under ``out`` (one at a time: the copy
    is removed when the next is made)."""
    previous: Path | None = None
    for name, change in damages(seed):
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        folder = out / name
        shutil.copytree(base, folder)
        change(folder)
        previous = folder
        yield name, folder
