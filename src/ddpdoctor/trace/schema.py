"""The trace format: its name, its version and its record kinds, defined in one place.

A trace is one JSON Lines file per rank (``rank-<N>.jsonl``). Line 1 is a header naming
:data:`FORMAT` and :data:`VERSION`; every other line is a record whose ``kind`` is one of the
constants below. ``docs/trace-format.md`` documents every field for users. This module is
imported inside every training process, so it uses the standard library only.
"""

from __future__ import annotations

from ddpdoctor.trace.words import Word

FORMAT = "ddpdoctor-trace"
# 2: adds the ``cap`` and ``repeat`` records of a size-capped trace (DDPDOCTOR_MAX_TRACE_MB).
# 3: collective lines are written before the collective is issued (their ``state`` is always
#    ``pending``); completion comes in bulk as ``done`` records; ``activity`` records say what
#    a rank does while it issues no collective; the ``exception`` record carries the DDP
#    iteration. Versions 1 and 2 are read as before.
# 4: a collective line carries neither ``rank`` (the header has it) nor ``t``, and begins with
#    ``id``: equal collectives give equal lines on every rank, so readers compare identical
#    ranks' files by their bytes. Issue times come in the writer thread's ``done`` records
#    (``issued``). Version 3 is read as before.
# 5: the writer appends through a shared mapping of the file and trims it when it closes: the
#    trace of a rank killed before that ends in up to PAD_MAX NUL bytes, which readers skip.
#    The lines are those of version 4. Versions 3 and 4 are read as before.
# 6: ``thread_exception`` records (a thread of the rank died of an exception); a header may
#    carry ``round`` (the script made its process group again: rank-N.round-K.jsonl).
#    Versions 3 to 5 are read as before.
# 7: a collective's static part may carry what decides a match beyond its tensors: ``sends`` /
#    ``recvs`` (elements to and from each rank of the group: the split sizes of all_to_all,
#    the lists of gather and scatter), ``row`` (elements per row of all_to_all_single) and
#    ``tag`` (a point-to-point op's tag, when not 0). Versions 3 to 6 are read as before.
# 8: a file may be a *member* of another rank's file of the same folder (``ddpdoctor run``
#    rewrites a rank whose collective and stack lines are byte for byte another's once the
#    job has ended, ``trace/shared_lines.py``): each of those lines is left empty, and the
#    last line is a ``shared`` record naming the file that holds them. The lines of version 7
#    otherwise. Versions 3 to 7 are read as before.
# 9: a collective's static part (the COLLECTIVE_STATIC fields) is written once per call site,
#    as a ``site`` record, and each collective line names it (``"site": N``, right after
#    ``iteration``) instead of repeating it; the line has no ``state`` (always pending since
#    version 3): a line of DDP's gradient bucket is ~85 bytes instead of ~250. A ``done``
#    record's ``issued`` runs are [first id, first time, [µs after it, ...]]. Collective
#    lines that carry their static part inline and issue times in full (versions 4 to 8)
#    are read as before.
# 10: a collective's line is formatted by the writer's look, at most ``BUSY_LOOK_SECONDS`` after
#    the collective was issued (and before any other record): the issuing thread stores its
#    per-call fields in the rank's issue ring, ``<trace>.ring`` (trace/issue_ring.py), which
#    readers turn into the lines of a rank killed before its look. The lines of version 9.
#    Version 9 is read as before.
VERSION = 10
# The most NUL bytes a trace may end with (the writer's mapping window): more, and the file is
# damaged, not padded.
PAD_MAX = 256 * 1024

# Record kinds.
HEADER = "header"
PROCESS_START = "process_start"
GROUP = "group"
STACK = "stack"
COLLECTIVE = "collective"
STATE = "state"
DDP_INIT = "ddp_init"
EXCEPTION = "exception"
HANG = "hang"
EXIT = "exit"
WARNING = "warning"
PROGRESS = "progress"
CAP = "cap"  # the trace reached DDPDOCTOR_MAX_TRACE_MB: repeats are written as runs from here
REPEAT = "repeat"  # a run of collectives that repeat the static part of earlier ones
INIT = "init"  # init_process_group entered (state pending) and left (completed / failed)
DONE = "done"  # every collective with id <= upto completed, except those listed as pending
ACTIVITY = "activity"  # the rank is outside collectives: where its main thread is, its CPU
PEERS = "peers"  # several nodes: every rank's state, read from the job's c10d store
THREAD_EXCEPTION = "thread_exception"  # a thread of the rank died: its name, error and frames
SHARED = "shared"  # the last line of a member file: which file holds its empty lines (version 8)
SITE = "site"  # a call site's static part, which collective lines name by its id (version 9)

# The layout of a collective line, which the writer (``runtime/writer.py``) formats by hand and
# the reader's fast path (``trace/compact.py``) relies on byte for byte: these fields in this
# order, ``json.dumps`` spacing, then the variable fields present and the static part (the
# ``COLLECTIVE_STATIC`` fields present, in this order). From version 9: the head, SITE_REF,
# then ``p2p_seq`` and ``bucket`` when present (no ``state``); the static part is in a
# ``site`` record, ``{"kind": "site", "id": N, <static part>}``, written before the first
# line that names it (and its ``stack`` record before that). ``state`` lines are
# ``{"kind": "state", "id": N, "state": "...", "t": T}``. Every other record of a rank begins
# with ``{"kind": `` (RANK_RECORD). A file in any other layout is still read, record by record;
# ``tests/unit/test_compact_reader.py`` checks the writer keeps to it.
COLLECTIVE_HEAD = ("id", "kind", "seq", "iteration")
COLLECTIVE_HEAD_V3 = ("kind", "id", "rank", "seq", "iteration", "t")
RANK_RECORD = b'{"kind": '
# In a ``done`` record: [[first id, [issue time, ...]], ...]; from version 9 [[first id,
# first issue time, [µs after it, ...]], ...].
ISSUED = "issued"
COLLECTIVE_VARIABLE = ("state", "p2p_seq", "bucket")
SITE_REF = "site"  # version 9: after a collective line's iteration, the id of its site record
COLLECTIVE_STATIC = ("group", "op", "label", "shapes", "dtypes", "numel", "stack", "reduce_op",
                     "api", "root", "peer", "sends", "recvs", "row", "tag")

# Collective states.
PENDING = "pending"
COMPLETED = "completed"
FAILED = "failed"

# Exit statuses written by the rank itself.
RUNNING = "running"  # a rank's status before its exit record (the progress block's)
EXIT_FINISHED = "finished"
EXIT_EXCEPTION = "exception"
EXIT_FAILED = "failed"  # sys.exit() with a non-zero code
EXIT_MAX_STEPS = "max_steps"  # stopped by --max-steps at the start of iteration N+1

TRACE_GLOB = "rank-*.jsonl"
# Another node's rank, as much of its trace as the diagnosis needs (trace/detail.py): a rank
# with a trace of its own in the folders read is read from that instead.
REMOTE_GLOB = "remote-*.jsonl"
CUT_SUFFIX = ".cut"  # an empty file next to a trace whose writes failed (full disk)

# The other files of a log folder (docs/trace-format.md, "Other files in the log folder").
JOB_FILE = "job.json"  # the launcher's record: why it stopped the job
TORCHRUN_FILE = "torchrun.txt"  # torchrun's own failure summary, folded out of the terminal
REPORT_FILE = "report.txt"  # the whole report, of which a terminal shows the essentials
TRACEBACK_PREFIX = "traceback-rank-"  # traceback-rank-N.txt: a lost-peer traceback, folded
# ``ddpdoctor attach``: a job it did not start, read from outside (trace/snapshot.py). Its own
# format and version: 1 is the first.
SNAPSHOT_FILE = "attach.json"
SNAPSHOT_FORMAT = "ddpdoctor-attach"
SNAPSHOT_VERSION = 1


class Stop(Word):
    """Why the launcher stopped a running job: the ``stopped`` of ``job.json``, what the CLI
    prints and what the analysis reads (``analysis/hang_rules.py`` decides it)."""

    HANG = "hang"  # every live rank waited in a collective for the hang timeout
    DEADLOCK = "deadlock"  # the pending collectives provably can never match
    STUCK = "stuck"  # a rank blocked outside collectives (the others waiting for it)

    @property
    def headline(self) -> str:
        """What the launcher says when it stops a job for this reason."""
        return "rank stuck" if self is Stop.STUCK else "hang detected"
LOCK_FILE = ".lock"  # held by the one ddpdoctor run writing into the folder
EXITS_PREFIX = "exits-"  # exits-<pid>.json: worker exit codes from the process that started them
HANG_REQUEST = "hang-request.json"  # the launcher asks every rank for its evidence
NESTED_LAUNCH = "nested-launch.json"  # a torchrun rank was asked to spawn its own workers


# Every name ddpdoctor writes (or reads back) in a log folder: ``ddpdoctor run`` refuses a
# folder that holds one already, so that it never overwrites, nor reads, a file of the user's.
OWN_FILES = (TRACE_GLOB, TRACE_GLOB + CUT_SUFFIX, "rank-*.jsonl.*", REMOTE_GLOB, JOB_FILE,
             TORCHRUN_FILE, REPORT_FILE, f"{TRACEBACK_PREFIX}*.txt", SNAPSHOT_FILE,
             f"{EXITS_PREFIX}*.json", HANG_REQUEST, "hang-ack-*", NESTED_LAUNCH, "fr-rank-*.json",
             "stderr-*.txt", "agent-*", "fault-*.txt")


def traceback_file(rank: int) -> str:
    """The file of a rank's folded lost-peer traceback (runtime/user_traceback.py)."""
    return f"{TRACEBACK_PREFIX}{rank}.txt"


def remote_filename(rank: int) -> str:
    """The file of another node's rank's detail (:data:`REMOTE_GLOB`)."""
    return f"remote-{rank}.jsonl"


def cut_marker(trace_path: str) -> str:
    """Path of the marker a rank leaves when it could no longer write ``trace_path``."""
    return trace_path + CUT_SUFFIX


def hang_ack(rank: int) -> str:
    """The file a rank creates once it has written its hang evidence."""
    return f"hang-ack-{rank}"


def flight_recorder_file(rank: int) -> str:
    """PyTorch's flight-recorder dump of a rank ddpdoctor did not record itself (JSON, with
    the source of each frame captured by the rank)."""
    return f"fr-rank-{rank}.json"


def stderr_file(pid: int) -> str:
    """The last bytes process ``pid`` wrote to its stderr (``runtime/stderr_tail.py``)."""
    return f"stderr-{pid}.txt"


def agent_file(pid: int) -> str:
    """An empty file naming process ``pid`` a torchrun agent found under a launch command of
    the user's (``ddpdoctor run -- accelerate launch ...``): stopped outright, as torchrun's
    agent is, so that it prints no traceback over the diagnosis."""
    return f"agent-{pid}"


AGENT_PREFIX = "agent-"


def fault_file(pid: int) -> str:
    """Python's faulthandler output of process ``pid`` (a fatal signal's Python stack)."""
    return f"fault-{pid}.txt"


def trace_filename(rank: int, attempt: int = 0, round_: int = 0) -> str:
    """File name of rank ``rank``'s trace; torchrun restarts (attempts) and later rounds (the
    script created its process group again, e.g. a second ``mp.spawn``) get their own file."""
    name = f"rank-{rank}"
    if round_:
        name += f".round-{round_}"
    if attempt:
        name += f".attempt-{attempt}"
    return name + ".jsonl"


def header(rank: int, run_id: str, attempt: int, round_: int = 0) -> dict:
    """The first line of every trace file (``round`` only from the second round on)."""
    head = {"kind": HEADER, "format": FORMAT, "version": VERSION, "rank": rank,
            "run_id": run_id, "attempt": attempt}
    if round_:
        head["round"] = round_
    return head
