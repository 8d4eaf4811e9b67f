"""Every known cause states its premises, and facts that contradict one keep it from the report.

For each cause in ``causes.yaml``: a run whose root finding the cause explains (its premises
hold), then the same run with one fact changed so that a premise is false (one group where
two are needed, equal shapes, a rank that ran as many iterations, no DDP model, ...): the
premise is named as denied and the cause is not given.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ddpdoctor.analysis import premises
from ddpdoctor.analysis import ranks as rs
from ddpdoctor.analysis.align import align
from ddpdoctor.analysis.diagnosis import collect_findings, diagnose
from ddpdoctor.analysis.finding import Finding, RankDetail, Severity
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.order import order
from ddpdoctor.analysis.ranks import RankStatus
from ddpdoctor.analysis.rule_context import RuleContext
from ddpdoctor.analysis.rules import RULES, recognise
from ddpdoctor.analysis.signature import site_key
from ddpdoctor.knowledge import catalog
from ddpdoctor.trace.model import Run

from . import scenarios
from .factories import TraceBuilder, healthy_ddp, make_run, ranks
from .test_causes import _teardown_run


def _facts(run: Run, kind: str | None = None) -> tuple[Finding, RuleContext]:
    """The first finding of ``run`` (of ``kind``), uncaused, with the rules' context."""
    states = rs.rank_states(run)
    alignment = align(run)
    findings = order(collect_findings(run, alignment, states), states)
    f = next(f for f in findings if kind is None or f.kind == kind)
    return f, RuleContext(run, alignment, states)


def _made(kind: fk, details: dict[int, RankDetail], run: Run) -> tuple[Finding, RuleContext]:
    """A finding built by hand over ``run``'s context (kinds only endings or cycles make)."""
    states = rs.rank_states(run)
    f = Finding(kind, Severity.ERROR, details[min(details)].group, None, "built", details)
    return f, RuleContext(run, align(run), states)


# -- the runs ------------------------------------------------------------------------------
def _raised(message: str, cpu_mode: bool = False) -> Run:
    bs = [TraceBuilder(r, 2) for r in range(2)]
    for b in bs:
        if cpu_mode:
            b.trace.process = {**(b.trace.process or {}), "cpu_mode": True}
        b.raise_("RuntimeError", message, line=12)
    return make_run(*bs)


def _teardown() -> Run:
    return make_run(*healthy_ddp(world=2), exit_codes={0: 0, 1: -6})


def _never_initialised() -> Run:
    bs = ranks(2)
    bs[0].trace.init = "pending"
    return make_run(*bs, stopped_for_hang=True)


def _no_sync() -> Run:
    """Rank 1's backward of iteration 3 ran under no_sync(); rank 0's all-reduced."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[0].forward().backward(state="pending")
    bs[1].forward()
    bs[1].user("all_reduce", line=44, state="pending")
    return make_run(*bs, stopped_for_hang=True)


def _split() -> Run:
    bs = [TraceBuilder(r, 2) for r in range(2)]
    for b in bs:
        sends = (8, 4) if b.rank == 1 else (4, 4)
        c = b.coll("all_to_all_single", shapes=[[sum(sends) // 4, 4]], line=50, state="pending")
        c.sends, c.recvs, c.row = sends, (4, 4), 4
    return make_run(*bs, stopped_for_hang=True)


def _tag() -> Run:
    a, b = TraceBuilder(0), TraceBuilder(1)
    a.coll("send", peer=1, shapes=[[2]], line=43, state="pending").tag = None
    b.coll("recv", peer=0, shapes=[[2]], line=47, state="pending").tag = 1
    return make_run(a, b, stopped_for_hang=True)


def _stuck() -> tuple[Finding, RuleContext]:
    return _made(fk.RANK_STUCK, {0: RankDetail(rank=0, state="running")},
                 make_run(*healthy_ddp(world=2)))


def _ring(group_of_rank_1: str = "0") -> tuple[Finding, RuleContext]:
    return _made(fk.WAIT_CYCLE, {0: RankDetail(rank=0, op="recv", group="0"),
                                 1: RankDetail(rank=1, op="send", group=group_of_rank_1)},
                 make_run(*[TraceBuilder(r, 2) for r in range(2)]))


# -- the contradictions -------------------------------------------------------------------
Facts = tuple[Finding, RuleContext]


def _no_ddp(facts: Facts) -> None:
    """No DDP construction recorded, and the finding's collectives the script's own."""
    for trace in facts[1].run.ranks.values():
        trace.ddp = []
    _no_ddp_collective(facts)


def _relabel(prefix: str, to: str) -> Callable[[Facts], None]:
    """The finding's collectives labelled ``prefix``... relabelled ``to``."""
    def change(facts: Facts) -> None:
        for d in facts[0].ranks.values():
            if d.label and d.label.startswith(prefix):
                d.label = to
    return change


_no_ddp_collective = _relabel("ddp.", "user")
_no_join = _relabel("join.", "ddp.bucket")


def _as_many_iterations(facts: Facts) -> None:
    f, ctx = facts
    for state in ctx.states.values():
        state.iterations = 10 ** 6


def _issued_the_line_before(facts: Facts) -> None:
    f, ctx = facts
    key = next(site_key(d.site) for d in f.ranks.values() if d.op is not None)
    for r in f.ranks:
        ctx.group_sites(f.group, r).add(key)


def _never_issued_the_line(facts: Facts) -> None:
    f, ctx = facts
    for r in f.ranks:
        ctx.group_sites(f.group, r).clear()


def _nobody_failed(facts: Facts) -> None:
    for state in facts[1].states.values():
        state.status = RankStatus.HUNG


def _one_group(facts: Facts) -> None:
    f, _ = facts
    for d in f.ranks.values():
        d.group = f.group


def _set(**fields: object) -> Callable[[Facts], None]:
    def change(facts: Facts) -> None:
        for d in facts[0].ranks.values():
            if d.op is not None:
                for name, value in fields.items():
                    setattr(d, name, value)
    return change


def _rank_1_shape(facts: Facts) -> None:
    facts[0].ranks[1].shapes = [[99]]


def _no_abort(facts: Facts) -> None:
    for state in facts[1].states.values():
        state.teardown_abort = False


def _initialised(facts: Facts) -> None:
    for trace in facts[1].run.ranks.values():
        trace.init = "completed"


def _waiting_in_collectives(facts: Facts) -> None:
    f, ctx = facts
    anything = next(c for t in ctx.run.ranks.values() for c in t.collectives)
    for r in f.ranks:
        ctx.states[r].pending = [anything]


def _cpu_mode(on: bool) -> Callable[[Facts], None]:
    def change(facts: Facts) -> None:
        for trace in facts[1].run.ranks.values():
            trace.process = {**(trace.process or {}), "cpu_mode": on}
    return change


def _run(build: Callable[[], Run], kind: str | None = None) -> Callable[[], Facts]:
    return lambda: _facts(build(), kind)


NO_GPU = "No CUDA GPUs are available"
# cause -> (the facts it explains, the change that denies a premise of it, that premise)
CASES: dict[str, tuple[Callable[[], Facts], Callable[[Facts], None], str]] = {
    "rank_conditional_ddp_forward": (_run(scenarios.seed000_nograd), _no_ddp_collective,
                                     "ddp_collective"),
    "uneven_inputs": (_run(scenarios.seed001_case2), _as_many_iterations, "fewer_iterations"),
    "collective_inside_join": (_run(scenarios.seed001_case4), _no_join, "join_protocol"),
    "rank_conditional_collective": (_run(scenarios.logging_reduce_on_rank0),
                                    _issued_the_line_before, "not_a_data_condition"),
    "data_dependent_skip": (_run(scenarios.nan_skip), _never_issued_the_line,
                            "line_issued_before"),
    "rank_crashed": (_run(scenarios.seed003_crash), _nobody_failed, "a_rank_failed"),
    "group_order_inversion": (_run(scenarios.group_inversion), _one_group, "several_groups"),
    "rank_dependent_shape": (_run(scenarios.rank_dependent_shape), _set(shapes=[[3]]),
                             "shapes_differ"),
    "rank_dependent_dtype": (_run(scenarios.rank_dependent_dtype), _rank_1_shape,
                             "same_shapes_other_dtypes"),
    "broadcast_root_mismatch": (_run(scenarios.broadcast_root_mismatch), _set(op="all_reduce"),
                                "rooted_op"),
    "rank_dependent_reduce_op": (_run(scenarios.reduce_op_mismatch), _set(op="broadcast"),
                                 "reducing_op"),
    "ddp_model_mismatch": (_run(scenarios.model_mismatch), _no_ddp, "ddp_model"),
    "gloo_teardown_abort": (_run(_teardown), _no_abort, "aborted_after_finishing"),
    "rank_never_initialised": (_run(_never_initialised), _initialised,
                               "a_rank_not_initialised"),
    "rank_stuck_in_user_code": (_stuck, _waiting_in_collectives, "outside_collectives"),
    "no_gpu": (_run(lambda: _raised(NO_GPU)), _cpu_mode(True), "not_cpu_mode"),
    "cpu_mode_unmapped": (_run(lambda: _raised(NO_GPU, cpu_mode=True)), _cpu_mode(False),
                          "cpu_mode"),
    "shared_gpu": (_run(lambda: _raised("Duplicate GPU detected : rank 0 and rank 1 both on "
                                        "CUDA device 60")), _nobody_failed, "a_rank_failed"),
    "rank_dependent_no_sync": (_run(_no_sync), _no_ddp_collective, "ddp_collective"),
    "rank_blocked_outside_collectives": (_run(lambda: _teardown_run(scenarios.TIMEOUT)),
                                         _waiting_in_collectives, "outside_collectives"),
    "rank_dependent_split_sizes": (_run(_split), _set(op="all_reduce"), "split_op"),
    "p2p_tag_mismatch": (_run(_tag), _set(op="all_reduce"), "point_to_point"),
    "p2p_peer_mismatch": (_ring, lambda facts: setattr(facts[0].ranks[1], "group", "1"),
                          "one_group"),
}


def test_every_cause_states_premises_each_in_words_and_has_a_case_here() -> None:
    causes = catalog.causes()
    assert set(CASES) == set(causes) >= {cause for cause, _ in RULES}
    for cause in causes.values():
        assert cause.premises, cause.id
        assert set(cause.premises) <= set(premises.PREMISES), cause.id
    used = {p for cause in causes.values() for p in cause.premises}
    assert used == set(premises.PREMISES), "a premise no cause takes"


@pytest.mark.parametrize("cause", sorted(CASES))
def test_a_cause_is_given_where_its_premises_hold_and_not_where_the_facts_deny_one(
        cause: str) -> None:
    build, contradict, premise = CASES[cause]
    assert premise in catalog.get(cause).premises
    f, ctx = build()
    assert premises.denied(catalog.get(cause).premises, f, ctx) == []
    assert recognise(f, ctx)[0] == cause, f.summary

    f, ctx = build()
    contradict((f, ctx))
    assert premises.PREMISES[premise].words in premises.denied(catalog.get(cause).premises,
                                                               f, ctx)
    given, evidence = recognise(f, ctx)
    assert given != cause, evidence


def test_a_pattern_whose_premise_fails_says_so_when_no_other_cause_fits() -> None:
    # Shapes that differ with no shapes recorded apart (a damaged record): the pattern of
    # rank_dependent_shape is there, its premise is not; no other cause fits, and the
    # evidence says which premise failed instead of giving the nearest story.
    f, ctx = _facts(scenarios.rank_dependent_shape())
    for d in f.ranks.values():
        d.shapes = [[3]]
    cause, evidence = recognise(f, ctx)
    assert cause is None
    assert evidence == ["not rank_dependent_shape: it needs that the ranks' tensors differ in "
                        "shape, and the record shows otherwise"]


def test_the_lightning_story_without_the_self_log_label_is_no_uneven_inputs() -> None:
    """Rank 0 alone syncs a metric in a barrier placed at trainer.fit(); rank 1 finished after
    as many DDP forwards (its validation ones issued nothing): the uneven-inputs pattern (the
    line ran fewer times on rank 1) is there, its premise (fewer iterations) is not."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(6)
        b.iteration = 8  # two validation forwards, no collective
    bs[0].user("barrier", line=53, state="pending")
    bs[1].finish()
    bs[1].trace.exit = {**(bs[1].trace.exit or {}), "iteration": 8}
    report = diagnose(make_run(*bs, stopped_for_hang=True))
    assert report.root.cause != "uneven_inputs", report.root.evidence


def _construction_check_failed(in_ddp: bool) -> Run:
    """DDP's construction check raised on both ranks (param_mismatch.py): no DDP construction
    was recorded, the exception's frames are in DDP's constructor (``in_ddp``)."""
    bs = [TraceBuilder(r, 2) for r in range(2)]
    ddp = "/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"
    for b in bs:
        b.raise_("RuntimeError", "DDP expects same model across all ranks, but Rank 1 has 2 "
                 "params, while rank 0 has inconsistent 1 params.", line=15)
        if in_ddp:
            b.trace.exception["frames"].append({"file": ddp, "line": 835,
                                                "function": "__init__"})
    return make_run(*bs)


def test_a_failed_construction_check_is_a_model_mismatch_only_inside_ddp() -> None:
    assert diagnose(_construction_check_failed(True)).root.cause == "ddp_model_mismatch"
    f, ctx = _facts(_construction_check_failed(False))
    assert premises.PREMISES["ddp_model"].words in premises.denied(("ddp_model",), f, ctx)
    assert recognise(f, ctx)[0] != "ddp_model_mismatch"
