"""The diagnosis of a job read from outside (``ddpdoctor attach``): from every rank's stacks,
one :class:`~ddpdoctor.analysis.report.Report`, in the same findings and known causes as a
recorded run's.

Stacks show where each rank is now, not what it issued before, so the rules claim only what
the stacks prove, in this order:

1. a rank whose script ended (an exception on its stderr or in torchelastic's error file) or
   whose process is gone, while others wait: ``rank_crashed`` / ``rank_exited_early``;
2. a rank blocked outside collectives while every other waits in one: ``rank_stuck``; a rank
   that is *busy* there is named in a note, as what the others wait for (a slow step and an
   endless loop look the same for a few seconds), with no finding;
3. every live rank waits in a collective: the ranks split by what they wait in (op, DDP
   label, source line, plain arguments such as ``src`` and ``tag``); point-to-point ops by
   whom each waits for. Two kinds of wait are a mismatch (op, line, root, tag, group by the
   call's text, a wait cycle), with the known cause whose premises the stacks show (a rank
   test around one side's line, the join protocol on one side, a DDP forward from a
   function the other ranks are not in, a backward against a collective after its loop);
4. otherwise: every rank waits in the same call (stacks cannot tell which rank diverged:
   said, with what ``ddpdoctor run`` or the flight recorder would add), or every rank is
   progressing (:data:`~ddpdoctor.analysis.report.RUNNING`).

A rank whose stack could not be read is never blamed, and no verdict is given over it: the
report says what is missing.
"""

from __future__ import annotations

import re

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis import source
from ddpdoctor.analysis.finding import Finding, RankDetail, Severity
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankStatus
from ddpdoctor.analysis.report import RankSummary, Report
from ddpdoctor.analysis.signature import DDP_STEP_LABELS
from ddpdoctor.analysis.stacks import PTRACE_FIX, RankView, Where, view
from ddpdoctor.analysis.terms import rank_list, site_text
from ddpdoctor.analysis.tracebacks import RaisedError, last_error, own_lines
from ddpdoctor.knowledge import catalog
from ddpdoctor.trace.ddp_sites import BUCKET, USER
from ddpdoctor.trace.snapshot import RankSnapshot, Snapshot

_STATUS: dict[Where, RankStatus] = {
    Where.WAITING: RankStatus.HUNG, Where.INIT: RankStatus.HUNG,
    Where.BUSY: RankStatus.UNFINISHED, Where.BLOCKED: RankStatus.UNFINISHED,
    Where.ENDED: RankStatus.FINISHED, Where.GONE: RankStatus.MISSING,
    Where.UNKNOWN: RankStatus.MISSING}
_STATE = {Where.WAITING: "pending", Where.INIT: "pending", Where.BUSY: "running",
          Where.BLOCKED: "blocked", Where.ENDED: "finished", Where.GONE: "killed",
          Where.UNKNOWN: "no stack"}
_GROUP_ARG = re.compile(r"\bgroup\s*=\s*([\w.\[\]'\"]+)")
STACKS_ALONE = ("stacks show where each rank is now, not what it issued before: "
                "`ddpdoctor run` (or PyTorch's flight recorder, TORCH_FR_BUFFER_SIZE=2000) "
                "records every collective and finds the first one that differs")


def diagnose_snapshots(snapshots: list[Snapshot]) -> Report:
    """The report of one job from its nodes' snapshots (one per node)."""
    snaps: dict[int, RankSnapshot] = {}
    notes: list[str] = []
    world = 0
    for snap in snapshots:
        world = max(world, snap.world_size or 0)
        notes.extend(snap.notes)
        for r in snap.ranks:
            if r.rank not in snaps or snaps[r.rank].pid is None:
                snaps[r.rank] = r
    views = {rank: view(s) for rank, s in sorted(snaps.items())}
    world = max(world, max(views, default=-1) + 1)
    absent = [r for r in range(world) if r not in views]
    if absent:
        notes.append(f"{rank_list(absent)} of the world of {world}: no stack here (another "
                     f"node's; run `ddpdoctor attach` there too and `ddpdoctor diff` the "
                     f"folders together)")
    for v in views.values():
        if v.where is Where.UNKNOWN:
            notes.append(f"rank {v.rank}: no stack: {v.note}" + (
                f" (fix: {PTRACE_FIX})" if "ermission" in v.note else ""))
    findings = _findings(views, snaps, absent, notes)
    summaries = [_summary(v, snaps[v.rank]) for v in views.values()]
    verdict = _verdict(findings, views, absent)
    return Report(verdict=verdict, world_size=world, ranks=summaries, findings=findings,
                  notes=notes)


def _verdict(findings: list[Finding], views: dict[int, RankView],
             absent: list[int]) -> rp.Verdict:
    if any(f.is_error for f in findings):
        return rp.verdict_of(findings, {})
    live = [v for v in views.values() if v.where not in (Where.GONE, Where.ENDED)]
    if live and not absent and len(live) == len(views) and \
            all(v.where in (Where.BUSY, Where.BLOCKED) for v in live):
        return rp.Verdict.RUNNING
    return rp.Verdict.INCOMPLETE


def _summary(v: RankView, snap: RankSnapshot) -> RankSummary:
    status = _STATUS[v.where]
    error = _error(snap)
    if v.where in (Where.ENDED, Where.GONE) and error:
        status = RankStatus.EXCEPTION
    return RankSummary(rank=v.rank, status=status, last=_detail(v),
                       detail=error.text if error else v.note, hang_stack=v.stack)


def _detail(v: RankView, note: str = "") -> RankDetail:
    return RankDetail(rank=v.rank, op=v.op, label=v.label, site=v.site, state=_STATE[v.where],
                      note=note or _where_text(v), stack=v.stack)


def _where_text(v: RankView) -> str:
    parts = []
    if v.where is Where.WAITING:
        parts.append(f"waits in {_op_text(v)}")
    elif v.where is Where.INIT:
        parts.append("waits in init_process_group (the rendezvous)")
    elif v.where in (Where.BUSY, Where.BLOCKED):
        parts.append(("busy" if v.where is Where.BUSY else "blocked, using no CPU")
                     + (f" in {v.call}()" if v.call else "") + ", outside any collective")
    if v.cpu_share is not None and v.where is not Where.GONE:
        parts.append(f"CPU {v.cpu_share:.0%}")
    loop = {k: val for k, val in v.user_locals.items() if val.lstrip("-").isdigit()}
    if loop:
        parts.append(", ".join(f"{k}={val}" for k, val in list(loop.items())[:4]))
    return "; ".join(parts)


def _op_text(v: RankView) -> str:
    what = v.op or "a collective"
    if v.label == BUCKET:
        what = "DDP's gradient all-reduce (the reducer, at the end of the backward)"
    elif v.label and v.label != USER:
        what = f"{v.op} ({v.label})"
    args = ", ".join(f"{k}={val}" for k, val in v.args.items())
    return what + (f"({args})" if args and v.label == USER else "")


def _error(snap: RankSnapshot) -> RaisedError | None:
    """The exception the rank left in torchelastic's error file or its stderr, if any."""
    for text in (snap.error_file, own_lines(snap.stderr_tail, snap.rank)):
        error = last_error(text) if text else None
        if error is not None:
            return error
    return None


def _findings(views: dict[int, RankView], snaps: dict[int, RankSnapshot], absent: list[int],
              notes: list[str]) -> list[Finding]:
    waiting = [v for v in views.values() if v.in_collective]
    ended = [v for v in views.values() if v.where in (Where.ENDED, Where.GONE)]
    outside = [v for v in views.values() if v.where in (Where.BUSY, Where.BLOCKED)]
    unknown = [v for v in views.values() if v.where is Where.UNKNOWN]
    context = {v.rank: _detail(v) for v in waiting}
    if ended and (waiting or outside):
        found = _ended_finding(ended, snaps, context, notes)
        return [found] if found is not None else []
    if unknown:
        return []  # the rank we cannot see may be the one the others wait for
    if outside and not waiting:
        still = [v for v in outside if v.where is Where.BLOCKED]
        if still:
            notes.append(f"{rank_list([v.rank for v in still])} sat at one place of its own "
                         f"code through every read, using no CPU ({_where_text(still[0])} at "
                         f"{site_text(still[0].site)}); no rank waits in a collective, so this "
                         f"is no distributed hang: attach again to see whether it moves")
    if waiting and outside and not absent:
        found = _outside_finding(outside, waiting, context, notes)
        return [found] if found is not None else []
    if waiting and not outside and not absent:
        if any(v.where is Where.INIT for v in waiting):
            return []
        found = _mismatch(waiting)
        if found is not None:
            return [found]
        first = waiting[0]
        notes.append(f"every rank waits in {_op_text(first)} at {site_text(first.site)}: "
                     f"the stacks show no rank that diverged; {STACKS_ALONE}")
    return []


def _ended_finding(ended: list[RankView], snaps: dict[int, RankSnapshot],
                   waiting: dict[int, RankDetail], notes: list[str]) -> Finding | None:
    """The rank(s) whose end the others wait for: one that raised (not a transport error,
    which reports another rank's end), else one that ended without any error."""
    ranks: dict[int, RankDetail] = {}
    crashed, silent = [], []
    for v in ended:
        error = _error(snaps[v.rank])
        state = "exception" if error else ("killed" if v.where is Where.GONE else "finished")
        if error is None:
            silent.append(v.rank)
        elif not error.comm:
            crashed.append(v.rank)
        ranks[v.rank] = RankDetail(rank=v.rank, site=error.site if error and error.site
                                   else v.site, state=state,
                                   note=error.text if error else (v.note or "its script ended"))
    others = rank_list(sorted(waiting)) if waiting else "no other rank"
    if crashed:
        summary = (f"{rank_list(crashed)} raised {ranks[crashed[0]].note}; {others} "
                   f"{_verb(len(waiting))} for it")
        return cause_finding(fk.RANK_CRASHED, summary, {**ranks, **waiting}, "rank_crashed")
    if silent:
        gone = any(v.where is Where.GONE for v in ended if v.rank in silent)
        how = "no process" if gone else "its script ended"
        summary = (f"{rank_list(silent)} left the job ({how}, no error in what it left) while "
                   f"{others} still {_verb(len(waiting))} in a collective")
        # Uneven inputs: the ranks left behind are still in DDP's training step (a backward's
        # gradient all-reduce, a forward's broadcast) that the rank which ended never matched.
        training = bool(waiting) and all(d.label in DDP_STEP_LABELS for d in waiting.values())
        evidence = [f"{others} {_verb(len(waiting))} in DDP's training step "
                    f"({', '.join(sorted({str(d.label) for d in waiting.values()}))}) after "
                    f"{rank_list(silent)} ended without an error: "
                    f"{'they have' if len(waiting) > 1 else 'it has'} more batches"] \
            if training else []
        return cause_finding(fk.RANK_EXITED_EARLY, summary, {**ranks, **waiting},
                        "uneven_inputs" if training else None, evidence=evidence)
    notes.append(f"{rank_list(sorted(ranks))} ended on a transport error, which reports "
                 f"another rank's end: the rank that ended first is not among those read")
    return None


def _verb(count: int) -> str:
    return "waits" if count == 1 else "wait"


def _outside_finding(outside: list[RankView], waiting: list[RankView],
                     context: dict[int, RankDetail], notes: list[str]) -> Finding | None:
    """A rank outside collectives while the others wait in one: the rank they wait for when
    it is blocked (or not yet in init_process_group); a *busy* one may be a slow step as well
    as an endless loop, which a few seconds of stacks cannot tell: said, not concluded."""
    v = outside[0]
    others = rank_list(sorted(context))
    if all(w.where is Where.INIT for w in waiting):
        summary = (f"rank {v.rank} has not reached init_process_group: it is "
                   f"{'blocked' if v.where is Where.BLOCKED else 'busy'} at "
                   f"{site_text(v.site)}, while {others} {_verb(len(context))} for it in the "
                   f"rendezvous")
        return cause_finding(fk.RANK_STUCK, summary, {v.rank: _detail(v), **context},
                        "rank_never_initialised")
    if v.where is Where.BLOCKED:
        summary = (f"rank {v.rank} is blocked in its own code at {site_text(v.site)}"
                   f"{f' (inside {v.call}())' if v.call else ''}, using no CPU, outside any "
                   f"collective, while {others} {_verb(len(context))} for it in a collective")
        return cause_finding(fk.RANK_STUCK, summary, {v.rank: _detail(v), **context},
                        "rank_stuck_in_user_code")
    notes.append(f"rank {v.rank} is busy at {site_text(v.site)}"
                 f"{f' (inside {v.call}())' if v.call else ''}, outside any collective (CPU "
                 f"{v.cpu_share or 0:.0%}), while {others} {_verb(len(context))} in a "
                 f"collective: the rank they wait for. A slow step (a checkpoint, an "
                 f"evaluation) if it moves on, an endless loop if it does not: attach again "
                 f"in a minute to tell")
    return None


def cause_finding(kind: fk, summary: str, ranks: dict[int, RankDetail], cause: str | None,
                  evidence: list[str] | None = None, p2p: bool = False,
                  group: str | None = None, seq: int | None = None) -> Finding:
    """An error finding with its known cause's fix as the advice (the post-mortem's too)."""
    known = catalog.get(cause)
    return Finding(kind=kind, severity=Severity.ERROR, group=group, seq=seq, summary=summary,
                   ranks=dict(sorted(ranks.items())), cause=cause,
                   advice=known.fix if known else "", evidence=evidence or [], p2p=p2p)


def _signature(v: RankView) -> tuple:
    site = (v.site.file, v.site.line) if v.site else None
    return v.op, v.label, site, tuple(sorted(v.args.items()))


def _mismatch(waiting: list[RankView]) -> Finding | None:
    if any(v.p2p for v in waiting):
        return _p2p(waiting)
    kinds = {_signature(v) for v in waiting}
    if len(kinds) == 1:
        return None
    ranks = {v.rank: _detail(v) for v in waiting}
    ops = {v.op for v in waiting}
    sites = {(v.site.file, v.site.line) if v.site else None for v in waiting}
    groups = {v.rank: _group_arg(v) for v in waiting}
    if len(ops) == 1 and len(sites) == 1:
        for arg in ("src", "dst", "group_src", "group_dst"):
            values = {v.args.get(arg) for v in waiting}
            if len(values) > 1:
                spread = "; ".join(f"rank {v.rank}: {arg}={v.args.get(arg)}" for v in waiting)
                return cause_finding(fk.ROOT_MISMATCH, f"the ranks wait in {waiting[0].op} at "
                                f"{site_text(waiting[0].site)} with different roots ({spread})",
                                ranks, "broadcast_root_mismatch", evidence=[spread])
        return None
    text = _waits_text(waiting)
    named = {g for g in groups.values() if g}
    if len(named) > 1 and len(ops) == 1:
        evidence = [f"rank {r}'s line passes group={g}" for r, g in groups.items() if g]
        return cause_finding(fk.WAIT_CYCLE, f"{text}: each waits on another process group, which "
                        f"the other rank has not reached", ranks, "group_order_inversion",
                        evidence=evidence)
    kind = fk.OP_MISMATCH if len(ops) > 1 else fk.CALLSITE_DIVERGENCE
    cause, evidence = _cause(waiting)
    return cause_finding(kind, text, ranks, cause, evidence=evidence)


def _waits_text(waiting: list[RankView]) -> str:
    """'rank 0 waits in barrier at train.py:61 in main(); ranks 1-7 wait in ...': ranks that
    wait in the same call at the same line share a clause."""
    clauses: dict[str, list[int]] = {}
    for v in waiting:
        clauses.setdefault(f"in {_op_text(v)} at {site_text(v.site)}", []).append(v.rank)
    return "; ".join(f"{rank_list(ranks)} {_verb(len(ranks))} {what}"
                     for what, ranks in clauses.items())


def _group_arg(v: RankView) -> str | None:
    if v.site is None or v.label != USER:
        return None
    m = _GROUP_ARG.search(v.site.text)
    return m.group(1) if m else None


def _cause(waiting: list[RankView]) -> tuple[str | None, list[str]]:
    """The known cause whose premises the stacks show, with those premises in words."""
    labels: dict[int, str] = {v.rank: v.label or USER for v in waiting}
    joins = [v for v in waiting if labels[v.rank].startswith("join.")]
    users = [v for v in waiting if labels[v.rank] == USER]
    if joins and users:
        return "collective_inside_join", [
            f"rank {v.rank} is in the join protocol ({labels[v.rank]}) while rank "
            f"{users[0].rank}'s own {users[0].op} at {site_text(users[0].site)} meets it"
            for v in joins[:1]]
    for v in users:
        for frame in v.stack:  # the collective's line, then its callers'
            condition = source.rank_condition(frame)
            if condition is not None:
                where = "" if frame is v.stack[0] else f", through {site_text(frame)}"
                return "rank_conditional_collective", [
                    f"rank {v.rank}'s {v.op} at {site_text(v.site)} is inside "
                    f"`{condition[1]}` (line {condition[0]}{where})"]
    forwards = [v for v in waiting if labels[v.rank] in ("ddp.buffers", "ddp.rebuild_buckets")]
    for v in forwards:
        others = {(s.file, s.function) for o in waiting if o is not v for s in o.stack}
        own = [s for s in v.stack if (s.file, s.function) not in others]
        if own:
            return "rank_conditional_ddp_forward", [
                f"rank {v.rank} runs a DDP forward in {own[-1].function}() "
                f"({site_text(own[0])}), where no other rank is"]
    backwards = [v for v in waiting if labels[v.rank] == BUCKET]
    for v in users:
        for b in backwards:
            loop = _loop_of(b)
            if loop is not None and v.site is not None and b.site is not None and \
                    v.site.file == b.site.file and v.site.function == b.site.function and \
                    loop not in [n for n, _t in v.site.blocks]:
                return "uneven_inputs", [
                    f"rank {b.rank} is still in the loop at line {loop} (its backward at "
                    f"{site_text(b.site)}), rank {v.rank} has left it for its {v.op} at "
                    f"{site_text(v.site)}: rank {b.rank} has more batches"]
    return None, []


def _loop_of(v: RankView) -> int | None:
    for number, text in (v.site.blocks if v.site else ()):
        if text.startswith(("for ", "while ", "async for ")):
            return number
    return None


def _p2p(waiting: list[RankView]) -> Finding | None:
    """Point-to-point waits: a tag that differs between a send and its receive, or ranks
    that wait for each other in a cycle (each receiving, or each sending)."""
    ranks = {v.rank: _detail(v) for v in waiting}
    by_rank = {v.rank: v for v in waiting}
    for v in waiting:
        peer = _peer(v)
        other = by_rank.get(peer) if peer is not None else None
        if other is None or not other.p2p or _peer(other) != v.rank:
            continue
        if v.op != other.op and v.args.get("tag", "0") != other.args.get("tag", "0"):
            spread = (f"rank {v.rank}: {v.op} tag={v.args.get('tag', '0')}; rank "
                      f"{other.rank}: {other.op} tag={other.args.get('tag', '0')}")
            pair = {v.rank: ranks[v.rank], other.rank: ranks[other.rank]}
            return cause_finding(fk.TAG_MISMATCH, f"rank {v.rank}'s {v.op} and rank {other.rank}'s "
                            f"{other.op} name each other with different tags ({spread})",
                            pair, "p2p_tag_mismatch", evidence=[spread], p2p=True)
        if v.op == other.op:
            pair = {v.rank: ranks[v.rank], other.rank: ranks[other.rank]}
            return cause_finding(fk.WAIT_CYCLE, f"rank {v.rank} and rank {other.rank} both wait in "
                            f"{v.op} for each other ({site_text(v.site)}, "
                            f"{site_text(other.site)}): neither reaches the matching "
                            f"{'send' if v.op == 'recv' else 'recv'}", pair,
                            "p2p_peer_mismatch", p2p=True)
    return None


def _peer(v: RankView) -> int | None:
    value = v.args.get("src" if v.op in ("recv", "irecv") else "dst")
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
