"""How each rank ended: finished, raised, was killed, hangs; and where it was left.

A rank is judged by what it recorded first (its ``exit`` and ``exception`` records) and by the
launcher's exit codes second, so a rank that finished its script and then aborted in teardown
(gloo + DDP on torch 2.13) counts as finished, with a teardown abort noted. A rank stopped by
``--max-steps`` (exit status ``max_steps``) counts as finished too, with ``max_steps`` set. An
exception that merely reports a vanished peer or a timeout ("Connection closed by peer") is marked
``comm_error``: it is a consequence of another rank's problem, not a cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.analysis.backend_words import explaining_lines
from ddpdoctor.analysis.peer_proof import Shortfall
from ddpdoctor.analysis.terms import signal_name
from ddpdoctor.trace import basics, schema
from ddpdoctor.trace.basics import call_name, short_message
from ddpdoctor.trace.index import index_of
from ddpdoctor.trace.model import (
    Collective,
    RankTrace,
    Run,
    Site,
    is_internal_file,
    site_from,
)
from ddpdoctor.trace.words import Word


class RankStatus(Word):
    """How a rank ended, as every report shows it."""

    FINISHED = "finished"
    EXCEPTION = "exception"
    FAILED = "failed"  # sys.exit() with a non-zero code
    KILLED = "killed"
    HUNG = "hung"
    UNFINISHED = "unfinished"
    MISSING = "missing"
    REMOTE = "remote"  # no trace here, in a job of several nodes: its folder was not given
    INTERRUPTED = "interrupted"  # Ctrl-C (KeyboardInterrupt, SIGINT) or ddpdoctor stopped

    @property
    def crashed(self) -> bool:
        """The rank ended by its own failure: it raised, exited non-zero or was killed."""
        return self in (RankStatus.EXCEPTION, RankStatus.FAILED, RankStatus.KILLED)

    @property
    def ended_well(self) -> bool:
        """The rank ran its script to the end (a rank of another node counts: its node's
        folder says how it ended)."""
        return self in (RankStatus.FINISHED, RankStatus.REMOTE)


PENDING_WINDOW = 1024


@dataclass
class RankState:
    """One rank's ending and progress, derived once from its trace and exit code."""

    rank: int
    trace: RankTrace | None
    status: RankStatus
    exit_code: int | None = None
    pending: list[Collective] = field(default_factory=list)
    last: Collective | None = None
    iterations: int = 0
    collectives: int = 0
    comm_error: bool = False
    crash_site: Site | None = None
    crash_text: str = ""
    teardown_abort: bool = False
    end_t: float = 0.0
    hang_stack: list[Site] = field(default_factory=list)
    max_steps: int | None = None  # stopped by --max-steps after this many DDP iterations
    epoch_steps: int | None = None  # the stop was --epoch-steps N's, at the third epoch
    epoch_ends: int | None = None  # DataLoader passes that had ended by the stop
    cut: bool = False  # the trace ends early: the rank could not write it (full disk)
    unended: bool = False  # cut with no ending at all: no exit record, exit code or hang
    torn_down: bool = False  # SIGTERMed by the launcher after another rank failed first
    # Cut because a peer's completed collective proves the rank issued more than its trace
    # holds (analysis/peer_proof.py): what its trace lacks, and who proves it.
    short: Shortfall | None = None
    # At the hang, inside a torch.distributed call with nothing recorded as pending: a call
    # the record does not hold (its name), whatever the rank waited for there.
    unrecorded_call: str | None = None
    # The lines of its stderr tail that explain how it ended (analysis/backend_words.py),
    # each with the rank of its pattern; reports quote those of ranks that did not finish.
    backend_words: list[tuple[int, str]] = field(default_factory=list)

    @property
    def waiting(self) -> Collective | None:
        """The collective this rank is stuck in: its earliest one that never completed."""
        return self.pending[0] if self.pending else None

    @property
    def crashed(self) -> bool:
        return self.status.crashed

    @property
    def where(self) -> Collective | None:
        """Where the rank was left: the collective it waits in, else its last one."""
        return self.waiting or self.last


def is_comm_error(exc: dict) -> bool:
    """Whether an exception record reports a vanished peer or a timeout, not a bug here."""
    return basics.is_comm_error(str(exc.get("type", "")), str(exc.get("message", "")))


def user_frame(frames: list[dict], user_files: set[str]) -> Site | None:
    """The innermost frame of user code in an exception's frames (outermost first): outside
    torch, installed libraries and the standard library; else the innermost frame of a file
    that issued collectives (``user_files``); else the innermost frame."""
    sites = frame_sites(frames)
    for site in reversed(sites):
        if not is_internal_file(site.file):
            return site
    for site in reversed(sites):
        if site.file in user_files:
            return site
    return sites[-1] if sites else None


def _user_files(run: Run) -> set[str]:
    files: set[str] = set()
    for trace in run.ranks.values():
        for stack in index_of(trace.collectives).used_stacks():
            files.update(s.file for s in stack)
    return files


def _hang_stack(hang: dict | None) -> list[Site]:
    """The main thread's user frames from a watchdog hang record, innermost first."""
    if not hang:
        return []
    for thread in hang.get("threads") or []:
        if isinstance(thread, dict) and thread.get("main"):
            sites = frame_sites(thread.get("frames") or [])
            return [s for s in reversed(sites) if not is_internal_file(s.file)]
    return []


_DISTRIBUTED = re.compile(r"[/\\]torch[/\\]distributed[/\\]")


def distributed_call(hang: dict | None) -> str | None:
    """'torch.distributed.distributed_c10d.monitored_barrier()' when the main thread's
    stack at the hang was inside torch.distributed (the outermost such frame: the call the
    user's code made), else None."""
    for thread in (hang or {}).get("threads") or []:
        if isinstance(thread, dict) and thread.get("main"):
            for site in frame_sites(thread.get("frames") or []):
                if _DISTRIBUTED.search(site.file):
                    return call_name(site.file, site.function)
    return None


def frame_sites(frames: object) -> list[Site]:
    """The well-formed frame records among ``frames``, as sites."""
    out = []
    for f in frames if isinstance(frames, list) else []:
        if isinstance(f, dict):
            try:
                out.append(site_from(f))
            except (TypeError, ValueError):
                continue
    return out


def completions_lost(trace: RankTrace) -> bool:
    """Whether the rank closed its trace (an exit record) yet no ``done`` record of it is
    there: the writer writes one at every settle that saw a collective issued, its last at
    the close, so those lines were lost and which collectives completed is unknown."""
    return (trace.version >= 3 and trace.exit is not None and len(trace.collectives) > 0
            and trace.completion.upto == 0)


def rank_state(trace: RankTrace | None, rank: int, run: Run,
               user_files: set[str] | None = None) -> RankState:
    """Judge one rank; ``user_files`` helps find the user's line in an exception."""
    code = run.exit_codes.get(rank)
    if trace is None and run.nnodes > 1:
        return RankState(rank, None, RankStatus.REMOTE, exit_code=code,
                         crash_text="on another node (its log folder was not given)")
    if trace is None:
        return RankState(rank, None, RankStatus.MISSING, exit_code=code,
                         crash_text="no trace (the rank never started, or its file is missing)")
    colls = trace.collectives
    state = RankState(rank, trace, RankStatus.UNFINISHED, exit_code=code, collectives=len(colls),
                      cut=trace.cut)
    if trace.stderr_tail:
        state.backend_words = explaining_lines(trace.stderr_tail)
    if colls:
        state.last = colls[-1]
        # The DDP forward count only grows: the last collectives carry the highest.
        state.iterations = index_of(colls).last_iteration(64)
        state.end_t = max(max(c.t, c.t_end or 0.0) for c in colls[-8:])
    exit_status = (trace.exit or {}).get("status")
    ended_at = (trace.exit or {}).get("iteration")
    if isinstance(ended_at, int) and ended_at >= 0:
        # Forwards after the last collective (evaluation through a model without buffers)
        # count: a rank that ran them did not run fewer iterations.
        state.iterations = max(state.iterations, ended_at)
    if exit_status == schema.EXIT_MAX_STEPS:
        steps = (trace.exit or {}).get("steps")
        state.max_steps = steps if isinstance(steps, int) else state.iterations
        state.iterations = max(state.iterations, state.max_steps)
        for name in ("epoch_steps", "epoch_ends"):
            value = (trace.exit or {}).get(name)
            setattr(state, name, value if isinstance(value, int) and value >= 0 else None)
    if code == 0 and not trace.exit and not trace.exception:
        # The process ended normally, yet its trace has no exit record: it could not write
        # the end of its trace (a full disk, a size limit).
        state.cut = True
    if trace.finished or state.max_steps is not None or (state.cut and code == 0):
        state.status = RankStatus.FINISHED
        state.teardown_abort = code is not None and code < 0
        if state.teardown_abort and code is not None:
            state.crash_text = (f"{signal_name(code)} (exit code {code}) after its script "
                                f"finished")
        state.end_t = float((trace.exit or {}).get("t", state.end_t) or state.end_t)
        return state
    # A blocked rank waits in one of its last collectives; an incomplete one further back
    # is an async op never waited for, not where the rank is.
    state.pending = index_of(colls).incomplete(PENDING_WINDOW)
    state.hang_stack = _hang_stack(trace.hang)
    if not state.pending:
        state.unrecorded_call = distributed_call(trace.hang)
    if code is None and not (trace.exit or trace.exception or trace.hang) and \
            not (run.stopped_for_hang or run.interrupted):
        # Nothing says how the rank ended: no exit record, no exit code from its launcher,
        # no evidence of a hang. The file was cut (damage), or the job still runs, or it was
        # killed with its launcher: what the rank did after its last line is unknown.
        state.cut = state.unended = True
        return state
    if run.interrupted or code == -2 or \
            (trace.exception or {}).get("type") == "KeyboardInterrupt":
        state.status = RankStatus.INTERRUPTED  # the user stopped the job: no rank crashed
    elif trace.exception:
        exc = trace.exception
        state.status = RankStatus.EXCEPTION
        state.comm_error = is_comm_error(exc)
        frames = exc.get("frames") or []
        files = user_files if user_files is not None else set()
        state.crash_site = user_frame(frames, files)
        state.crash_text = f"{exc.get('type', 'Exception')}: {short_message(exc.get('message'))}"
        state.end_t = float(exc.get("t", state.end_t) or state.end_t)
        if isinstance(exc.get("iteration"), int):
            state.iterations = max(state.iterations, exc["iteration"])
    elif exit_status == schema.EXIT_FAILED:
        state.status = RankStatus.FAILED
        exit_code = (trace.exit or {}).get("code") or code
        call = "os._exit" if (trace.exit or {}).get("os_exit") else "sys.exit"
        state.crash_text = f"called {call}({exit_code})"
        state.end_t = float((trace.exit or {}).get("t", state.end_t) or state.end_t)
    elif run.stopped_for_hang:
        state.status = RankStatus.HUNG
    elif code is not None and code != 0:
        state.status = RankStatus.KILLED
        if code < 0:
            state.crash_text = f"killed by {signal_name(code)} (exit code {code})"
        else:
            state.crash_text = (f"exited with code {code} without a Python exception "
                                f"(os._exit, or a fatal error in native code)")
    elif trace.hang or state.pending:
        state.status = RankStatus.HUNG
    if state.crash_site is None and state.crashed:
        where = state.where
        state.crash_site = where.site if where else None
    return state


def rank_states(run: Run) -> dict[int, RankState]:
    """The state of every rank of the world, traced or not."""
    needs_files = any(t.exception for t in run.ranks.values())
    files = _user_files(run) if needs_files else set()
    ranks = sorted(set(range(run.world_size)) | set(run.ranks))
    states = {r: rank_state(run.ranks.get(r), r, run, files) for r in ranks}
    _settle_by_peers(run, states)
    _mark_torn_down(states)
    return states


_PEERS_ASKED = 4  # members asked whether they completed a position (any one settles it)


def _settle_by_peers(run: Run, states: dict[int, RankState]) -> None:
    """A rank killed before its writer thread reported completions shows every collective
    pending, and would be placed in its first one. One that a peer completed at the same
    position, and after which the rank issued more, is not where the rank waits: dropped
    from its pending list (its last one always stays)."""
    for s in states.values():
        if len(s.pending) < 2 or s.last is None:
            continue
        last, before = s.last, s.pending[0]
        s.pending = [c for c in s.pending
                     if c.id == last.id or c.seq is None or not _peer_completed(run, s.rank, c)]
        if s.crashed and s.crash_site is before.site and s.pending:
            s.crash_site = s.pending[0].site  # it was placed where it waited


def _peer_completed(run: Run, rank: int, c: Collective) -> bool:
    asked = 0
    for r, trace in run.ranks.items():
        if r == rank:
            continue
        positions = index_of(trace.collectives).by_group().get(c.group)
        if positions is None or c.seq is None:
            continue
        theirs = positions.collectives[c.seq - 1] if c.seq <= len(positions.collectives) \
            else None
        if theirs is not None and theirs.op == c.op:
            if theirs.state == schema.COMPLETED:
                return True
            asked += 1
            if asked >= _PEERS_ASKED:
                return False
    return False


_TIMEOUT_TEXT = re.compile(r"timed out|timeout", re.I)
SIGTERM_CODE = -15  # a process ended by SIGTERM (the launcher's stop of a failed job's ranks)


def _failed_first(s: RankState) -> bool:
    """A rank whose failure came while its peers were still alive: an error of its own, an
    abort in teardown, or a collective timeout (its peer was alive and not issuing)."""
    if s.status == RankStatus.FAILED or (s.teardown_abort and s.exit_code != SIGTERM_CODE):
        return True  # (a rank that aborts in teardown ends first: torchrun stops the others)
    if s.status != RankStatus.EXCEPTION or s.trace is None:
        return False
    return not s.comm_error or bool(_TIMEOUT_TEXT.search(str((s.trace.exception or {})
                                                             .get("message", ""))))


def _mark_torn_down(states: dict[int, RankState]) -> None:
    """A rank terminated with SIGTERM after another rank failed first was stopped by the
    launcher (torchrun's teardown of the survivors): a consequence, never a cause."""
    if not any(_failed_first(s) for s in states.values()):
        return
    for s in states.values():
        if s.status == RankStatus.KILLED and s.exit_code == SIGTERM_CODE:
            s.torn_down = True
