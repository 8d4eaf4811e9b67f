"""Reads per-rank traces into a :class:`~ddpdoctor.trace.model.Run`, tolerating damage.

A rank killed mid-write leaves a cut-off last line; a full disk or a crash can leave junk.
Such lines are counted and skipped, never fatal. What is fatal (no traces, a foreign file, a
newer format, ranks of different runs mixed) raises :class:`TraceError` with one clear line.
JSON only: nothing read is ever unpickled or evaluated.

Files in the writer's exact layout take the fast path of :mod:`ddpdoctor.trace.compact`:
collective lines are interned by their repeating part instead of being decoded one by one,
and a rank's collectives become a compact, lazily decoded
:class:`~ddpdoctor.trace.compact.CollectiveLog`. Any other file is decoded record by record;
both paths build the same collectives.
"""

from __future__ import annotations

import fcntl
import fnmatch
import io
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ddpdoctor.trace import flight_recorder, issue_ring, padding, parallel, schema, shared_ref
from ddpdoctor.trace.compact import NotCompact, read_compact
from ddpdoctor.trace.identical import Membership, Shared, expand_member, read_shared
from ddpdoctor.trace.model import RankTrace, Run, is_internal_file
from ddpdoctor.trace.rank_text import rank_list
from ddpdoctor.trace.records import MAX_LINE, Fold, apply_record, is_int, line_chunks, parse_line
from ddpdoctor.trace.shared_ref import BadMember, NeedsClass

MAX_RANKS = 1 << 17  # a world size or rank beyond this is damage, not a job

# What Python's faulthandler writes for each fatal signal, and the exit code it means.
_FAULT_SIGNALS = {"Segmentation fault": -11, "Aborted": -6, "Floating point exception": -8,
                  "Bus error": -7, "Illegal instruction": -4}


class TraceError(Exception):
    """The input cannot be read as ddpdoctor traces; the message says why, in one line."""


class NoTraces(TraceError):
    """A log folder without any rank trace."""


# Files of a log folder that are ddpdoctor's own, never flight-recorder dumps.
_OWN_FILES = re.compile(r"^((rank|remote)-.*\.jsonl(\.cut|\.ring)?|exits-\d+\.json|job\.json"
                        r"|hang-.*"
                        r"|fault-\d+\.txt|stderr-\d+\.txt|agent-\d+"
                        r"|\.write-test|\.lock)$")


def _outside(path: Path, folder: Path) -> bool:
    """Whether ``path``, found in ``folder``, is a link to a file outside it."""
    try:
        return path.is_symlink() and path.resolve().parent != folder.resolve()
    except (OSError, RuntimeError):  # a loop of links
        return True


def _inputs(paths: Iterable[str | os.PathLike],
            notes: list[str]) -> tuple[list[Path], list[Path]]:
    """The trace files and the flight-recorder dumps under ``paths`` (folders or files). In a
    folder, a link to a file outside it is not followed (a note says so)."""
    files: list[Path] = []
    dumps: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found: list[Path] = []
            frs: list[Path] = []
            for p in sorted(path.iterdir()):
                trace = fnmatch.fnmatchcase(p.name, schema.TRACE_GLOB)
                if not trace and (_OWN_FILES.match(p.name) or
                                  not flight_recorder.looks_like_dump(p)):
                    continue
                if _outside(p, path):
                    notes.append(f"{p} links to a file outside its folder: not followed")
                else:
                    (found if trace else frs).append(p)
            if not found and not frs:
                raise NoTraces(f"no ddpdoctor traces (rank-*.jsonl) or flight-recorder dumps "
                               f"in {path}")
            files.extend(found)
            dumps.extend(frs)
        elif path.is_file():
            if not path.name.endswith(".jsonl") and flight_recorder.looks_like_dump(path):
                dumps.append(path)
            else:
                files.append(path)
        else:
            raise TraceError(f"no such file or folder: {path}")
    if not files and not dumps:
        raise TraceError("no trace files given")
    return files, dumps


def _merge_remote(ranks: dict[int, RankTrace], folders: set[Path], notes: list[str]) -> None:
    """Other nodes' ranks that this node fetched the detail of when the job was stopped
    (``remote-<rank>.jsonl``), where no folder read holds their own trace."""
    found = []
    runs = {t.run_id for t in ranks.values()}
    for folder in sorted(folders):
        for path in sorted(folder.glob(schema.REMOTE_GLOB))[:MAX_REMOTE]:
            try:
                _regular(path)
                with open(path, "rb") as fh:
                    trace = _read_records(path, padding.open_data(fh))
            except (TraceError, OSError):
                continue
            if trace.remote and 0 <= trace.rank < MAX_RANKS and trace.rank not in ranks \
                    and trace.collectives and (not runs or trace.run_id in runs):
                ranks[trace.rank] = trace
                found.append(trace.rank)
    if found:
        notes.append(f"{rank_list(sorted(found))} ran on other nodes: the end of their traces "
                     f"came through the job's store when the job was stopped or ended (earlier "
                     f"collectives are in their own nodes' log folders)")


MAX_REMOTE = 64  # other nodes' ranks read from their details


def _merge_dumps(ranks: dict[int, RankTrace], dumps: list[Path], notes: list[str]) -> None:
    """Ranks known only from flight-recorder dumps, or whose trace holds no collective (a
    backend ddpdoctor did not record): their collectives come from their dump."""
    from_dumps: dict[int, RankTrace] = {}
    for path in dumps:
        try:
            fr = flight_recorder.read_dump(path)
        except flight_recorder.DumpError as exc:
            notes.append(f"skipped {exc}")
            continue
        own = ranks.get(fr.rank)
        if own is not None and own.collectives:
            continue
        if own is not None:
            own.collectives = fr.collectives
            from_dumps[fr.rank] = own
        else:
            ranks[fr.rank] = from_dumps[fr.rank] = fr
        notes.append(f"rank {fr.rank}: collectives from its flight-recorder dump {path.name} "
                     f"(no reduce op, root or DDP iteration recorded there)")
    if from_dumps:
        notes.extend(flight_recorder.align_windows(from_dumps))


def _regular(path: Path) -> None:
    """Refuse what is not a regular file (a FIFO would block ``open`` forever)."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise TraceError(f"{path} is not a regular file")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None


def read_rank(path: Path, pool: Shared | None = None) -> RankTrace:
    """Read one rank's trace file (``pool`` lets ranks with identical collective sequences
    share one copy of it, and read identical ranks' files by comparing bytes). A member file
    (format 8) is read through the file of its folder that holds its collective lines; a
    rank killed before its writer wrote its last collectives' lines is read with those its
    issue ring holds (:mod:`~ddpdoctor.trace.issue_ring`)."""
    trace = _read_file(path, pool)
    tail = _ring_tail(path, trace)
    if not tail:
        return trace
    out = _read_records(path, io.BytesIO(_with_tail(path, tail)))
    out.truncated = trace.truncated
    return out


def trace_data(path: Path) -> bytes:
    """The bytes of the trace at ``path`` as :func:`read_rank` reads them: its data (a member
    file's lines filled in, no padding), and the lines its issue ring adds for a rank killed
    before its writer wrote them. Raises :class:`TraceError` for a file that is no trace."""
    return _with_tail(path, _ring_tail(path, _read_file(path, None)))


def _with_tail(path: Path, tail: bytes) -> bytes:
    """The trace's data, and ``tail`` (lines from its issue ring) after its last whole line."""
    try:
        ref = shared_ref.of_file(str(path))
        if ref is not None:
            data = expand_member(str(path), ref)
        else:
            with open(path, "rb") as fh:
                data = padding.open_data(fh).read()
    except BadMember as exc:
        raise TraceError(str(exc)) from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None
    return _before_cut(data) + tail if tail else data


def _ring_tail(path: Path, trace: RankTrace) -> bytes:
    """The lines, newline-ended, of the collectives ``trace``'s rank left only in its issue
    ring (it was killed before its writer's look wrote them); nothing for a closed trace."""
    if trace.exit is not None or trace.version < issue_ring.SINCE_VERSION:
        return b""  # a closed trace holds every line
    last = trace.collectives[-1].id if trace.collectives else 0
    lines = issue_ring.tail_lines(str(path), last if isinstance(last, int) else 0)
    return "".join(line + "\n" for line in lines).encode()


def _before_cut(data: bytes) -> bytes:
    """``data`` without a last line cut off mid-write (the ring holds it whole, if it was a
    collective's)."""
    return data[:data.rfind(b"\n") + 1]


def write_ring_tails(folder: Path) -> None:
    """Append to the trace of each rank killed before its writer's look the lines its issue
    ring holds, and delete every ring: the files are then plain JSON Lines (the launcher
    does this once the job's processes have ended, after trimming their padding). A ring
    whose trace cannot be read stays, for a later reader."""
    for ring in folder.glob(schema.TRACE_GLOB + issue_ring.SUFFIX):
        path = ring.with_name(ring.name[:-len(issue_ring.SUFFIX)])
        try:
            tail = _ring_tail(path, _read_file(path, None))
            if tail:
                with open(path, "r+b") as fh:
                    fh.truncate(len(_before_cut(padding.open_data(fh).read())))
                    fh.seek(0, os.SEEK_END)
                    fh.write(tail)
            ring.unlink()
        except (TraceError, OSError):
            continue


def _read_file(path: Path, pool: Shared | None) -> RankTrace:
    """:func:`read_rank` of the trace file alone."""
    _regular(path)
    ref = shared_ref.of_file(str(path))
    if ref is not None and pool is None:
        pool = Shared()
    try:
        try:
            trace = _read_fast(path, pool)
        except NeedsClass as need:
            _read_holder(Path(need.path), pool)
            try:
                trace = _read_fast(path, pool)
            except NeedsClass:
                trace = None
        if trace is None:
            if ref is not None:
                trace = _read_records(path, io.BytesIO(expand_member(str(path), ref)))
            else:
                with open(path, "rb") as fh:
                    trace = _read_records(path, padding.open_data(fh))
        return trace
    except BadMember as exc:
        raise TraceError(str(exc)) from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None


def _read_fast(path: Path, pool: Shared | None) -> RankTrace | None:
    with open(path, "rb") as fh:
        read = _read_compact(path, padding.open_data(fh), pool)
    return read[0] if read is not None else None


def membership(path: Path, pool: Shared) -> Membership | None:
    """Read the trace file at ``path`` into ``pool``: the class of identical ranks whose lines
    it holds in full, and its own records, when ``pool`` knew the class already; else None
    (the file founded a class, or is read some other way). Raises :class:`TraceError` for a
    file that is no trace."""
    _regular(path)
    try:
        with open(path, "rb") as fh:
            read = _read_compact(path, padding.open_data(fh), pool)
    except (NeedsClass, BadMember):
        return None  # a member file already
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None
    return read[1] if read is not None else None


def _read_holder(path: Path, pool: Shared | None) -> None:
    """Read the file holding a member's collective lines into ``pool``, unless it is a member
    file itself (a member never holds another's lines) or cannot be read."""
    if pool is None or shared_ref.of_file(str(path)) is not None:
        return
    try:
        read_rank(path, pool)
    except TraceError:
        pass  # the member is then unreadable, and says why


# What the ranks read by this process share (a worker process's own copy, from the fork):
# made anew for each run read, dropped after it.
_shared = Shared()


def _read_batch(paths: list[Path]) -> list[RankTrace | str]:
    """Read these rank files; ranks with identical collective sequences share one copy. A
    file that is no trace (empty, foreign, of a newer format) gives why, in words."""
    out: list[RankTrace | str] = []
    for path in paths:
        try:
            out.append(read_rank(path, _shared))
        except TraceError as exc:
            out.append(str(exc))
    return out


def _bounded_lines(fh: BinaryIO) -> Iterator[tuple[bytes | None, bool]]:
    """The file's lines (:func:`~ddpdoctor.trace.compact.line_chunks`), each with whether it is
    the cut-off last line; an overlong line is None."""
    for lines, cut_off in line_chunks(fh):
        for line in lines:
            yield line, cut_off


def _read_records(path: Path, fh: BinaryIO) -> RankTrace:
    """The record-by-record path: every line decoded; damage counted, never fatal."""
    lines = _bounded_lines(fh)
    first, _ = next(lines, (b"", True))
    head = _header(path, first or b"")
    trace = _new_trace(path, head, False)
    trace.remote = head.get("partial") is True
    fold = Fold(collectives=[], partial=trace.remote)
    for raw, last in lines:
        trace.truncated = last  # no newline at the end: the rank was killed mid-write
        rec = parse_line(raw) if raw is not None else None
        if not isinstance(rec, dict) or not apply_record(trace, rec, fold):
            if not (last and raw is not None):  # a cut-off last line is expected
                trace.damaged_lines += 1
    trace.collectives = fold.collectives or []
    if trace.version >= 3:
        # Collective lines were written before the collective ran: ``done`` records say
        # which completed (failures have a ``state`` record of their own).
        done = trace.completion
        for c in trace.collectives:
            if c.state != schema.FAILED:
                c.state = schema.COMPLETED if done.completed(c.id) else schema.PENDING
    return trace


def _header(path: Path, line: bytes) -> dict:
    """The decoded header line, or the TraceError that says why the file is unusable."""
    if not line.strip():
        raise TraceError(f"{path} is empty: the rank died before writing anything")
    head = parse_line(line)
    if not isinstance(head, dict) or head.get("format") != schema.FORMAT:
        raise TraceError(f"{path} is not a ddpdoctor trace")
    version = head.get("version")
    if not is_int(version) or version < 1:
        raise TraceError(f"{path}: the header's version {version!r} is not a version number")
    if version > schema.VERSION:
        raise TraceError(f"{path} has trace format version {version}; this ddpdoctor reads "
                         f"version {schema.VERSION} and older: upgrade ddpdoctor")
    if "rank" not in head:
        raise TraceError(f"{path}: the header names no rank (a damaged file)")
    for key in ("rank", "attempt", "round"):
        value = head.get(key, 0)
        if not is_int(value) or not 0 <= value < MAX_RANKS:
            raise TraceError(f"{path}: the header's {key} {value!r} is not a rank number")
    return head


def _new_trace(path: Path, head: dict, truncated: bool) -> RankTrace:
    return RankTrace(rank=int(head.get("rank", -1)), path=str(path),
                     run_id=str(head.get("run_id", "")), attempt=int(head.get("attempt", 0)),
                     round=int(head.get("round", 0)),
                     truncated=truncated, version=int(head.get("version", 0)),
                     cut=os.path.exists(schema.cut_marker(str(path))))


def _read_compact(path: Path, fh: BinaryIO,
                  pool: Shared | None) -> tuple[RankTrace, Membership | None] | None:
    """The fast path, reading the file in chunks, with the class of identical ranks whose
    lines the file holds in full, if the pool knew one; None when the file needs the record-
    by-record path (which also reports a bad header)."""
    first = fh.readline(MAX_LINE + 1)
    if not first.endswith(b"\n"):
        return None  # header only, cut off, or oversized: leave it to the other path
    size = padding.file_size(fh)
    fh.seek(size - 1)
    truncated = fh.read(1) != b"\n"
    try:
        head = _header(path, first[:-1])
    except TraceError:
        return None
    trace = _new_trace(path, head, truncated)
    fh.seek(len(first))
    membership = None
    try:
        if pool is not None and trace.version >= 4:
            membership = read_shared(trace, fh, len(first), truncated, pool)
        else:
            read_compact(trace, fh, len(first), truncated)
    except NotCompact:
        return None
    return trace, membership


def fault_signal(path: Path) -> int | None:
    """The signal exit code recorded in a faulthandler file (``fault-<pid>.txt``), if any."""
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            return None
        with open(path, "rb") as fh:  # its first bytes name the signal; the file may be big
            text = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    for name, code in _FAULT_SIGNALS.items():
        if f"Fatal Python error: {name}" in text:
            return code
    return None


def _small_json(path: Path, limit: int = 1 << 20) -> dict:
    """A small JSON object file written by ddpdoctor's launcher or the job's top process;
    {} when missing, not a regular file, too large or malformed."""
    try:
        if not path.is_file() or path.stat().st_size > limit:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _exit_codes(ranks: dict[int, RankTrace], folders: set[Path]) -> dict[int, int]:
    """Each rank's exit code: what the process that started it saw (``exits-*.json``, written
    by torchrun's agent or the spawning script), else the signal of a faulthandler file."""
    by_pid: dict[int, int] = {}
    for folder in folders:
        for path in sorted(folder.glob(f"{schema.EXITS_PREFIX}*.json")):
            for pid, code in (_small_json(path).get("exit_codes") or {}).items():
                if str(pid).isdigit() and isinstance(code, int) and not isinstance(code, bool):
                    by_pid[int(pid)] = code
    codes = {}
    for rank, trace in ranks.items():
        pid = (trace.process or {}).get("pid")
        if not isinstance(pid, int):
            continue
        code = by_pid.get(pid)
        if code is None:
            code = fault_signal(Path(trace.path).parent / schema.fault_file(pid))
        if code is not None:
            codes[rank] = code
    return codes


STDERR_READ = 64 * 1024  # the most of a rank's stderr tail that is read


def _read_stderr_tails(ranks: dict[int, RankTrace]) -> None:
    """Each rank's last stderr bytes (``stderr-<pid>.txt`` next to its trace), as text."""
    for trace in ranks.values():
        pid = (trace.process or {}).get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool):
            continue
        path = Path(trace.path).parent / schema.stderr_file(pid)
        try:
            if not stat.S_ISREG(path.stat().st_mode):
                continue
            with open(path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - STDERR_READ))
                trace.stderr_tail = fh.read(STDERR_READ).decode("utf-8", "replace")
        except OSError:
            continue


def wait_for_tails(logdir: str, timeout: float = 2.0) -> None:
    """Once the job has ended, give the ranks' stderr copiers (``runtime/stderr_tail.py``, each
    holding a lock on its file while it runs) up to ``timeout`` seconds in all to write the
    last bytes their ranks wrote: a rank's death is their end of input, and they may still be
    copying what it said while dying."""
    deadline = time.monotonic() + timeout
    try:
        names = [n for n in os.listdir(logdir) if n.startswith("stderr-") and n.endswith(".txt")]
    except OSError:
        return
    for name in names:
        try:
            fd = os.open(os.path.join(logdir, name), os.O_RDONLY)
        except OSError:
            continue
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        return
                    time.sleep(0.02)
        finally:
            os.close(fd)


def _job_records(folders: set[Path],
                 notes: list[str]) -> tuple[schema.Stop | None, str, int, bool]:
    """What the launchers wrote (``job.json``): why one stopped the job (hang, deadlock or
    stuck), the number of nodes of the job, and whether the user interrupted it; a launcher
    that could not watch the whole job says why, and what else it did, in ``notes``."""
    stop: schema.Stop | None = None
    reason, nnodes, interrupted = "", 1, False
    for folder in sorted(folders):
        job = _small_json(folder / schema.JOB_FILE)
        more = job.get("notes")
        said = [job.get("unwatched"), *(more if isinstance(more, list) else [])]
        notes.extend(note[:400] for note in said if isinstance(note, str) and note)
        stopped = job.get("stopped")
        if stopped in {s.value for s in schema.Stop} and stop is None:
            stop, reason = schema.Stop(stopped), str(job.get("reason", ""))
        if isinstance(job.get("nnodes"), int) and not isinstance(job.get("nnodes"), bool):
            nnodes = max(nnodes, job["nnodes"])
        interrupted = interrupted or job.get("interrupted") is True
    return stop, reason, nnodes, interrupted


MAX_LEFT_OUT_NOTES = 8  # files left out named one by one; the rest counted


def _read_ranks(files: list[Path], notes: list[str],
                on_file: Callable[[int, int], None] | None,
                left_out: list[Path]) -> dict[int, dict[int, RankTrace]]:
    """Every rank's latest trace among ``files``, by round then rank, read in worker
    processes when it pays; files that are no trace go to ``left_out``, with a note."""
    rounds: dict[int, dict[int, RankTrace]] = {}
    earlier: dict[int, list[RankTrace]] = {}  # torchrun attempt -> its ranks' traces
    traces = parallel.in_batches(_read_batch, files, parallel.workers_for(files))
    members = _MemberLists()
    for done, (path, trace) in enumerate(zip(files, traces), start=1):
        if on_file is not None:
            on_file(done, len(files))
        if isinstance(trace, str):  # one unusable file is a note, not the end of the reading
            if len(left_out) < MAX_LEFT_OUT_NOTES:
                notes.append(f"{trace}: left out")
            left_out.append(path)
            continue
        members.share(trace)
        ranks = rounds.setdefault(trace.round, {})
        other = ranks.get(trace.rank)
        if other is not None:
            if other.attempt == trace.attempt:
                raise TraceError(f"two traces for rank {trace.rank}: {other.path} and {path}")
            # torchrun restarts write rank-N.attempt-K.jsonl: the latest attempt wins.
            old, trace = (trace, other) if other.attempt > trace.attempt else (other, trace)
            earlier.setdefault(old.attempt, []).append(old)
        ranks[trace.rank] = trace
    if len(left_out) > MAX_LEFT_OUT_NOTES:
        notes.append(f"{len(left_out) - MAX_LEFT_OUT_NOTES} more files that are no readable "
                     f"trace: left out")
    latest = max((t.attempt for ranks in rounds.values() for t in ranks.values()), default=0)
    for attempt, olds in sorted(earlier.items()):
        endings = "; ".join(f"rank {t.rank} {_ending_text(t)}"
                            for t in sorted(olds, key=lambda t: t.rank)[:8])
        more = f" (and {len(olds) - 8} more ranks)" if len(olds) > 8 else ""
        notes.append(f"torchrun restarted the job: this report is attempt {latest}'s; in "
                     f"attempt {attempt}, {endings}{more}")
    return dict(sorted(rounds.items()))


class _MemberLists:
    """Makes the equal member lists of ranks read by worker processes one list again: each
    batch of ranks comes with its own copy (the reader of one process shares them,
    ``records.parse_line``), and 16,384 ranks' copies of a 16,384-rank default group would
    hold the job's square in memory."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[list[int], list[int]]] = {}  # group -> (seen, kept)
        self.kept: dict[tuple[int, ...], list[int]] = {}

    def share(self, trace: RankTrace) -> None:
        for name, group in trace.groups.items():
            if len(group.ranks) < 256:
                continue
            seen = self.last.get(name)
            if seen is not None and group.ranks is seen[0]:  # the same batch as the last
                group.ranks = seen[1]
                continue
            kept = self.kept.setdefault(tuple(group.ranks), group.ranks)
            self.last[name] = (group.ranks, kept)
            group.ranks = kept


def _ending_text(trace: RankTrace) -> str:
    """How an earlier attempt's rank ended, in a few words ('raised ValueError: boom at
    train.py:12')."""
    exc = trace.exception
    if isinstance(exc, dict):
        frames = [f for f in exc.get("frames") or [] if isinstance(f, dict)]
        user = [f for f in frames if not is_internal_file(str(f.get("file", "")))]
        last = (user or frames)[-1] if (user or frames) else None
        at = (f" at {Path(str(last.get('file', '?'))).name}:{last.get('line', '?')}"
              if last else "")
        message = str(exc.get("message", "")).strip().splitlines()
        return (f"raised {str(exc.get('type', 'Exception'))[:80]}: "
                f"{(message[0] if message else '')[:120]}{at}")
    if isinstance(trace.exit, dict):
        return f"ended: {str(trace.exit.get('status', '?'))[:40]}"
    return "ended without an exit record (stopped by torchrun)"


def unreadable(exc: BaseException) -> str:
    """What to say of an error the reader did not foresee in some input (a field of another
    type, nesting too deep): damaged input is a message, never a traceback."""
    return (f"the traces could not be read ({type(exc).__name__}: {str(exc)[:300]}): a file "
            f"in the log folder is damaged")


def load_run(paths: Iterable[str | os.PathLike],
             on_file: Callable[[int, int], None] | None = None) -> Run:
    """Load the traces under ``paths`` (folders or files, e.g. one folder per node), and any
    flight-recorder dumps there; ``on_file(read, total)`` follows the reading, file by file.
    A script that made its process group several times (rounds) gives its last round here,
    with a note: :func:`load_rounds` gives each."""
    runs = load_rounds(paths, on_file)
    if len(runs) > 1:
        runs[-1].notes.append(f"the script made its process group {len(runs)} times (rounds): "
                              f"this is the last round's")
    return runs[-1]


def in_use(folder: Path) -> bool:
    """Whether a ``ddpdoctor run`` holds ``folder``'s lock: its job has not ended. (The run
    itself reads its folder while it holds the lock: it says otherwise.)"""
    try:
        fd = os.open(folder / schema.LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this call took
    return False


def load_rounds(paths: Iterable[str | os.PathLike],
                on_file: Callable[[int, int], None] | None = None) -> list[Run]:
    """One :class:`Run` per round, in order: a script that starts its ranks more than once
    (two ``mp.spawn`` calls, as PyTorch's DDP tutorial does) records each time in files of
    their own. Most jobs have one round. A launcher's stop (a hang) and flight-recorder dumps
    belong to the last round."""
    global _shared
    notes: list[str] = []
    files, dumps = _inputs(list(paths), notes)
    left_out: list[Path] = []
    _shared = Shared()
    try:
        rounds = _read_ranks(files, notes, on_file, left_out)
    finally:
        _shared = Shared()
    if not rounds:
        rounds = {0: {}}
    folders = {f.parent for f in files + dumps}
    stop, reason, nnodes, interrupted = _job_records(folders, notes)
    last = max(rounds)
    runs = []
    for number, ranks in rounds.items():
        final = number == last
        if final:
            _merge_remote(ranks, folders, notes)
            _merge_dumps(ranks, dumps, notes)
        run = _run_of(ranks, notes if final else [], folders)
        run.sources = [str(f) for f in files + dumps]
        run.nnodes = nnodes
        if final:
            run.stopped_for_hang, run.stop, run.stop_reason = stop is not None, stop, reason
            run.interrupted = interrupted
            run.running = any(in_use(folder) for folder in folders)
            run.damaged = run.damaged or bool(left_out)  # a left-out file may have diverged
        runs.append(run)
    return runs


def _run_of(ranks: dict[int, RankTrace], notes: list[str], folders: set[Path]) -> Run:
    """The run of one round's traces, with what they say of themselves in ``notes``."""
    if not ranks:
        more = f"; and {len(notes) - 3} more" if len(notes) > 3 else ""
        raise TraceError("no readable trace or flight-recorder dump: " + "; ".join(notes[:3])
                         + more)
    run_ids = {t.run_id for t in ranks.values()}
    if len(run_ids) > 1:
        raise TraceError("traces of different runs are mixed: run ids "
                         + ", ".join(sorted(repr(r) for r in run_ids)))
    notes = list(notes)
    told = [t.world_size for t in ranks.values() if is_int(t.world_size) and t.world_size > 0]
    sizes = set(told)
    if any(s > MAX_RANKS for s in sizes):
        notes.append(f"a world size beyond {MAX_RANKS} ranks was ignored (damaged header)")
        sizes = {s for s in sizes if s <= MAX_RANKS}
    damaged = False
    if sizes:
        # The world most ranks recorded: a file naming a rank outside it is damaged or stray
        # (a copy, another job's), never a rank of this job that the others disagree with.
        world = max(sizes, key=lambda s: (told.count(s), s))
        for r in sorted(r for r in ranks if r >= world):
            notes.append(f"{Path(ranks[r].path).name}: rank {r} is outside the {world}-rank "
                         f"world the other ranks recorded (a damaged or stray file): ignored")
            del ranks[r]
            damaged = True
        sizes = {s for s in sizes if s <= world} or {world}
        if not ranks:
            raise TraceError("; ".join(notes))
    world_size = max(sizes | {max(ranks) + 1})
    if len(sizes) > 1:
        notes.append(f"ranks disagree on the world size: {sorted(sizes)}")
    capped = sorted(r for r, t in ranks.items() if t.cap is not None)
    if capped:
        limit = (ranks[capped[0]].cap or {}).get("max_bytes")
        mb = limit / 2 ** 20 if is_int(limit) else 0
        notes.append(f"{rank_list(capped)}: the trace reached its size cap ({mb:g} MB, "
                     f"DDPDOCTOR_MAX_TRACE_MB); after it, collectives that repeat the rank's "
                     f"pattern are stored as runs and their times are interpolated")
    for trace in ranks.values():
        if trace.truncated:
            notes.append(f"rank {trace.rank}: last line cut off (the process was killed "
                         f"while writing); skipped")
        if trace.damaged_lines:
            notes.append(f"rank {trace.rank}: {trace.damaged_lines} damaged line(s) skipped")
    _read_stderr_tails(ranks)
    return Run(ranks=ranks, world_size=world_size, notes=notes,
               exit_codes=_exit_codes(ranks, folders), damaged=damaged)
