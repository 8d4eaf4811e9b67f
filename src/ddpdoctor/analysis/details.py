"""Per-rank details of a finding, and the phrases that say where a rank was left."""

from __future__ import annotations

from typing import NamedTuple

from ddpdoctor.analysis.finding import RankDetail
from ddpdoctor.analysis.ranks import RankState, RankStatus, frame_sites
from ddpdoctor.analysis.terms import describe, group_text, iteration_text, site_text
from ddpdoctor.trace.basics import short_message
from ddpdoctor.trace.model import Collective


def collective_detail(c: Collective) -> RankDetail:
    """A rank issuing ``c``, with the DDP meaning of ``c`` as its note."""
    return RankDetail.of(c, note=describe(c))


class _Said(NamedTuple):
    """The words that change when a phrase is said of several ranks alike."""

    was: str
    its: str
    is_: str
    it: str
    s: str  # a noun's plural ending: 'their scripts'


_ONE = _Said("was", "its", "is", "it", "")
_MANY = _Said("were", "their", "are", "them", "s")


def _said(ranks: int) -> _Said:
    return _ONE if ranks == 1 else _MANY


def phase_text(s: RankState, ranks: int = 1) -> str:
    """'iteration 3', 'setup (before the first DDP forward)', or, for a rank that built no
    DDP model, how many collectives it had issued; said of ``ranks`` ranks alike ('their
    runs')."""
    if s.iterations or (s.trace is not None and s.trace.ddp):
        return iteration_text(s.iterations)
    w = _said(ranks)
    if s.short is not None:
        return (f"a part of {w.its} run{w.s} that {w.its} incomplete trace{w.s} "
                f"{'does' if ranks == 1 else 'do'} not hold")
    n = s.collectives
    return f"{w.its} run{w.s}, after {n} collective{'s' if n != 1 else ''}" if n else \
        f"{w.its} start{w.s}, before any collective"


def _progress_text(s: RankState) -> str:
    """'iteration 5', or for a rank that built no DDP model '4 collectives'."""
    if s.iterations or (s.trace is not None and s.trace.ddp):
        return iteration_text(s.iterations)
    return f"{s.collectives} collective{'s' if s.collectives != 1 else ''}"


def where_text(state: RankState, ranks: int = 1) -> str:
    """Where a rank was left, as a phrase: 'finished its script after iteration 5', ...;
    said of ``ranks`` ranks left alike ('finished their scripts ...')."""
    was, its, is_, _, s = _said(ranks)
    if state.status == RankStatus.MISSING:
        return "left no trace"
    if state.status == RankStatus.REMOTE:
        return f"ran on another node ({its} log folder was not given)"
    if state.status == RankStatus.FINISHED and state.max_steps is not None:
        return stop_text(state, ranks)
    if state.status == RankStatus.FINISHED:
        code = f" (exit code {state.exit_code})" if state.exit_code and state.exit_code > 0 else ""
        return f"finished {its} script{s}{code} after {_progress_text(state)}"
    if state.status == RankStatus.EXCEPTION:
        at = f" at {site_text(state.crash_site)}" if state.crash_site else ""
        return f"raised {state.crash_text}{at}"
    if state.torn_down:
        return blocked_text(state, ranks)
    if state.short is not None and not state.status.crashed:
        return past_trace_text(state, ranks)
    if state.status == RankStatus.KILLED:
        return f"{was} {state.crash_text}" if state.crash_text.startswith("killed") \
            else state.crash_text
    if state.status == RankStatus.FAILED:
        return f"{state.crash_text} during {phase_text(state, ranks)}"
    w = state.waiting
    if w is not None:
        return (f"{is_} blocked in {describe(w)} ({group_text(w.group)}, #{w.seq}) at "
                f"{site_text(w.site)}") if w.seq is not None else \
            f"{is_} blocked in {w.op} with rank {w.peer} at {site_text(w.site)}"
    if state.last is not None:
        return (f"{was} still running, outside any collective (last: {describe(state.last)} "
                f"at {site_text(state.last.site)})")
    return f"{was} still running, before {its} first collective"


def past_trace_text(state: RankState, ranks: int = 1) -> str:
    """Where a rank whose trace its peers prove short was: past its trace's end (said of
    ``ranks`` ranks alike)."""
    was, its, _, _, s = _said(ranks)
    last = (f" ({its} last line: {describe(state.last)} at {site_text(state.last.site)})"
            if state.last is not None else "")
    return f"{was} past the end of {its} incomplete trace{s}{last}"


def blocked_text(state: RankState, ranks: int = 1) -> str:
    """Where a rank that the launcher tore down was: the collective it waited in, else its
    last activity record (outside any collective, where, how much CPU) unless an older one
    than its last collective, then the teardown (said of ``ranks`` ranks alike)."""
    was, _, _, it, _ = _said(ranks)
    until = f"until the launcher terminated {it} (SIGTERM) after another rank failed"
    if state.short is not None:
        return f"{past_trace_text(state, ranks)}, {until}"
    w = state.waiting
    if w is not None:  # the launcher's SIGTERM came before the transport error
        return f"{was} waiting in {describe(w)} at {site_text(w.site)}, {until}"
    act = (state.trace.activity if state.trace is not None else None) or {}
    t = act.get("t")
    if state.last is not None and (not isinstance(t, (int, float)) or t < state.last.t):
        act = {}  # written before the rank's last collective: not where it was at the end
    sites = frame_sites(act.get("frames"))
    at = f" at {site_text(sites[0])}" if sites else ""
    rate = act.get("cpu_rate")
    cpu = ""
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        cpu = ", using no CPU" if rate < 0.05 else f", using {rate:.0%} of a core"
    where = (f"{was} outside any collective{at}{cpu}" if act else
             f"{was} outside any collective")
    return f"{where}, {until}"


def thread_error_texts(state: RankState) -> list[str]:
    """'rank 0's thread "prefetch" died: ValueError: ... at data.py:26 in producer()'."""
    out = []
    for rec in (state.trace.thread_errors if state.trace is not None else [])[:4]:
        sites = frame_sites(rec.get("frames"))
        at = f" at {site_text(sites[-1])}" if sites else ""
        out.append(f"rank {state.rank}'s thread \"{str(rec.get('thread', '?'))[:80]}\" died: "
                   f"{rec.get('type', 'Exception')}: {short_message(rec.get('message'))}{at}")
    return out


def ended_children_texts(state: RankState) -> list[str]:
    """'rank 0's worker process "tokenizer" (pid 812) exited with code 3 (from the hang record).'"""
    hang = (state.trace.hang if state.trace is not None else None) or {}
    children = hang.get("children")
    out: list[str] = []
    for child in (children if isinstance(children, list) else [])[:4]:
        if not isinstance(child, dict):
            continue
        code = child.get("exitcode")
        how = (f"was killed by signal {-code}" if isinstance(code, int) and code < 0 else
               f"exited with code {code}")
        out.append(f"rank {state.rank}'s worker process \"{str(child.get('name', '?'))[:80]}\" "
                   f"(pid {child.get('pid', '?')}) {how}")
    return out


def stop_text(state: RankState, ranks: int = 1) -> str:
    """How a rank stopped by ddpdoctor stopped: 'was stopped by --max-steps 2 at the start of
    iteration 3', or 'was stopped by --epoch-steps 2 at the start of its third epoch (after
    iteration 5)'; said of ``ranks`` ranks that stopped alike ('were ... their')."""
    was, its = _said(ranks)[:2]
    steps = state.max_steps if state.max_steps is not None else state.iterations
    if state.epoch_steps is not None:
        return (f"{was} stopped by --epoch-steps {state.epoch_steps} at the start of {its} "
                f"third epoch (after {iteration_text(steps)})")
    return f"{was} stopped by --max-steps {steps} at the start of iteration {steps + 1}"


def elsewhere_detail(state: RankState) -> RankDetail:
    """A rank that did not issue the collective in question: where it was instead."""
    d = RankDetail(rank=state.rank, iteration=state.iterations, note=where_text(state))
    if state.status in (RankStatus.MISSING, RankStatus.REMOTE):
        d.state = "no trace" if state.status == RankStatus.MISSING else "other node"
        return d
    if state.status.crashed:
        d.state = state.status
        d.site = state.crash_site
        return d
    where = state.where
    if state.status == RankStatus.FINISHED:
        d.state = "finished"  # no line: the rank is not anywhere in the script any more
        return d
    if state.waiting is not None:
        d.state = "blocked"
    else:
        d.state = "running"
    if where is not None:
        d.site, d.group, d.seq = where.site, where.group, where.seq
        d.stack = where.stack
    if state.hang_stack:
        d.stack = state.hang_stack
    return d


def failed_in_detail(state: RankState) -> RankDetail | None:
    """A rank whose exception only reports a lost peer or a timeout, or that the launcher tore
    down while it waited: the collective it was in, with how it ended as its note (None when
    it was not in a collective)."""
    w = state.waiting
    if w is None:
        return None
    if state.status == RankStatus.EXCEPTION and state.comm_error:
        how = f"failed with {state.crash_text}"
    elif state.torn_down:
        how = "the launcher terminated the rank (SIGTERM) after another rank failed"
    else:
        return None
    d = collective_detail(w)
    d.note = f"{d.note}; {how}"
    return d


def left_detail(state: RankState) -> RankDetail:
    """Where a rank was left at the end: its incomplete collective, else its last one."""
    failed = failed_in_detail(state)
    if failed is not None:
        return failed
    where = state.where
    if state.status.crashed or state.status == RankStatus.MISSING or where is None:
        return elsewhere_detail(state)
    d = collective_detail(where)
    if state.status == RankStatus.FINISHED:
        d.state = "finished"
        ended = "finished its script" if state.max_steps is None else \
            stop_text(state).replace("was stopped", "stopped")
        d.note = f"{ended}; last collective: {d.note}"
    if state.hang_stack:
        d.stack = state.hang_stack
    return d
