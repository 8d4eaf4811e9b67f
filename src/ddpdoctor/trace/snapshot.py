"""The file ``ddpdoctor attach`` writes: every rank's stacks and counters, read from outside.

``attach.json`` (:data:`~ddpdoctor.trace.schema.SNAPSHOT_FILE`) is one JSON object per node:
the job found, and for each of its ranks on this node a few samples (its threads' stacks with
the source of the user's frames, the process's CPU and I/O counters) and the evidence the job
left (the tail of the rank's stderr where it goes to a file, torchelastic's error file,
flight-recorder dumps). ``ddpdoctor diff`` reads it like a trace folder. The layout is
documented in ``docs/trace-format.md`` ("attach.json"); it is versioned by
:data:`~ddpdoctor.trace.schema.SNAPSHOT_VERSION`. Reading is bounded (:data:`MAX_BYTES`) and
checks every field's type: a damaged file raises :class:`SnapshotError`, never anything else.
Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ddpdoctor.trace import schema

MAX_BYTES = 64 * 1024 * 1024  # larger than any snapshot of 1,024 ranks with their stacks


class SnapshotError(ValueError):
    """An attach.json that cannot be read: its path and why."""


@dataclass
class Frame:
    """One frame of a thread's stack, innermost first in :attr:`Thread.frames`. A native frame
    (``native``) has no line. ``locals`` holds the frame's arguments and locals whose values
    are plain numbers, booleans or None (as py-spy prints them); user frames carry their
    source (``text``, ``indent``, ``blocks``, as a trace's frames do)."""

    function: str
    file: str
    line: int = 0
    native: bool = False
    locals: dict[str, str] = field(default_factory=dict)
    text: str = ""
    indent: int | None = None
    blocks: list[list] = field(default_factory=list)


@dataclass
class Thread:
    name: str
    tid: int
    main: bool
    frames: list[Frame] = field(default_factory=list)


@dataclass
class Sample:
    """One look at a rank: when, its process's CPU seconds and I/O bytes so far, its threads
    (empty with ``error`` set when the stack could not be read)."""

    t: float
    cpu: float | None
    io: int | None
    threads: list[Thread] = field(default_factory=list)
    error: str = ""

    @property
    def main(self) -> Thread | None:
        return next((t for t in self.threads if t.main), None)


@dataclass
class RankSnapshot:
    """What attach saw of one rank: its process, its samples, the evidence it left."""

    rank: int
    pid: int | None
    host: str = ""
    samples: list[Sample] = field(default_factory=list)
    stderr_tail: str = ""  # the end of what the rank wrote to stderr, where that is a file
    error_file: str = ""  # torchelastic's error file of the rank (its message and traceback)
    flight_recorder: str = ""  # the name of the rank's flight-recorder dump copied beside
    note: str = ""  # why something is missing ("no stack: permission denied ...")


@dataclass
class Snapshot:
    """One node's attach: the job, its ranks here, the ranks this node should hold."""

    host: str
    t: float
    kind: str  # how the job was launched: torchrun, mp.spawn, env
    world_size: int | None
    ranks: list[RankSnapshot] = field(default_factory=list)
    node_ranks: list[int] | None = None  # None: the environment does not say
    launcher: str = ""  # the launcher's command line (secrets masked)
    notes: list[str] = field(default_factory=list)


def write(snapshot: Snapshot, folder: Path) -> Path:
    """Write ``snapshot`` into ``folder`` (made if needed; readable by its owner only)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / schema.SNAPSHOT_FILE
    body = {"format": schema.SNAPSHOT_FORMAT, "version": schema.SNAPSHOT_VERSION,
            **asdict(snapshot)}
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(body, fh)
    os.replace(tmp, path)
    return path


def is_snapshot_folder(folder: Path) -> bool:
    return (folder / schema.SNAPSHOT_FILE).is_file()


def read(path: Path) -> Snapshot:
    """The snapshot in ``path`` (a folder or the file itself)."""
    if path.is_dir():
        path = path / schema.SNAPSHOT_FILE
    try:
        if path.is_symlink():
            raise SnapshotError(f"{path}: a link; ddpdoctor reads only the file itself")
        if path.stat().st_size > MAX_BYTES:
            raise SnapshotError(f"{path}: larger than {MAX_BYTES >> 20} MB, not a snapshot")
        body = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise SnapshotError(f"{path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    try:
        return _snapshot(body)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SnapshotError(f"{path}: damaged ({type(exc).__name__}: {exc})") from None


def _int(value: object, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, found {value!r:.40}")
    return value


def _num(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, found {value!r:.40}")
    return float(value)


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {value!r:.40}")
    return value


def _list(value: object) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, found {value!r:.40}")
    return value


def _frame(d: dict) -> Frame:
    blocks = [[_int(n), _str(t)] for n, t in _list(d.get("blocks", []))]
    local = d.get("locals", {})
    if not isinstance(local, dict):
        raise TypeError("locals is not an object")
    indent = d.get("indent")
    return Frame(function=_str(d["function"]), file=_str(d["file"]), line=_int(d["line"]) or 0,
                 native=bool(d.get("native", False)),
                 locals={_str(k): _str(v) for k, v in local.items()},
                 text=_str(d.get("text", "")), indent=_int(indent, none=True),
                 blocks=blocks)


def _sample(d: dict) -> Sample:
    threads = [Thread(name=_str(t["name"]), tid=_int(t["tid"]) or 0, main=bool(t["main"]),
                      frames=[_frame(f) for f in _list(t["frames"])])
               for t in _list(d.get("threads", []))]
    io = d.get("io")
    return Sample(t=_num(d["t"]) or 0.0, cpu=_num(d.get("cpu")),
                  io=_int(io, none=True), threads=threads, error=_str(d.get("error", "")))


def _rank(d: dict) -> RankSnapshot:
    return RankSnapshot(rank=_int(d["rank"]) or 0, pid=_int(d.get("pid"), none=True),
                        host=_str(d.get("host", "")),
                        samples=[_sample(s) for s in _list(d.get("samples", []))],
                        stderr_tail=_str(d.get("stderr_tail", "")),
                        error_file=_str(d.get("error_file", "")),
                        flight_recorder=_str(d.get("flight_recorder", "")),
                        note=_str(d.get("note", "")))


def _snapshot(body: object) -> Snapshot:
    if not isinstance(body, dict) or body.get("format") != schema.SNAPSHOT_FORMAT:
        raise ValueError(f"not a {schema.SNAPSHOT_FORMAT} file")
    version = body.get("version")
    if not isinstance(version, int) or version > schema.SNAPSHOT_VERSION:
        raise ValueError(f"version {version!r}; this ddpdoctor reads up to "
                         f"{schema.SNAPSHOT_VERSION}")
    node_ranks = body.get("node_ranks")
    return Snapshot(host=_str(body.get("host", "")), t=_num(body.get("t")) or 0.0,
                    kind=_str(body.get("kind", "")),
                    world_size=_int(body.get("world_size"), none=True),
                    ranks=[_rank(r) for r in _list(body.get("ranks", []))],
                    node_ranks=None if node_ranks is None else
                    [_int(n) or 0 for n in _list(node_ranks)],
                    launcher=_str(body.get("launcher", "")),
                    notes=[_str(n) for n in _list(body.get("notes", []))])
