"""The ranks vouch for each other: a collective that completed on one rank proves every member
issued it, so a trace shorter than that is incomplete and grounds no finding; a rank that left
no trace here keeps its peers' transport errors from being called the cause (issue 53)."""

from __future__ import annotations

import dataclasses

from ddpdoctor.analysis import diagnose, peer_proof, premises
from ddpdoctor.analysis import ranks as rs
from ddpdoctor.analysis.align import align
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.trace.model import Collective, RankTrace

from . import scenarios
from .factories import healthy_ddp, make_run, ranks


def _cut(trace: RankTrace, keep: int, exit_too: bool = True) -> RankTrace:
    """``trace`` holding only its first ``keep`` collectives (and, with ``exit_too``, no
    ending either): a file cut at a line end, or lines deleted."""
    out = dataclasses.replace(trace, collectives=list(trace.collectives[:keep]))
    if exit_too:
        out.exit = out.exception = None
    return out


def test_a_trace_shorter_than_a_peer_proves_is_incomplete_and_blames_nobody() -> None:
    # seed 003 with rank 0's trace cut after DDP's first collective: alone it reads as
    # "rank 1 issued the all_gather ... which rank 0 never issued".
    run = scenarios.seed003_crash()
    run.ranks[0] = _cut(run.ranks[0], 0)
    run.exit_codes = {0: -15, 1: 1}  # torchrun's SIGTERM of the survivor
    short = peer_proof.shortfalls(align(run), set(run.ranks))
    assert set(short) == {0}
    assert short[0].peer == 1 and short[0].issued == 0 and short[0].op == "all_reduce"
    report = diagnose(run)
    root = report.findings[0]
    assert (root.kind, root.cause) == (fk.RANK_CRASHED, "rank_crashed")
    assert 1 in root.ranks and root.ranks[1].site.line == 8  # rank 1's raise
    assert not any(f.kind == fk.MISSING_COLLECTIVE for f in report.findings)
    note = next(n for n in report.notes if n.startswith("rank 0: its trace is cut"))
    assert "rank 1 completed collective" in note and "incomplete" in note
    assert "before any collective" not in " ".join(f.summary for f in report.findings)


def test_a_hung_rank_cut_at_a_line_end_is_no_uneven_inputs() -> None:
    # Both ranks run seven forwards; rank 0 then waits in the seventh backward's bucket while
    # rank 1 is elsewhere. Rank 1's trace cut twelve lines back reads, alone, as rank 0
    # having run more iterations.
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(6).forward()
    bs[0].backward().pend_last()
    run = make_run(*bs, stopped_for_hang=True)
    assert diagnose(run).findings[0].kind == fk.MISSING_COLLECTIVE  # the whole record
    run.ranks[1] = _cut(run.ranks[1], len(run.ranks[1].collectives) - 12)
    report = diagnose(run)
    assert report.verdict == "incomplete" and report.findings == []
    assert any(n.startswith("rank 1: its trace is cut after collective #14") and
               "rank 0 completed collective #24" in n for n in report.notes)


def _with_op(trace: RankTrace, index: int, **changes: object) -> RankTrace:
    colls: list[Collective] = list(trace.collectives)
    colls[index] = dataclasses.replace(colls[index], **changes)
    return dataclasses.replace(trace, collectives=colls)


def test_only_ops_that_need_every_member_prove() -> None:
    # Rank 1's last collective, a broadcast from rank 1 that completed on its root, does not
    # prove that rank 0 entered it: a root's send may complete before the receiver is there.
    bs = ranks(2)
    for b in bs:
        b.user("all_reduce")
    bs[0].finish()
    bs[1].user("broadcast", root=1).finish()
    run = make_run(*bs)
    assert peer_proof.shortfalls(align(run), set(run.ranks)) == {}
    # The same position as an all_reduce does.
    run.ranks[1] = _with_op(run.ranks[1], 1, op="all_reduce", root=None, reduce_op="SUM")
    assert set(peer_proof.shortfalls(align(run), set(run.ranks))) == {0}
    # A pending one proves nothing.
    run.ranks[1] = _with_op(run.ranks[1], 1, state="pending")
    assert peer_proof.shortfalls(align(run), set(run.ranks)) == {}


def test_groups_whose_members_disagree_and_live_folders_prove_nothing() -> None:
    bs = ranks(3)
    for b in bs:
        b.new_group("1", [0, 1] if b.rank < 2 else [1, 2])
    for b in bs[:2]:
        b.user("all_reduce", group="1")
    bs[1].user("all_reduce", group="1")
    run = make_run(*[b.finish() for b in bs])
    assert peer_proof.shortfalls(align(run), set(run.ranks)) == {}  # "1" is two groups here
    run = make_run(*healthy_ddp(2, 3))
    run.ranks[0] = _cut(run.ranks[0], 4)
    run.running = True  # read one file after the other while the ranks go on
    assert not any("its trace is cut" in n and "completed collective" in n
                   for n in diagnose(run).notes)


def test_a_lost_peer_with_no_trace_here_is_no_crash_cause() -> None:
    # Rank 1's file is missing; rank 0 only lost its peer: which rank failed first, and why,
    # is not on record, so no cause that blames rank 0's line.
    run = scenarios.seed003_crash()
    del run.ranks[1]
    report = diagnose(run)
    root = report.findings[0]
    assert root.kind == fk.RANK_CRASHED and root.cause != "rank_crashed"
    assert any(premises.PREMISES["own_failure"].words in e for e in root.evidence)
    # With rank 1's trace there, its own error is the cause.
    assert diagnose(scenarios.seed003_crash()).findings[0].cause == "rank_crashed"


def test_a_closed_trace_without_completions_says_so() -> None:
    bs = healthy_ddp(2, 2)
    run = make_run(*bs)
    trace = run.ranks[1]
    trace.version = 9  # its completions come from done records, none of which is there
    for c in trace.collectives:
        c.state = "pending"
    assert rs.completions_lost(trace)
    notes = diagnose(run).notes
    assert any(n.startswith("rank 1: its trace holds no completion record") for n in notes)
    assert not rs.completions_lost(run.ranks[0])  # version 0: completion in each line


def test_a_subgroup_s_completed_collective_vouches_only_for_its_members() -> None:
    # 4 ranks, two data-parallel pairs (groups "1": ranks 0-1, "2": ranks 2-3). Rank 3's trace
    # lost its last lines: rank 2's completed all-reduces in group "2" prove it short; the
    # pair of ranks 0-1, whose own group says nothing of rank 3, proves nothing of it there.
    bs = ranks(4)
    for b in bs:
        b.new_group("1", [0, 1]).new_group("2", [2, 3])
        b.user("all_reduce")  # the default group: every rank
        for _ in range(5):
            b.user("all_reduce", group="1" if b.rank < 2 else "2")
        b.finish()
    run = make_run(*bs)
    assert peer_proof.shortfalls(align(run), set(run.ranks)) == {}
    run.ranks[3] = _cut(run.ranks[3], 3)
    short = peer_proof.shortfalls(align(run), set(run.ranks))
    assert list(short) == [3] and (short[3].group, short[3].peer, short[3].seq) == ("2", 2, 5)
    report = diagnose(run)
    assert report.verdict == "incomplete" and not report.findings
    assert any(n.startswith("rank 3: its trace is cut") and "group 2 (ranks 2, 3)" in n
               for n in report.notes), report.notes
