"""What each known cause takes for granted, and whether the facts of a finding deny it.

Every cause in ``knowledge/causes.yaml`` lists its premises by name (``premises:``); this
module holds each premise once: its words and the check of a finding against it. A rule in
:mod:`ddpdoctor.analysis.rules` recognises the pattern of its cause; before the cause is given,
:func:`denied` checks that no premise of it is contradicted by the record (two groups where
the cause needs one, equal shapes where it needs them to differ, a rank that ran as many
iterations as the one said to have run more). A premise the record cannot judge (no
iterations in a flight-recorder dump) is not denied. Pure functions of the finding and the
rule context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddpdoctor.analysis.finding import Finding, RankDetail
from ddpdoctor.analysis.ranks import RankStatus
from ddpdoctor.analysis.rule_context import RuleContext
from ddpdoctor.analysis.signature import DDP_STEP_LABELS, site_key
from ddpdoctor.trace import ops
from ddpdoctor.trace.ddp_sites import is_user_call


@dataclass(frozen=True)
class Premise:
    """A fact a cause needs: its words, and whether a finding's record leaves it standing
    (False only when the record contradicts it)."""

    words: str
    holds: Callable[[Finding, RuleContext], bool]



def _groups(f: Finding) -> set[str]:
    return {d.group for d in f.issued().values() if d.group is not None} | (
        {f.group} if f.group is not None else set())


def _ops(f: Finding) -> set[str]:
    return {d.op for d in f.issued().values() if d.op is not None}


def _user_calls(f: Finding) -> dict[int, RankDetail]:
    return {r: d for r, d in f.issued().items() if is_user_call(d.label)}


def _line_issued_before(f: Finding, ctx: RuleContext) -> bool | None:
    """Whether every rank that did not make the user's call here had made it from the same
    line before, in this group (None: no user call or no group to judge by)."""
    user = _user_calls(f)
    if not user or f.group is None:
        return None
    keys = {site_key(d.site) for d in user.values()} - {None}
    if len(keys) != 1:
        return None
    key = next(iter(keys))
    others = [r for r, d in f.ranks.items() if r not in user and site_key(d.site) != key]
    if not others:
        return None
    return all(key in ctx.group_sites(f.group, r) for r in others)


def _fewer_iterations(f: Finding, ctx: RuleContext) -> bool:
    """The ranks without a DDP step collective here ran fewer DDP iterations than those with
    one; not judged without recorded iterations (a flight-recorder dump, a loop without DDP)."""
    ddp = [d.iteration for d in f.issued().values()
           if d.label in DDP_STEP_LABELS and d.iteration]
    if not ddp:
        return True
    short = [r for r, d in f.ranks.items() if d.label not in DDP_STEP_LABELS
             and r in ctx.states and ctx.states[r].trace is not None]
    return not short or any(ctx.states[r].iterations < max(ddp) for r in short)


_DDP_FILE = "nn/parallel/distributed.py"


def _built_ddp(f: Finding, ctx: RuleContext) -> bool:
    """A DDP construction was recorded, a collective here is DDP's, or a rank raised inside
    DDP's constructor (its construction check failed before the construction was recorded)."""
    if any(t.ddp for t in ctx.run.ranks.values()) or \
            any((d.label or "").startswith("ddp.") for d in f.ranks.values()):
        return True
    for state in ctx.states.values():
        exception = (state.trace.exception if state.trace is not None else None) or {}
        for frame in exception.get("frames") or []:
            if isinstance(frame, dict) and \
                    str(frame.get("file", "")).replace("\\", "/").endswith(_DDP_FILE):
                return True
    return False


def _init_of(ctx: RuleContext, rank: int) -> str | None:
    """How far ``rank`` got in init_process_group (None: no trace, or not begun)."""
    trace = ctx.states[rank].trace
    return trace.init if trace is not None else None


def _shapes(f: Finding) -> set[str]:
    return {str(d.shapes) for d in f.issued().values()}


def _dtypes(f: Finding) -> set[str]:
    return {str(d.dtypes) for d in f.issued().values()}


PREMISES: dict[str, Premise] = {
    "one_group": Premise(
        "the ranks involved wait in one process group",
        lambda f, ctx: len(_groups(f)) <= 1),
    "several_groups": Premise(
        "the ranks involved wait in two process groups or more",
        lambda f, ctx: len(_groups(f)) >= 2),
    "point_to_point": Premise(
        "every rank involved waits in a send or a recv",
        lambda f, ctx: bool(_ops(f)) and _ops(f) <= ops.P2P),
    "collective_ops": Premise(
        "the ops involved are collectives, not point-to-point sends and receives",
        lambda f, ctx: not (_ops(f) & ops.P2P)),
    "user_call": Premise(
        "a rank issued it from a call in the script (its own, or a framework's for one of its "
        "calls)",
        lambda f, ctx: bool(_user_calls(f))),
    "only_user_calls": Premise(
        "every rank issued it from a call in the script, none from DDP or join",
        lambda f, ctx: bool(f.issued()) and len(_user_calls(f)) == len(f.issued())),
    "ddp_model": Premise(
        "the script built, or began to build, a DistributedDataParallel model",
        _built_ddp),
    "ddp_collective": Premise(
        "a DDP training-step collective (forward or backward) is involved",
        lambda f, ctx: any(d.label in DDP_STEP_LABELS for d in f.issued().values())),
    "join_protocol": Premise(
        "a rank ran the join protocol",
        lambda f, ctx: any((d.label or "").startswith("join.") for d in f.issued().values())),
    "shapes_differ": Premise(
        "the ranks' tensors differ in shape",
        lambda f, ctx: len(_shapes(f)) > 1),
    "same_shapes_other_dtypes": Premise(
        "the ranks' tensors have one shape and differ in dtype",
        lambda f, ctx: len(_shapes(f)) == 1 and len(_dtypes(f)) > 1),
    "rooted_op": Premise(
        "the op has a root rank (broadcast, reduce, gather, scatter)",
        lambda f, ctx: bool(_ops(f)) and _ops(f) <= ops.ROOTED),
    "reducing_op": Premise(
        "the op reduces (all_reduce, reduce, reduce_scatter)",
        lambda f, ctx: bool(_ops(f)) and _ops(f) <= ops.REDUCING),
    "split_op": Premise(
        "the op moves amounts each rank sets (all_to_all, gather, scatter)",
        lambda f, ctx: bool(_ops(f)) and _ops(f) <= ops.SPLITS),
    "fewer_iterations": Premise(
        "the ranks that did not issue it ran fewer DDP iterations",
        _fewer_iterations),
    "not_a_data_condition": Premise(
        "the ranks that did not issue it had not issued it from that line before (a rank "
        "test, not a condition on their data)",
        lambda f, ctx: _line_issued_before(f, ctx) is not True),
    "line_issued_before": Premise(
        "the ranks that skipped it had issued it from that line before",
        lambda f, ctx: _line_issued_before(f, ctx) is not False),
    "a_rank_failed": Premise(
        "a rank involved raised, failed or was killed",
        lambda f, ctx: any(ctx.states[r].crashed for r in f.ranks if r in ctx.states)),
    "own_failure": Premise(
        "a rank involved failed of its own accord, not only on losing a peer that left no "
        "trace here",
        lambda f, ctx: _own_failure(f, ctx)),
    "aborted_after_finishing": Premise(
        "a rank involved finished its script and died in teardown",
        lambda f, ctx: any(ctx.states[r].teardown_abort for r in f.ranks if r in ctx.states)),
    "outside_collectives": Premise(
        "a rank involved waited outside any collective",
        lambda f, ctx: any(not ctx.states[r].pending for r in f.ranks if r in ctx.states)),
    "cpu_mode": Premise(
        "the job ran with --cpu",
        lambda f, ctx: any(t.cpu_mode for t in ctx.run.ranks.values())),
    "not_cpu_mode": Premise(
        "the job ran as written, without --cpu",
        lambda f, ctx: not any(t.cpu_mode for t in ctx.run.ranks.values())),
    "a_rank_not_initialised": Premise(
        "a rank involved never finished init_process_group",
        lambda f, ctx: any(_init_of(ctx, r) != "completed" for r in f.ranks if r in ctx.states)),
}


def _own_failure(f: Finding, ctx: RuleContext) -> bool:
    """False when every rank of ``f`` that ended badly only lost a peer (a transport error,
    the launcher's teardown) while some rank left no trace here (its file missing, or on a
    node whose folder was not given): the failure that came first is then not on record."""
    states = ctx.states
    if not any(s.status in (RankStatus.MISSING, RankStatus.REMOTE) for s in states.values()):
        return True
    crashed = [states[r] for r in f.ranks if r in states and states[r].crashed]
    return not crashed or any(not (s.comm_error or s.torn_down) for s in crashed)


def denied(premises: tuple[str, ...], f: Finding, ctx: RuleContext) -> list[str]:
    """The words of each of ``premises`` that the finding's record contradicts."""
    return [PREMISES[name].words for name in premises if not PREMISES[name].holds(f, ctx)]
