"""Findings about how ranks ended: crashed, exited early, aborted in teardown.

A crash is *primary* when the rank failed on its own (a Python exception that is not a
transport error, or a death by signal while no other rank had failed); the transport errors
and launcher kills that follow it on the other ranks are marked as follow-ons.
"""

from __future__ import annotations

from ddpdoctor.analysis import ranks as rs
from ddpdoctor.analysis.align import Alignment
from ddpdoctor.analysis.details import (
    elsewhere_detail,
    failed_in_detail,
    left_detail,
    phase_text,
    stop_text,
    where_text,
)
from ddpdoctor.analysis.finding import Finding, RankDetail, Severity
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankState, RankStatus
from ddpdoctor.analysis.terms import describe, group_text, iteration_text, rank_list, site_text
from ddpdoctor.trace.basics import call_name
from ddpdoctor.trace.index import index_of
from ddpdoctor.trace.model import Collective, Run, is_internal_file
from ddpdoctor.trace.schema import Stop


def _primary_crashes(states: dict[int, RankState]) -> set[int]:
    """Ranks whose crash is a cause rather than a consequence."""
    raised = {r for r, s in states.items()
              if (s.status == RankStatus.EXCEPTION and not s.comm_error)
              or s.status == RankStatus.FAILED}
    if raised:
        return raised
    killed = {r for r, s in states.items() if s.status == RankStatus.KILLED and not s.torn_down}
    if killed:
        # After one rank dies, torchrun stops the others with SIGTERM (then SIGKILL).
        not_term = {r for r in killed if states[r].exit_code not in (rs.SIGTERM_CODE, None)}
        return not_term or killed
    # Only transport errors, and nothing here that caused them: they are what is known
    # (NCCL refusing a communicator fails every rank with DistBackendError). A timeout in a
    # collective that a rank the launcher tore down never issued is no cause either: that
    # rank, which everyone waited for, is (the missing collective names it).
    if _waited_for_torn_down(states):
        return set()
    return {r for r, s in states.items() if s.status == RankStatus.EXCEPTION}


def _waited_for_torn_down(states: dict[int, RankState]) -> bool:
    """Whether a rank that failed in a collective failed waiting for a rank the launcher
    tore down, which never issued that collective."""
    torn = [s for s in states.values() if s.torn_down]
    for s in states.values():
        w = s.waiting
        if s.status != RankStatus.EXCEPTION or w is None or w.seq is None:
            continue
        for t in torn:
            if t.trace is None:
                continue
            positions = index_of(t.trace.collectives).by_group().get(w.group)
            if len(positions.codes if positions is not None else ()) < w.seq:
                return True
    return False


def _others_text(crashed: list[int], states: dict[int, RankState]) -> str:
    by_where: dict[str, list[int]] = {}
    for r, s in states.items():
        if r in crashed:
            continue
        w = s.waiting
        if w is not None and s.status != RankStatus.FINISHED and (s.status != RankStatus.EXCEPTION
                                                           or s.comm_error):
            text = f"in {describe(w)} at {site_text(w.site)}"
            if s.status == RankStatus.EXCEPTION:
                text += f" (it then failed with {s.crash_text})"
        else:
            text = where_text(s)
        by_where.setdefault(text, []).append(r)
    parts = [f"{rank_list(rs_)} {'was' if len(rs_) == 1 else 'were'} left waiting {w}"
             if w.startswith("in ") else
             f"{rank_list(rs_)} {where_text(states[rs_[0]], len(rs_))}"
             for w, rs_ in by_where.items()]
    if len(parts) > 4:
        parts = parts[:4] + [f"{len(parts) - 4} more"]
    return "; ".join(parts)


def _crash_head(ranks: list[int], states: dict[int, RankState]) -> str:
    """'Rank 1 raised ValueError: boom at train.py:8 in main() during iteration 2'; 'during
    their runs' for ranks that crashed alike at different points."""
    s = states[ranks[0]]
    who = rank_list(ranks).capitalize()
    phases = {phase_text(states[r], len(ranks)) for r in ranks}
    it = phases.pop() if len(phases) == 1 else "their runs"
    if s.status == RankStatus.EXCEPTION:
        at = f" at {site_text(s.crash_site)}" if s.crash_site else ""
        return f"{who} raised {s.crash_text}{at} during {it}"
    if s.status == RankStatus.FAILED:
        at = f" (last collective at {site_text(s.crash_site)})" if s.crash_site else ""
        return f"{who} {s.crash_text}{at} during {it}"
    return f"{who} {where_text(s) if len(ranks) == 1 else 'were ' + s.crash_text} during {it}"


def _crash_kind(s: RankState) -> tuple:
    """Crashes that read the same: same ending, same exception type (or signal), same line.
    A rank that exited by itself is known by the code its trace recorded: the launcher may
    have sent it SIGTERM while it was already exiting (its process's code is then -15)."""
    if s.status == RankStatus.EXCEPTION:
        how: object = s.crash_text.split(":", 1)[0]
    elif s.status == RankStatus.FAILED:
        how = s.crash_text
    else:
        how = s.exit_code
    return (s.status, how, s.crash_site)


def crash_findings(states: dict[int, RankState]) -> list[Finding]:
    """rank_crashed findings: each distinct primary crash (ranks that crashed the same way
    share one), then the consequences (transport errors, launcher kills) folded the same way
    and marked follow-on."""
    primary = _primary_crashes(states)
    groups: dict[tuple, list[int]] = {}
    for rank, s in sorted(states.items()):
        if s.crashed:
            groups.setdefault((rank not in primary,) + _crash_kind(s), []).append(rank)
    out = []
    for key, ranks in groups.items():
        follow_on = key[0]
        first = states[ranks[0]]
        where = first.waiting  # the collective it was in when it died, if any
        head = _crash_head(ranks, states)
        if not follow_on:
            others = _others_text(ranks, states)
            summary = head + (f"; {others}." if others else ".")
        else:
            # (A torn-down rank's head already names the collective it waited in.)
            inside = f", in {describe(where)}" if where is not None and not first.torn_down \
                else ""
            summary = f"{head}{inside}: a consequence of the problem above, not a cause of its own."
        details = {}
        for r in ranks:
            s = states[r]
            details[r] = failed_in_detail(s) or elsewhere_detail(s)
            if s.status == RankStatus.EXCEPTION and not s.comm_error:
                details[r].note = s.crash_text
        if not follow_on:
            for r, other in states.items():
                if r not in details:
                    details[r] = left_detail(other)
        out.append(Finding(fk.RANK_CRASHED, Severity.ERROR, where.group if where else None,
                           where.seq if where else None, summary, dict(sorted(details.items())),
                           follow_on=follow_on, t=min(states[r].end_t for r in ranks)))
    return out


def exited_early_findings(alignment: Alignment, states: dict[int, RankState]) -> list[Finding]:
    """Ranks that finished while others still wait in a collective of a group they are in
    (one finding for all of them)."""
    early: list[int] = []
    waiters: dict[int, Collective] = {}
    # The ranks still waiting, found once (not once per finished rank: 1024 ranks).
    waits: list[tuple[int, Collective, int]] = []
    members: dict[str, set[int]] = {}  # per group, as a set (16,384 ranks: not a list)
    for other, o in states.items():
        w = o.waiting
        if o.status != RankStatus.FINISHED and w is not None and w.seq is not None:
            waits.append((other, w, w.seq))
            g = alignment.groups.get(w.group)
            if g is not None and w.group not in members:
                members[w.group] = set(g.members)
    for rank, s in sorted(states.items()):
        if s.status != RankStatus.FINISHED:
            continue
        found = False
        for other, w, seq in waits:
            g = alignment.groups.get(w.group)
            if g is not None and rank in members[w.group] and g.length(rank) < seq:
                waiters[other] = w
                found = True
        if found:
            early.append(rank)
    if not early:
        return []
    waiting = sorted(waiters)
    w0 = waiters[waiting[0]]
    first = states[early[0]]
    who = rank_list(early).capitalize()
    its = "its script" if len(early) == 1 else "their scripts"
    # A rank that built no DDP model has no iterations: its collectives say how far it got.
    trained = first.iterations or (first.trace is not None and first.trace.ddp)
    ended = (f"finished {its} after "
             + (iteration_text(first.iterations) if trained else
                f"{first.collectives} collective{'s' if first.collectives != 1 else ''}")
             if first.max_steps is None else stop_text(first))
    summary = (f"{who} {ended} while "
               f"{rank_list(waiting)} still {'waits' if len(waiting) == 1 else 'wait'} in "
               f"{describe(w0)} ({group_text(w0.group)}, #{w0.seq}) at {site_text(w0.site)}.")
    details = {r: left_detail(states[r]) for r in early + waiting}
    return [Finding(fk.RANK_EXITED_EARLY, Severity.ERROR, w0.group, w0.seq, summary,
                    dict(sorted(details.items())), t=min(states[r].end_t for r in early))]


def teardown_findings(states: dict[int, RankState]) -> list[Finding]:
    """Ranks that finished and then aborted while the process shut down: one warning. Those
    ended with SIGTERM while another aborted by itself were stopped by the launcher (torchrun
    ends a failed group's survivors): named apart, never as aborting. Where the launcher
    stopped a rank that had not finished its script, its work was cut short: an error, the
    root cause of that rank's end."""
    ranks = [r for r, s in sorted(states.items()) if s.teardown_abort]
    if not ranks:
        return []
    own = [r for r in ranks if states[r].exit_code != rs.SIGTERM_CODE] or ranks
    stopped = [r for r in ranks if r not in own]
    # (Where a rank also raised or failed, that is what the launcher acted on: crash_findings.)
    cut = [] if any(s.status in (RankStatus.EXCEPTION, RankStatus.FAILED)
                    for s in states.values()) else \
        [r for r, s in sorted(states.items()) if s.torn_down and s.status == RankStatus.KILLED]
    one = len(own) == 1
    how = " or ".join(dict.fromkeys(states[r].crash_text.split(" after ")[0] for r in own))
    summary = (f"{rank_list(own).capitalize()} finished {'its script' if one else 'their scripts'}"
               f", then {'its process' if one else 'their processes'} died with {how} while "
               f"shutting down (a known gloo + DDP teardown abort)")
    if stopped:
        summary += (f"; the launcher then stopped {rank_list(stopped)}, finished too, with "
                    f"SIGTERM")
    if cut:
        it = "it" if len(cut) == 1 else "they"
        summary += (f"; the launcher then stopped {rank_list(cut)} with SIGTERM during "
                    f"{phase_text(states[cut[0]], len(cut))}, before {it} finished: what {it} "
                    f"had left to do did not run.")
    elif all(s.status.ended_well for s in states.values()):
        summary += "; the results are complete."
    else:
        summary += "."
    return [Finding(fk.TEARDOWN_ABORT, Severity.ERROR if cut else Severity.WARNING, None, None,
                    summary,
                    {r: left_detail(states[r]) for r in ranks + cut},
                    t=min(states[r].end_t for r in ranks))]


def stuck_findings(run: Run, states: dict[int, RankState]) -> list[Finding]:
    """Ranks the launcher stopped because they stayed at one place in their own code, outside
    collectives and without using CPU (``ddpdoctor run --stuck-timeout``)."""
    if run.stop != Stop.STUCK:
        return []
    # A rank that never reached init_process_group is init_findings' case.
    stuck = [r for r, s in sorted(states.items()) if s.status == RankStatus.HUNG and not s.pending
             and (s.collectives or (s.trace is not None and s.trace.init == "completed"))]
    if not stuck:
        return []
    first = states[stuck[0]]
    site = first.hang_stack[0] if first.hang_stack else None
    call = blocking_call(first.trace.hang if first.trace is not None else None)
    at = (f" at {site_text(site)}" if site else "") + (f" (blocked in {call})" if call else "")
    others = _others_text(stuck, states)
    summary = (f"{rank_list(stuck).capitalize()} stayed{at}, outside any collective and without "
               f"using CPU, until ddpdoctor stopped the job ({run.stop_reason})"
               + (f"; {others}." if others else "."))
    details = {}
    for r, s in states.items():
        if r in stuck:
            stack = s.hang_stack
            details[r] = RankDetail(rank=r, site=stack[0] if stack else None, state="stuck",
                                    iteration=s.iterations, note="stuck in user code",
                                    stack=stack)
        else:
            details[r] = left_detail(s)
    return [Finding(fk.RANK_STUCK, Severity.ERROR, None, None, summary, details,
                    t=0.0)]


def blocking_call(hang: dict | None) -> str | None:
    """The library call the main thread's innermost user frame was in at the hang
    ('queue.get()'), from the hang record's stack; None when it was in the user's own code."""
    for thread in (hang or {}).get("threads") or []:
        if not isinstance(thread, dict) or not thread.get("main"):
            continue
        frames = [f for f in thread.get("frames") or [] if isinstance(f, dict)]
        for outer, inner in zip(frames[-2::-1], frames[::-1]):
            if not is_internal_file(str(outer.get("file", ""))):
                if not is_internal_file(str(inner.get("file", ""))):
                    return None
                return call_name(str(inner.get("file", "")), str(inner.get("function", "?")))
    return None


def init_findings(states: dict[int, RankState]) -> list[Finding]:
    """Ranks waiting in init_process_group for ranks that never got there."""
    def init_of(s: RankState) -> str | None:
        return s.trace.init if s.trace is not None else None

    waiting = [r for r, s in sorted(states.items()) if init_of(s) == "pending"]
    absent = [r for r, s in sorted(states.items())
              if init_of(s) is None and not s.collectives and s.status != RankStatus.FINISHED]
    if not waiting or not absent:
        return []
    details: dict[int, RankDetail] = {}
    for r in waiting + absent:
        s = states[r]
        stack = s.hang_stack
        where = "waiting in init_process_group" if r in waiting else (
            "never reached init_process_group" if s.trace is not None else "left no trace")
        details[r] = RankDetail(rank=r, op="init_process_group" if r in waiting else None,
                                site=stack[0] if stack else None,
                                state="waiting" if r in waiting else "not reached", note=where,
                                stack=stack)
    late = absent[0]
    at = f" (it was at {site_text(details[late].site)})" if details[late].site else ""
    summary = (f"{rank_list(waiting).capitalize()} waited in init_process_group for "
               f"{rank_list(absent)}, which never reached it{at}.")
    return [Finding(fk.INIT_INCOMPLETE, Severity.ERROR, None, None, summary, details)]
