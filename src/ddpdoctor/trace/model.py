"""In-memory form of loaded traces: what the analysis and the reporters work on.

These are plain dataclasses so that tests can build runs by hand (see
``tests/unit/factories.py``) without any torch process.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ddpdoctor.trace.schema import Stop

_INTERNAL_FILE = re.compile(
    r"[/\\](site|dist)-packages[/\\]"
    r"|[/\\]ddpdoctor[/\\](runtime|trace|analysis)[/\\]"
    r"|[/\\]torch[/\\](distributed|nn|autograd|multiprocessing|utils|_tensor\.py)"
    r"|^<|[/\\]lib[/\\]python3[.\d]*[/\\](?!site-packages|dist-packages)")


@functools.lru_cache(maxsize=4096)  # asked for every frame of every rank's collectives
def is_internal_file(path: str) -> bool:
    """Whether ``path`` is not the user's own code: torch, ddpdoctor, an installed library or
    the Python standard library."""
    return bool(_INTERNAL_FILE.search(path))


@dataclass(frozen=True)
class Site:
    """A source location: the first frame outside torch and ddpdoctor, or a stack frame,
    with the source the rank captured there (``text``, ``indent``, enclosing ``blocks``:
    (line, header) innermost first) when it could read it."""

    file: str
    line: int
    function: str
    text: str = field(default="", compare=False)
    indent: int | None = field(default=None, compare=False)
    blocks: tuple[tuple[int, str], ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    @property
    def file_name(self) -> str:
        """The file's name without its folder (paths differ between nodes and users)."""
        return self.file.replace("\\", "/").rsplit("/", 1)[-1]

    @property
    def short(self) -> str:
        """'train.py:63': file name and line."""
        return f"{self.file_name}:{self.line}"


def site_from(frame: dict) -> Site:
    """A :class:`Site` from a frame record of a trace, its fields type-checked (raises
    TypeError or ValueError on a malformed one)."""
    if not isinstance(frame, dict):
        raise TypeError("a frame is not an object")
    indent = frame.get("indent")
    blocks = frame.get("blocks") or []
    return Site(str(frame.get("file", "?")), int(frame.get("line", 0) or 0),
                str(frame.get("function", "?")), text=str(frame.get("text") or ""),
                indent=indent if isinstance(indent, int) and not isinstance(indent, bool)
                else None,
                blocks=tuple((int(b[0]), str(b[1])) for b in blocks
                             if isinstance(b, (list, tuple)) and len(b) == 2))


@dataclass
class Collective:
    """One collective or point-to-point operation issued by one rank."""

    rank: int
    id: int
    group: str
    seq: int | None
    op: str
    label: str = "user"
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    numel: int = 0
    reduce_op: str | None = None
    root: int | None = None
    peer: int | None = None
    p2p_seq: int | None = None
    api: str | None = None
    bucket: int | None = None
    iteration: int | None = None
    t: float = 0.0
    state: str = "completed"
    t_end: float | None = None
    stack: list[Site] = field(default_factory=list)
    # What decides a match beyond the tensors (format 7; None where not recorded): elements
    # sent to / expected from each rank of the group by group rank, elements per row of an
    # all_to_all_single, and a point-to-point tag.
    sends: tuple[int, ...] | None = None
    recvs: tuple[int, ...] | None = None
    row: int | None = None
    tag: int | None = None

    @property
    def site(self) -> Site | None:
        """The line that issued it: the innermost recorded frame of the user's own code (the
        stack starts outside torch, and may start in the standard library or an installed
        package: ``contextlib`` for ``dist._coalescing_manager``), else the innermost."""
        for site in self.stack:
            if not is_internal_file(site.file):
                return site
        return self.stack[0] if self.stack else None


@dataclass(frozen=True)
class GroupPositions:
    """One rank's collectives in one process group, by position (``seq - 1``): which
    prototype each is (an index into :attr:`CollectiveIndex.protos`; -1 where a lost line
    leaves the position unknown), and the collectives themselves (None there)."""

    codes: list[int]
    collectives: Sequence[Collective | None]


class CollectiveIndex(Protocol):
    """What the analysis reads of one rank's collectives, whichever reading path built them
    (:func:`ddpdoctor.trace.index.index_of` gives it for every rank)."""

    @property
    def protos(self) -> Sequence[Collective]:
        """One collective per distinct static part (group, op, tensors, label, stack...)."""

    def by_group(self) -> dict[str, GroupPositions]:
        """Per process group, this rank's collectives by position."""

    def p2p(self) -> list[Collective]:
        """The point-to-point operations, in file order."""

    def incomplete(self, window: int) -> list[Collective]:
        """The collectives among the last ``window`` that never completed, in order."""

    def used_stacks(self) -> list[list[Site]]:
        """The distinct call stacks of the collectives."""

    def last_iteration(self, window: int) -> int:
        """The highest DDP iteration among the last ``window`` collectives (0: none)."""


@dataclass(frozen=True)
class Completion:
    """What the last ``done`` record of a rank says: every collective with an id up to
    ``upto`` completed, except the ``pending`` ids and every id from ``pending_from`` on."""

    upto: int = 0
    pending: frozenset[int] = frozenset()
    pending_from: int | None = None

    def completed(self, cid: int) -> bool:
        return (cid <= self.upto and cid not in self.pending
                and (self.pending_from is None or cid < self.pending_from))


@dataclass
class Group:
    """A process group as one rank saw it at creation."""

    name: str
    desc: str = ""
    ranks: list[int] = field(default_factory=list)


@dataclass
class RankTrace:
    """Everything one rank recorded."""

    rank: int
    path: str = ""
    run_id: str = ""
    attempt: int = 0
    round: int = 0  # the process groups this rank's process made before: 0 for the first
    process: dict | None = None
    groups: dict[str, Group] = field(default_factory=dict)
    # A list when built by hand (tests); the reader stores a compact, lazily decoded
    # ddpdoctor.trace.compact.CollectiveLog: a read-only Sequence[Collective] either way.
    collectives: Sequence[Collective] = field(default_factory=list)
    ddp: list[dict] = field(default_factory=list)
    exception: dict | None = None
    hang: dict | None = None
    exit: dict | None = None
    init: str | None = None  # state of init_process_group: pending, completed or failed
    version: int = 0  # the trace format version of the file
    completion: Completion = field(default_factory=Completion)  # format 3: the last ``done``
    activity: dict | None = None  # the last ``activity`` record: the rank outside collectives
    cut: bool = False  # the rank could no longer write its trace (full disk): it ends early
    lost: str = ""  # why the rank stopped recording (a cut trace too), from a ``warning``
    cap: dict | None = None  # the ``cap`` record: the trace reached DDPDOCTOR_MAX_TRACE_MB
    warnings: list[str] = field(default_factory=list)
    thread_errors: list[dict] = field(default_factory=list)  # threads that died of an exception
    stderr_tail: str = ""  # the last bytes the rank's process wrote to its stderr
    damaged_lines: int = 0
    truncated: bool = False
    # Another node's rank, read from its detail (trace/detail.py): the end of its trace only,
    # its earlier positions unknown.
    remote: bool = False

    @property
    def world_size(self) -> int | None:
        return (self.process or {}).get("world_size")

    @property
    def cpu_mode(self) -> bool:
        """The rank ran under ``ddpdoctor run --cpu`` (CUDA mapped to the CPU)."""
        return (self.process or {}).get("cpu_mode") is True

    @property
    def finished(self) -> bool:
        """The script ran to its end on this rank (a later teardown abort does not count)."""
        return self.exit is not None and self.exit.get("status") == "finished"


@dataclass
class Run:
    """The traces of one job, by rank."""

    ranks: dict[int, RankTrace]
    world_size: int
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # What the launcher knew beyond the traces: each rank's exit code (negative: the signal)
    # from the process that started it, and why it stopped the job (hang, deadlock, stuck).
    exit_codes: dict[int, int] = field(default_factory=dict)
    stopped_for_hang: bool = False
    stop: Stop | None = None
    stop_reason: str = ""
    nnodes: int = 1  # nodes of the job: a rank without a trace may be on another node
    interrupted: bool = False  # the user stopped the job (Ctrl-C): what came after is unknown
    running: bool = False  # a `ddpdoctor run` still holds the folder: the job has not ended
    damaged: bool = False  # a file was left out as damaged: a clean verdict would claim too much

    @property
    def missing_ranks(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.ranks]
