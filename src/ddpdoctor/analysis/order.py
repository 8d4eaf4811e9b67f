"""Precedence: which finding is the root cause, which ones are its consequences.

Rules, in order:

1. A finding that another one explains is a *follow-on*: a missing collective whose absent
   ranks all crashed (explained by the crash) or are all blocked in other collectives (the
   chain ends elsewhere) or that lies on a wait cycle; a transport-error crash or a launcher
   kill after another rank failed; a rank that exited early while a missing collective already
   names it.
2. Among the rest, the earliest wins (issue time of the collectives involved; for a crash the
   time of the exception). A call-site divergence competes only when a later error in its own
   group follows it (it is then the root and becomes an error); otherwise it stays a warning
   listed after the errors, like every warning (a teardown abort is never a root cause
   while an error exists).
3. Point-to-point divergences rank after collective ones.
4. Once the root is known, every later error it explains is a follow-on too, whatever its
   kind: a finding at a later position of the root's group, a crash inside a collective of
   the root's group at or after the root's position (gloo failing a size check after a
   broadcast met an all-reduce is not a second bug), and one whose responsible ranks (those
   that did not issue a missing collective; every rank of another finding) are all ranks of
   the root (the ranks the others waited for, stuck or finished, once the root names them).
   A follow-on takes the root's cause (``diagnosis.explain``).
"""

from __future__ import annotations

from ddpdoctor.analysis.finding import MISMATCH_KINDS, POSITION_KINDS, Finding, Severity
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankState, RankStatus

_KIND_ORDER = {kind: i for i, kind in enumerate(
    (fk.WAIT_CYCLE, fk.GROUP_MISMATCH) + MISMATCH_KINDS
    + (fk.MISSING_COLLECTIVE, fk.CALLSITE_DIVERGENCE, fk.RANK_CRASHED, fk.RANK_EXITED_EARLY,
       fk.TEARDOWN_ABORT))}


def _blocked_elsewhere(state: RankState, group: str | None, seq: int | None) -> bool:
    w = state.waiting
    if w is None or state.status == RankStatus.FINISHED:
        return False
    if state.status == RankStatus.EXCEPTION and not state.comm_error:
        return False
    return (w.group, w.seq) != (group, seq)


def mark_follow_ons(findings: list[Finding], states: dict[int, RankState]) -> None:
    """Flag findings that another finding explains (rule 1)."""
    cycle = next((f for f in findings if f.kind == fk.WAIT_CYCLE), None)
    cycle_ranks = set(cycle.ranks) if cycle else set()
    named_absent: set[int] = set()
    for f in findings:
        if f.kind not in MISMATCH_KINDS + (fk.MISSING_COLLECTIVE,):
            continue
        absent = [r for r, d in f.ranks.items() if d.op is None]
        issued = [r for r, d in f.ranks.items() if d.op is not None]
        named_absent.update(absent)
        if f.kind != fk.MISSING_COLLECTIVE or not absent:
            continue
        if cycle is not None and (set(issued) & cycle_ranks):
            f.follow_on, f.explained_by = True, fk.WAIT_CYCLE
        elif all(states[r].crashed and not states[r].comm_error and not states[r].torn_down
                 for r in absent):
            f.follow_on, f.explained_by = True, fk.RANK_CRASHED
        elif all(_blocked_elsewhere(states[r], f.group, f.seq) for r in absent):
            f.follow_on, f.explained_by = True, "blocked elsewhere"
    for f in findings:
        if f.kind == fk.RANK_EXITED_EARLY and set(f.ranks) & named_absent:
            f.follow_on, f.explained_by = True, fk.MISSING_COLLECTIVE


def _callsite_is_root(f: Finding, findings: list[Finding]) -> bool:
    return any(o is not f and o.group == f.group and o.is_error and o.seq is not None
               and f.seq is not None and o.seq > f.seq
               and o.kind in MISMATCH_KINDS + (fk.MISSING_COLLECTIVE,)
               for o in findings)


def order(findings: list[Finding], states: dict[int, RankState]) -> list[Finding]:
    """The findings, root cause first (rules 1-3); a call-site root is promoted to error."""
    mark_follow_ons(findings, states)
    promoted = {id(f) for f in findings
                if f.kind == fk.CALLSITE_DIVERGENCE and _callsite_is_root(f, findings)}
    for f in findings:
        if id(f) in promoted:
            f.severity = Severity.ERROR

    def key(f: Finding) -> tuple:
        competes = f.is_error or id(f) in promoted
        return (f.follow_on, not competes, f.p2p, f.t, _KIND_ORDER.get(f.kind, 99),
                f.group or "", f.seq or 0)

    ordered = sorted(findings, key=key)
    if _explained_by_root(ordered):
        ordered = sorted(ordered, key=key)
    return ordered


def _responsible(f: Finding) -> set[int]:
    """The ranks a finding blames: those that did not issue a missing collective; every rank
    of another finding."""
    if f.kind == fk.MISSING_COLLECTIVE:
        return {r for r, d in f.ranks.items() if d.op is None}
    return set(f.ranks)


def _explained_by_root(ordered: list[Finding]) -> bool:
    """Mark the later errors the root explains as its follow-ons (rule 4); whether any was."""
    root = ordered[0] if ordered else None
    if root is None or not root.is_error:
        return False
    changed = False
    for f in ordered[1:]:
        if f.follow_on or not f.is_error:
            continue
        later_position = crash_inside = False
        if root.seq is not None and f.seq is not None and f.group == root.group:
            later_position = f.kind in POSITION_KINDS and f.seq > root.seq
            crash_inside = (root.kind != fk.RANK_CRASHED and f.kind == fk.RANK_CRASHED
                            and f.seq >= root.seq)
        blamed = _responsible(f)
        same_ranks = bool(blamed) and blamed <= set(root.ranks) and f.t >= root.t
        if later_position or crash_inside or same_ranks:
            f.follow_on, f.explained_by = True, root.kind
            changed = True
    return changed
