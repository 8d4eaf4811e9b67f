"""The pipeline of ``ddpdoctor diff``: rank endings -> alignment -> findings -> precedence ->
causes -> report. Pure: it reads a loaded :class:`~ddpdoctor.trace.model.Run` and nothing else.
"""

from __future__ import annotations

from ddpdoctor.analysis import backend_words, peer_proof
from ddpdoctor.analysis import ranks as rs
from ddpdoctor.analysis.align import Alignment, align
from ddpdoctor.analysis.details import stop_text
from ddpdoctor.analysis.endings import (
    crash_findings,
    exited_early_findings,
    init_findings,
    stuck_findings,
    teardown_findings,
)
from ddpdoctor.analysis.finding import MISMATCH_KINDS, Finding
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.findings import cycle_finding, divergence_finding, group_mismatch_finding
from ddpdoctor.analysis.order import order
from ddpdoctor.analysis.ranks import RankState, RankStatus, rank_states
from ddpdoctor.analysis.report import RankSummary, Report, Verdict, verdict_of
from ddpdoctor.analysis.rule_context import RuleContext
from ddpdoctor.analysis.rules import recognise
from ddpdoctor.analysis.terms import describe, group_text, rank_list
from ddpdoctor.analysis.waits import find_cycle, wait_edges
from ddpdoctor.knowledge import catalog
from ddpdoctor.trace.model import Run

ONE_RANK_NOTE = ("the job ran one rank, so no other rank's collectives could be compared with "
                 "its own: run 2 or more (under torchrun --nproc-per-node 2; a script that "
                 "starts its own workers decides how many; with one GPU, --cpu runs the ranks "
                 "on the CPU over gloo)")

GENERIC_ADVICE = {
    fk.OP_MISMATCH: "Every rank of a group must issue the same collectives in the same order: "
                    "one of the lines shown runs on only some ranks, or in another order.",
    fk.SHAPE_MISMATCH: "Make the tensor the same shape on every rank before the collective.",
    fk.DTYPE_MISMATCH: "Make the tensor the same dtype on every rank before the collective.",
    fk.REDUCE_OP_MISMATCH: "Use the same reduce op on every rank.",
    fk.ROOT_MISMATCH: "Pass the same src/dst rank on every rank.",
    fk.SPLIT_MISMATCH: "Make each rank's output split for a peer equal that peer's input split "
                       "for it: exchange the split sizes first.",
    fk.TAG_MISMATCH: "Use the same tag on both sides of each send/recv pair.",
    fk.GROUP_MISMATCH: "Call new_group() on every rank, in the same order, with the same rank "
                       "list (every rank of the world must call it, members or not).",
    fk.MISSING_COLLECTIVE: "Find why the ranks that never issued it did not reach that line "
                           "(a rank-dependent branch, an early return, fewer loop iterations) "
                           "and make every rank of the group issue it.",
    fk.CALLSITE_DIVERGENCE: "Check that these lines are meant to pair up across ranks; if one "
                            "of them runs on only some ranks, the ranks are out of step from "
                            "here on.",
    fk.WAIT_CYCLE: "Issue collectives on the groups in the same order on every rank.",
    fk.RANK_CRASHED: "Fix the failure on the rank that crashed first; the others only lost "
                     "their peer.",
    fk.RANK_EXITED_EARLY: "Every rank must issue the same collectives before it exits.",
    fk.INIT_INCOMPLETE: "Every rank must call init_process_group; see where the late rank was.",
    fk.RANK_STUCK: "Look at the stack shown: that is where the rank waits (a lock, a queue, a "
                   "file, a child process); make every rank get past it.",
    fk.TEARDOWN_ABORT: "Nothing to fix in the training; call dist.destroy_process_group() at "
                       "the end of the script.",
}


# Findings that hold however a run was stopped: two ranks' calls at one position differ.
INTERRUPT_PROOF = MISMATCH_KINDS + (fk.GROUP_MISMATCH, fk.CALLSITE_DIVERGENCE)


def collect_findings(run: Run, alignment: Alignment, states: dict[int, RankState]) -> list[Finding]:
    """Every finding, unordered."""
    out: list[Finding] = []
    for g in alignment.groups.values():
        if g.membership:
            out.append(group_mismatch_finding(g, states))
    out.extend(divergence_finding(d, alignment, states) for d in alignment.divergences())
    cycle = find_cycle(wait_edges(alignment, states))
    if cycle:
        out.append(cycle_finding(cycle, alignment))
    out.extend(crash_findings(states))
    out.extend(exited_early_findings(alignment, states))
    out.extend(teardown_findings(states))
    out.extend(init_findings(states))
    out.extend(stuck_findings(run, states))
    return out


def _beyond_cut(f: Finding, cut: set[int]) -> bool:
    """Whether ``f`` rests on records a cut trace does not hold: a cut rank that did not issue
    the collective in question, or that 'exited early'."""
    return any(r in f.ranks and (f.ranks[r].op is None or f.kind == fk.RANK_EXITED_EARLY)
               for r in cut) and f.kind not in (fk.RANK_CRASHED, fk.RANK_STUCK)


def explain(findings: list[Finding], ctx: RuleContext) -> None:
    """Attach cause, evidence and advice; consequences of the root share its cause."""
    for f in findings:
        f.cause, f.evidence = recognise(f, ctx)
        if not f.follow_on:
            words = {r: ctx.states[r].backend_words for r in f.ranks
                     if r in ctx.states and ctx.states[r].backend_words
                     and ctx.states[r].status != RankStatus.FINISHED}
            killed = {r for r in words if ctx.states[r].status == RankStatus.KILLED}
            f.evidence = f.evidence + backend_words.evidence(words, killed)
    root = findings[0] if findings else None
    for f in findings[1:]:
        if root is None or root.cause is None or f.kind == fk.TEARDOWN_ABORT:
            continue
        if f.follow_on and f.cause != root.cause:  # order.py marks what the root explains
            f.cause, f.evidence = root.cause, []
    for f in findings:
        cause = catalog.get(f.cause)
        f.advice = cause.fix if cause else GENERIC_ADVICE.get(f.kind, "")


def _notes(run: Run, states: dict[int, RankState], alignment: Alignment) -> list[str]:
    notes = list(run.notes)
    if run.running:
        notes.append("the job is still running: a `ddpdoctor run` holds this log folder, and "
                     "what is shown is where each rank had got; its diagnosis comes when the "
                     "job ends (or, for a job that hangs, when ddpdoctor stops it)")
    remote = [r for r, s in states.items() if s.status == RankStatus.REMOTE]
    if remote:
        notes.append(f"{rank_list(remote)} ran on other nodes of this {run.nnodes}-node job; "
                     f"this report covers the ranks here: `ddpdoctor diff` with every node's "
                     f"log folder compares them all")
    for r, s in states.items():
        if s.status == RankStatus.MISSING:
            notes.append(f"rank {r}: no trace file: the rank never started, or its node's "
                         f"log folder was not given")
        elif s.trace is not None:
            notes.extend(f"rank {r}: {w}" for w in s.trace.warnings if w != s.trace.lost)
            if rs.completions_lost(s.trace):
                notes.append(f"rank {r}: its trace holds no completion record although the "
                             f"rank closed it (those lines were lost): which of its "
                             f"collectives completed is unknown, and each reads as pending")
    if run.ranks and not any(t.collectives for t in run.ranks.values()):
        notes.append("no collective was recorded on any rank: nothing was tested")
    elif max(run.world_size, len(states)) == 1:
        notes.append(ONE_RANK_NOTE)
    for r, s in states.items():
        if s.cut:
            last = s.last
            after = f" after collective #{last.seq} ({describe(last)})" if last else ""
            why = (s.short.words(group_text(s.short.group, alignment.members(s.short.group)))
                   if s.short is not None else
                   f"the rank stopped recording ({s.trace.lost})"
                   if s.trace is not None and s.trace.lost else
                   "the job still runs" if s.unended and run.running else
                   "it ran on another node, whose own folder holds how it ended (its exit "
                   "code)" if s.unended and s.trace is not None and s.trace.remote else
                   "it ends with no exit record, no exit code and no hang record (the file "
                   "was cut, or the job still runs, or it was killed with its launcher)"
                   if s.unended else
                   "the rank could not write it (a full disk or a file-size limit)")
            notes.append(f"rank {r}: its trace is cut{after}: {why}, so nothing after that "
                         f"point is compared")
    for r, s in states.items():
        if s.unrecorded_call:
            notes.append(f"rank {r}: at the hang its main thread was inside "
                         f"{s.unrecorded_call}, which the trace does not record")
    interrupted = [r for r, s in states.items() if s.status == RankStatus.INTERRUPTED]
    if interrupted:
        notes.append(f"the run was interrupted (Ctrl-C, or the job was stopped) while "
                     f"{rank_list(interrupted)} still ran: what they were doing then is no "
                     f"finding; only collectives that could never match would be")
    stopped: dict[str, list[RankState]] = {}
    for s in states.values():
        if s.max_steps is not None:
            stopped.setdefault(stop_text(s), []).append(s)
    for _text, alike in sorted(stopped.items()):
        notes.append(f"{rank_list([s.rank for s in alike])} {stop_text(alike[0], len(alike))}")
    ended = [s for alike in stopped.values() for s in alike]
    if ended and all(s.epoch_steps is None and s.epoch_ends == 0 for s in ended):
        steps = ended[0].max_steps
        notes.append(f"the job was stopped at iteration {(steps or 0) + 1}, before any epoch "
                     f"ended: its evaluation, checkpoint and epoch-end code did not run "
                     f"(--epoch-steps 2 instead of --max-steps runs every epoch short and "
                     f"reaches them)")
    models = max((len(s.trace.ddp) for s in states.values() if s.trace is not None), default=0)
    if models > 1:
        notes.append(f"the script made {models} DDP models: an iteration here is a forward "
                     f"through any of them (a GAN's D and G both count), not a step of the "
                     f"training loop" + ("; --max-steps counts the same way" if stopped else ""))
    return notes


def diagnose(run: Run) -> Report:
    """Diagnose a loaded run: what diverged or crashed first, where on each rank, and why."""
    states = rank_states(run)
    alignment = align(run)
    if not run.running:  # a live folder's traces are read one after the other, not at once
        whole = {r for r, t in run.ranks.items() if not t.remote}
        for r, short in peer_proof.shortfalls(alignment, whole).items():
            # It went on past its trace's end: what its trace shows pending is not where
            # it waited.
            states[r].cut, states[r].short, states[r].pending = True, short, []
    # Findings that rest on records a cut trace, a damaged one (a lost line may have been a
    # collective, or a run of them), or another node's folder does not hold.
    cut = {r for r, s in states.items() if s.cut or s.status == RankStatus.REMOTE
           or (s.trace is not None and s.trace.damaged_lines)}
    found = [f for f in collect_findings(run, alignment, states)
             if not (cut and _beyond_cut(f, cut))]
    if any(s.status == RankStatus.INTERRUPTED for s in states.values()):
        # Stopped by the user mid-step: ranks waiting for one another then is no finding;
        # only what can never match (another op, shape, ... at one position) still is.
        found = [f for f in found if f.kind in INTERRUPT_PROOF]
    findings = order(found, states)
    explain(findings, RuleContext(run, alignment, states))
    verdict = verdict_of(findings, states, run.world_size)
    if run.damaged and verdict == Verdict.CLEAN:
        verdict = Verdict.INCOMPLETE  # what was left out may have held what diverged
    return Report(verdict=verdict,
                  world_size=run.world_size,
                  ranks=[RankSummary.of(s) for s in states.values()], findings=findings,
                  notes=_notes(run, states, alignment))


def diagnose_rounds(runs: list[Run]) -> Report:
    """Diagnose each round of a job (one :class:`Run` each, in order; see
    ``trace.reader.load_rounds``) and report the first round that is not clean, or the last
    round when all are, with a note of what the other rounds gave."""
    reports = [diagnose(run) for run in runs]
    if len(reports) == 1:
        return reports[0]
    # A round the script ran with one rank (PyTorch's DDP tutorial sizes its model-parallel
    # round n_gpus // 2, which is 1 of --cpu's 2 devices) could not diverge: it decides
    # nothing while another round was compared.
    lone = [i for i, r in enumerate(reports) if r.verdict == Verdict.UNTESTED and r.world_size <= 1]
    compared = [i for i in range(len(reports)) if i not in lone] or list(range(len(reports)))
    shown = next((i for i in compared if reports[i].verdict != Verdict.CLEAN), compared[-1])
    report = reports[shown]
    others = ", ".join(f"round {i + 1} {r.verdict}" for i, r in enumerate(reports) if i != shown)
    report.notes.insert(0, f"the script made its process group {len(reports)} times (rounds: "
                           f"one mp.spawn each, or init_process_group again after "
                           f"destroy_process_group): this report is round {shown + 1}'s; "
                           f"{others}")
    skipped = [i + 1 for i in lone if i != shown]
    if skipped:
        report.notes.insert(1, f"round{'s' if len(skipped) > 1 else ''} "
                               f"{', '.join(map(str, skipped))} ran one rank, as the script "
                               f"asked (a world size the script computes, such as n_gpus // 2, "
                               f"may be 1 under --cpu's 2 devices): nothing there could "
                               f"diverge, and the rounds that ran two or more decide")
    return report
