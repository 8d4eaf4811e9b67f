"""Where a rank is, from the stacks and counters ``ddpdoctor attach`` read from outside.

A pure function of one rank's :class:`~ddpdoctor.trace.snapshot.RankSnapshot`: the rank is
*waiting* in a collective (its main thread inside a ``torch.distributed`` call, DDP's or the
join protocol's, or DDP's reducer at the end of a backward, and not moving), *busy* or
*blocked* outside collectives (using CPU or moving, or not), in ``init_process_group``,
*ended* (its main thread finished: Python waits for its other threads), *gone* (no process),
or *unknown* (no stack could be read). The thresholds are the hang rules' own
(:mod:`ddpdoctor.analysis.hang_rules`); the DDP labels are the runtime's
(:mod:`ddpdoctor.trace.ddp_sites`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.analysis.hang_rules import BUSY_CPU, STILL_IO, STILL_TREE_CPU
from ddpdoctor.trace import ddp_sites, ops
from ddpdoctor.trace.model import Site, is_internal_file, site_from
from ddpdoctor.trace.snapshot import Frame, RankSnapshot, Sample
from ddpdoctor.trace.words import Word

# The point-to-point ops as torch.distributed's functions name them (the backend's: ops.P2P).
P2P_OPS = ops.P2P | {"isend", "irecv", "batch_isend_irecv"}
# The collective each DDP / join label stands for.
LABEL_OPS = {"ddp.bucket": "all_reduce", "ddp.unused_params": "all_reduce",
             "ddp.buffers": "broadcast", "ddp.rebuild_buckets": "broadcast",
             "ddp.init.sync_params": "broadcast", "ddp.init.verify_params": "all_gather",
             "ddp.init": "broadcast", "syncbn": "all_gather"}
# Native frames of a rank blocked on a collective's completion (gloo, NCCL, DDP's reducer).
_NATIVE_WAIT = re.compile(r"c10d::.*(::wait\w*|Reducer::finalize_backward)|gloo::.*(wait|recv)",
                          re.I)
_ARGS = ("src", "dst", "tag", "group_src", "group_dst")
PTRACE_FIX = ("run ddpdoctor attach as the user that owns the job's processes, or as root; "
              "inside a container it needs CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE); "
              "check /proc/sys/kernel/yama/ptrace_scope (0 lets a user read its own processes)")


class Where(Word):
    """Where a rank's main thread was through every sample."""

    WAITING = "waiting"  # inside a collective, not moving
    INIT = "init"  # inside init_process_group's rendezvous
    BUSY = "busy"  # outside collectives (or through them), moving or using CPU
    BLOCKED = "blocked"  # outside collectives, at one place, using no CPU
    ENDED = "ended"  # the script's main thread ended; the process waits for other threads
    GONE = "gone"  # no process
    UNKNOWN = "unknown"  # no stack could be read


@dataclass
class RankView:
    """One rank, as the stacks show it."""

    rank: int
    where: Where
    op: str | None = None
    label: str | None = None
    site: Site | None = None  # the first frame of the user's code
    stack: list[Site] = field(default_factory=list)  # user frames, innermost first
    args: dict[str, str] = field(default_factory=dict)  # the collective's plain arguments
    user_locals: dict[str, str] = field(default_factory=dict)
    call: str = ""  # the innermost library function (a blocked or busy rank's)
    cpu_share: float | None = None
    moved: bool = False
    note: str = ""

    @property
    def in_collective(self) -> bool:
        return self.where in (Where.WAITING, Where.INIT)

    @property
    def p2p(self) -> bool:
        return self.op in P2P_OPS


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def _python(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if not f.native]


def _user_frames(frames: list[Frame]) -> list[Frame]:
    """The user's frames, innermost first."""
    return [f for f in _python(frames) if f.line > 0 and not is_internal_file(f.file)]


def _api_frame(frames: list[Frame]) -> Frame | None:
    """The outermost public ``torch.distributed`` function on the stack (the user's call)."""
    found = None
    for f in _python(frames):
        if _norm(f.file).endswith(ddp_sites.API_FILE) and not f.function.startswith("_"):
            found = f
    return found


def _collective(frames: list[Frame]) -> tuple[str | None, str | None, dict[str, str]]:
    """(op, label, args) of the collective the frames are inside, or (None, None, {})."""
    py = _python(frames)
    pairs = [(f.file, f.function.rsplit(".", 1)[-1]) for f in py]
    label = ddp_sites.label_from_frames(pairs)
    api = _api_frame(frames)
    if label != ddp_sites.USER:
        return LABEL_OPS.get(label, "all_reduce"), label, {}  # join's are all all_reduce
    if api is not None:
        args = {k: v for k, v in api.locals.items() if k in _ARGS}
        return api.function, ddp_sites.USER, args
    return None, None, {}


def _in_init(frames: list[Frame]) -> bool:
    return any(_norm(f.file).endswith(suffix) and f.function == function
               for f in _python(frames) for suffix, function in ddp_sites.INIT_FUNCTIONS)


def _ended(sample: Sample) -> bool:
    main = sample.main
    if main is None:
        return bool(sample.threads)  # other threads run, the main thread is gone
    py = _python(main.frames)
    return not py or (py[-1].function == "_shutdown" and _norm(py[-1].file).endswith(
        "threading.py"))


def _key(sample: Sample) -> tuple:
    main = sample.main
    return tuple((f.file, f.function, f.line) for f in _python(main.frames)) if main else ()


def _native_wait(sample: Sample) -> bool:
    main = sample.main
    return main is not None and any(f.native and _NATIVE_WAIT.search(f.function)
                                    for f in main.frames)


def _rate(first: Sample, last: Sample, value: str) -> float | None:
    a, b = getattr(first, value), getattr(last, value)
    span = last.t - first.t
    if a is None or b is None or span <= 0:
        return None
    return (b - a) / span


def view(snap: RankSnapshot) -> RankView:
    """Classify one rank (see the module's docstring)."""
    if snap.pid is None:
        return RankView(snap.rank, Where.GONE, note=snap.note)
    readable = [s for s in snap.samples if not s.error and s.threads]
    if not readable:
        why = next((s.error for s in snap.samples if s.error), snap.note or "no sample")
        return RankView(snap.rank, Where.UNKNOWN, note=why)
    python_samples = [s for s in readable if not any(f.native for t in s.threads
                                                      for f in t.frames)] or readable
    last = readable[-1]
    main = last.main
    frames = main.frames if main else []
    user = _user_frames(frames)
    stack = [site_from(vars(f)) for f in user]
    moved = len({_key(s) for s in python_samples}) > 1
    cpu = _rate(readable[0], python_samples[-1], "cpu")
    io = _rate(readable[0], python_samples[-1], "io")
    base = RankView(snap.rank, Where.BUSY, site=stack[0] if stack else None, stack=stack,
                    user_locals=dict(user[0].locals) if user else {}, cpu_share=cpu,
                    moved=moved, note=snap.note)
    py = _python(frames)
    base.call = py[0].function if py and is_internal_file(py[0].file) else ""
    if _ended(last):
        base.where = Where.ENDED
        return base
    still = not moved and (cpu is None or cpu < BUSY_CPU)
    if _in_init(frames):
        base.where = Where.INIT if still else Where.BUSY
        return base
    # Inside a backward with no collective call of its own, the label is DDP's gradient
    # all-reduce (ddp_sites.label_from_frames): waiting there when it sits still.
    op, label, args = _collective(frames)
    if op is None and _native_wait(last):
        op, label = "wait", ddp_sites.USER
    if op is not None:
        base.op, base.label, base.args = op, label, args
        base.where = Where.WAITING if still else Where.BUSY
        return base
    idle = not moved and cpu is not None and cpu < STILL_TREE_CPU and \
        (io is None or io < STILL_IO)
    base.where = Where.BLOCKED if idle else Where.BUSY
    return base
