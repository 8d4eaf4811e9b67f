"""Every finding kind on hand-built traces, the per-rank details, and root-cause precedence."""

from __future__ import annotations

from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis.report import Report

from .factories import TraceBuilder, healthy_ddp, make_run, ranks


def diag(*builders: TraceBuilder, **kw) -> Report:
    return diagnose(make_run(*builders, **kw))


def kinds(report: Report) -> list[str]:
    return [f.kind for f in report.findings]


def errors(report: Report) -> list[str]:
    return [f.kind for f in report.findings if f.is_error]


# -- healthy runs ------------------------------------------------------------------------------
def test_healthy_ddp_is_clean() -> None:
    report = diag(*healthy_ddp(world=2, iterations=4))
    assert report.verdict == "clean"
    assert report.findings == []
    assert [r.status for r in report.ranks] == ["finished", "finished"]
    assert report.ranks[0].iterations == 4
    assert report.all_finished and not report.has_errors


def test_healthy_join_uneven_unused_params_groups_and_p2p_is_clean() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init(find_unused_parameters=True)
        b.new_group("1", [0, 1]).new_group("2", [1]).new_group("3", [0])
    for _ in range(2):
        for b in bs:
            b.step((16, 28), join=True, authority=1, unused=8)
        bs[0].user("barrier", group="3", line=25)
    bs[1].step((16, 28), join=True, authority=1, unused=8)
    bs[1].step((16, 28), join=True, authority=1, unused=8)
    bs[0].join_shadow((16, 28), unused=8, authority=1)
    bs[0].join_shadow((16, 28), unused=8, authority=1)
    for b in bs:
        b.join_end(last_joiner=1)
        b.user("all_reduce", group="1", shapes=[[2]], line=40)
        b.user("all_gather", shapes=[[1]], dtypes=["int64"], api="all_gather_object", line=41)
        b.user("all_gather", shapes=[[5]], dtypes=["uint8"], api="all_gather_object", line=41)
    bs[0].user("send", peer=1, shapes=[[3]], line=43)
    bs[1].user("recv", peer=0, shapes=[[3]], line=45)
    for b in bs:
        b.finish()
    report = diag(*bs)
    assert report.verdict == "clean", [f.summary for f in report.findings]
    assert not report.has_errors
    assert report.findings == []


# -- mismatches --------------------------------------------------------------------------------
def test_op_mismatch_names_ranks_ops_lines_and_iterations() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init(buffers=False).train(5, buffers=False)
    bs[0].user("barrier", line=32)  # rank 0 is done and waits at a barrier
    bs[0].pend_last()
    bs[1].step(buffers=False)  # rank 1 has one more batch
    bs[1].pend_last()
    report = diag(*bs, stopped_for_hang=True)
    root = report.root
    assert report.verdict == "diverged"
    assert root.kind == "op_mismatch" and root.severity == "error" and root.group == "0"
    d0, d1 = root.ranks[0], root.ranks[1]
    assert (d0.op, d0.label, d0.site.line, d0.iteration, d0.state) == \
        ("barrier", "user", 32, 5, "pending")
    assert (d1.op, d1.label, d1.site.line, d1.iteration) == ("all_reduce", "ddp.bucket", 21, 6)
    assert "gradient bucket 0 of iteration 6" in root.summary
    assert "rank 0" in root.summary and "rank 1" in root.summary
    assert "train.py:32" in root.summary
    assert root.context and root.context[0].label == "ddp.bucket"
    assert root.context_seq == root.seq - 1
    assert report.ranks[0].status == "hung"


def test_shape_dtype_reduce_root_mismatch_kinds() -> None:
    cases = {
        "shape_mismatch": ({"shapes": [[3]]}, {"shapes": [[4]]}),
        "dtype_mismatch": ({"dtypes": ["float32"]}, {"dtypes": ["float64"]}),
        "reduce_op_mismatch": ({"reduce_op": "SUM"}, {"reduce_op": "MAX"}),
    }
    for kind, (a, b) in cases.items():
        bs = ranks(2)
        bs[0].coll("all_reduce", **a)
        bs[1].coll("all_reduce", **b)
        report = diag(*bs)
        assert report.root.kind == kind, kind
        assert report.verdict == "diverged"
    bs = ranks(2)
    bs[0].coll("broadcast", root=0, line=9)
    bs[1].coll("broadcast", root=1, line=9)
    report = diag(*bs)
    assert report.root.kind == "root_mismatch"
    assert "root 0" in report.root.summary and "root 1" in report.root.summary


# -- missing, exited early -------------------------------------------------------------------
def test_missing_collective_and_rank_exited_early() -> None:
    bs = ranks(2)
    bs[0].ddp_init(buffers=False).train(5, buffers=False).finish()
    bs[1].ddp_init(buffers=False).train(5, buffers=False).step(buffers=False)
    bs[1].fail_last().raise_("RuntimeError", "[pair.cc:553] Connection closed by peer "
                             "[127.0.0.1]:2706. This is typically caused by a remote worker "
                             "crashing.", line=21, internal=True)
    report = diag(*bs)
    assert report.verdict == "diverged"
    assert kinds(report) == ["missing_collective", "rank_exited_early", "rank_crashed"]
    root, early, crash = report.findings
    assert root.ranks[1].op == "all_reduce" and root.ranks[1].state == "failed"
    assert root.ranks[0].op is None and root.ranks[0].state == "finished"
    assert root.ranks[0].site is None  # it is nowhere in the script any more
    assert "rank 0 finished its script after iteration 5" in root.summary
    assert "rank 1 waits in DDP gradient bucket 0 of iteration 6" in root.summary
    assert early.follow_on and list(early.ranks) == [0, 1]
    assert crash.follow_on and "Connection closed by peer [127.0.0.1]:2706" in crash.summary
    assert "typically" not in crash.summary  # the gist of the gloo message only
    assert report.ranks[1].status == "exception"


def test_rank_exited_early_alone_when_the_waiter_is_in_a_group_it_belongs_to() -> None:
    bs = ranks(3)
    for b in bs:
        b.new_group("1", [0, 1, 2])
        b.user("all_reduce", group="1")
    bs[0].finish()
    for r in (1, 2):
        bs[r].user("barrier", group="1", line=60).pend_last()
    report = diag(*bs, stopped_for_hang=True)
    assert report.root.kind == "missing_collective"
    assert [f.kind for f in report.findings[1:]] == ["rank_exited_early"]
    assert report.findings[1].ranks[0].state == "finished"


# -- call sites --------------------------------------------------------------------------------
def _seed000(world_end: bool = True) -> list[TraceBuilder]:
    """Rank 0 evaluates through the DDP wrapper under no_grad after each epoch (seed 000)."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].forward(line=63, function="evaluate", grad=False)  # matched by rank 1's training
    for b in bs:
        b.backward() if b.rank == 0 else b.step()
    bs[1].train(1)
    bs[0].train(1)
    bs[0].forward(line=63, function="evaluate", grad=False)  # nobody left to match it
    bs[0].fail_last()
    bs[1].finish()
    return bs


def test_callsite_divergence_is_the_root_before_later_errors() -> None:
    report = diag(*_seed000())
    root = report.root
    assert report.verdict == "diverged"
    assert root.kind == "callsite_divergence"
    assert root.severity == "error"  # promoted: later errors in its group follow from it
    assert root.ranks[0].site.function == "evaluate" and root.ranks[0].site.line == 63
    assert root.ranks[1].site.function == "main" and root.ranks[1].site.line == 20
    assert root.ranks[0].label == root.ranks[1].label == "ddp.buffers"
    assert "buffer broadcast of iteration 4" in root.summary
    assert "missing_collective" in kinds(report)[1:]


def test_callsite_divergence_alone_is_a_warning_and_the_run_clean() -> None:
    bs = ranks(2)
    bs[0].user("broadcast", root=0, line=10)
    bs[1].user("broadcast", root=0, line=12)
    for b in bs:
        b.finish()
    report = diag(*bs)
    assert report.verdict == "clean"
    assert kinds(report) == ["callsite_divergence"]
    assert report.root.severity == "warning"


def test_join_pairs_are_not_callsite_divergences() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init()
    bs[0].step(join=True, authority=1).join_shadow(authority=1, rebuild=True)
    bs[1].step(join=True, authority=1).step(join=True, authority=1)
    for b in bs:
        b.join_end().finish()
    report = diag(*bs)
    assert report.findings == [] and report.verdict == "clean"


# -- wait cycle --------------------------------------------------------------------------------
def test_wait_cycle_across_groups_is_the_root() -> None:
    bs = ranks(2)
    for b in bs:
        b.new_group("1", [0, 1]).new_group("2", [0, 1]).user("all_reduce", shapes=[[3]])
    bs[0].user("all_reduce", group="1", shapes=[[3]], line=9).pend_last()
    bs[1].user("all_reduce", group="2", shapes=[[3]], line=12).pend_last()
    report = diag(*bs, stopped_for_hang=True)
    assert report.verdict == "diverged"
    root = report.root
    assert root.kind == "wait_cycle"
    assert root.ranks[0].group == "1" and root.ranks[1].group == "2"
    assert root.ranks[0].site.line == 9 and root.ranks[1].site.line == 12
    assert "rank 0 waits" in root.summary and "for rank 1" in root.summary
    assert all(f.follow_on for f in report.findings[1:])
    assert [r.status for r in report.ranks] == ["hung", "hung"]


def test_wait_cycle_through_point_to_point() -> None:
    bs = ranks(2)
    bs[0].user("recv", peer=1, shapes=[[3]], line=7).pend_last()
    bs[1].user("barrier", line=8).pend_last()
    report = diag(*bs, stopped_for_hang=True)
    assert report.root.kind == "wait_cycle"
    assert report.root.ranks[0].op == "recv" and report.root.ranks[1].op == "barrier"


# -- crashes -----------------------------------------------------------------------------------
def test_rank_crashed_is_the_root_with_where_the_others_were_left() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[1].raise_("ValueError", "Simulated error in process 1", line=8)
    bs[0].step().fail_last()
    bs[0].raise_("RuntimeError", "Connection closed by peer [127.0.0.1]:1", line=21,
                 internal=True)
    report = diag(*bs)
    assert report.verdict == "crashed"
    root = report.root
    assert root.kind == "rank_crashed" and not root.follow_on
    assert root.ranks[1].state == "exception" and root.ranks[1].site.line == 8
    assert root.ranks[1].op is None
    assert "ValueError: Simulated error in process 1" in root.summary
    assert root.ranks[0].op == "all_reduce" and root.ranks[0].state == "failed"
    assert "rank 0 was left waiting in DDP gradient bucket 0 of iteration 3" in root.summary
    rest = report.findings[1:]
    assert {f.kind for f in rest} == {"missing_collective", "rank_crashed"}
    assert all(f.follow_on for f in rest)


def test_crash_line_is_the_innermost_user_frame() -> None:
    b = TraceBuilder(0, 1)
    b.user("barrier")
    b.trace.exception = {"t": 5.0, "type": "KeyError", "message": "'x'", "frames": [
        {"file": "/work/job/train.py", "line": 3, "function": "<module>"},
        {"file": "/work/job/train.py", "line": 30, "function": "main"},
        {"file": "/work/job/utils.py", "line": 7, "function": "load"},
        {"file": "/usr/lib/python3.11/json/__init__.py", "line": 293, "function": "load"},
        {"file": "/venv/lib/python3.11/site-packages/torch/serialization.py", "line": 9,
         "function": "f"}]}
    report = diag(b)
    site = report.root.ranks[0].site
    assert (site.file, site.line, site.function) == ("/work/job/utils.py", 7, "load")


def test_killed_rank_is_primary_and_sigterm_others_are_follow_ons() -> None:
    bs = ranks(3)
    for b in bs:
        b.ddp_init(buffers=False).train(2, buffers=False)
    bs[0].step(buffers=False).pend_last()
    bs[2].step(buffers=False).pend_last()
    report = diag(*bs, exit_codes={0: -15, 1: -9, 2: -15})
    assert report.verdict == "crashed"
    root = report.root
    assert root.kind == "rank_crashed" and root.ranks[1].state == "killed"
    assert "SIGKILL" in root.summary
    crashed = [f for f in report.findings if f.kind == "rank_crashed"]
    assert len(crashed) == 2  # the two SIGTERMed ranks share one follow-on finding
    assert crashed[1].follow_on and sorted(crashed[1].ranks) == [0, 2]
    assert crashed[1].summary.startswith("Ranks 0, 2 were killed by SIGTERM")


def test_launcher_stop_for_hang_is_not_a_crash() -> None:
    bs = ranks(2)
    bs[0].user("barrier").pend_last()
    bs[1].user("all_reduce", shapes=[[1]])
    report = diag(*bs, exit_codes={0: -15, 1: -15}, stopped_for_hang=True)
    assert "rank_crashed" not in kinds(report)
    assert report.root.kind == "op_mismatch"


# -- teardown, incomplete, groups ----------------------------------------------------------------
def test_teardown_abort_after_finishing_is_a_warning_only() -> None:
    report = diag(*healthy_ddp(world=2), exit_codes={0: 0, 1: -6})
    assert report.verdict == "clean"
    assert kinds(report) == ["teardown_abort"]
    f = report.root
    assert f.severity == "warning" and f.cause == "gloo_teardown_abort"
    assert "SIGABRT" in f.summary
    assert report.ranks[1].status == "finished" and report.all_finished


def test_a_rank_the_launcher_stopped_after_a_teardown_abort_is_not_said_to_abort() -> None:
    report = diag(*healthy_ddp(world=3), exit_codes={0: 0, 1: -15, 2: -6})
    assert report.verdict == "clean" and kinds(report) == ["teardown_abort"]
    summary = report.root.summary
    assert summary.startswith("Rank 2 finished its script, then its process died with SIGABRT"), \
        summary
    assert "the launcher then stopped rank 1, finished too, with SIGTERM" in summary, summary


def test_a_rank_the_launcher_stopped_before_it_finished_is_a_consequence_of_the_abort(
        ) -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[1].finish()  # then aborted in teardown; rank 0 still ran (a checkpoint) and got SIGTERM
    report = diag(*bs, exit_codes={0: -15, 1: -6})
    assert report.verdict == "crashed"
    root = report.root
    assert root.kind == "teardown_abort" and root.severity == "error", report.findings
    assert root.summary.startswith("Rank 1 finished its script, then its process died with "
                                   "SIGABRT"), root.summary
    assert "stopped rank 0 with SIGTERM during iteration 3, before it finished" in root.summary
    assert "results are complete" not in root.summary
    follow = [f for f in report.findings if f.kind == "rank_crashed"]
    assert len(follow) == 1 and follow[0].follow_on and list(follow[0].ranks) == [0]


def test_a_teardown_abort_beside_a_rank_that_raised_stays_a_warning() -> None:
    bs = ranks(3)
    for b in bs:
        b.ddp_init().train(3)
    bs[1].finish()
    bs[2].raise_("ValueError", "boom")
    report = diag(*bs, exit_codes={0: -15, 1: -6, 2: 1})
    assert report.root.kind == "rank_crashed" and "ValueError: boom" in report.root.summary
    teardown = next(f for f in report.findings if f.kind == "teardown_abort")
    assert teardown.severity == "warning" and "results are complete" not in teardown.summary


def test_a_rank_the_launcher_stopped_while_it_waited_in_a_collective_is_shown_waiting(
        ) -> None:
    """Seen in CI under load (seed003_crash): torchrun's SIGTERM reached rank 0 in its bucket
    before gloo's error did; it was reported "outside any collective"."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
    bs[0].step().pend_last()
    bs[1].raise_("ValueError", "boom")
    report = diag(*bs, exit_codes={0: -15, 1: 1})
    root = report.root
    assert root.kind == "rank_crashed" and not root.follow_on
    assert root.ranks[0].op == "all_reduce" and root.ranks[1].op is None
    follow = [f for f in report.findings if f.kind == "rank_crashed" and f.follow_on]
    assert len(follow) == 1 and follow[0].summary.startswith(
        "Rank 0 was waiting in DDP gradient bucket 0 of iteration 3"), follow
    assert "outside any collective" not in " ".join(f.summary for f in report.findings)


def test_a_place_recorded_before_a_ranks_last_collective_is_not_where_it_ended() -> None:
    def follow_on(t: float) -> str:
        bs = ranks(2)
        for b in bs:
            b.ddp_init().train(3)
        bs[1].finish()
        bs[0].trace.activity = {"kind": "activity", "t": t, "cpu_rate": 1.0,
                                "frames": [{"file": "/job/train.py", "line": 5,
                                            "function": "<module>"}]}
        report = diag(*bs, exit_codes={0: -15, 1: -6})
        return next(f.summary for f in report.findings if f.kind == "rank_crashed")

    assert "train.py:5" not in follow_on(0.0)  # at start-up, before every collective
    assert "train.py:5 in <module>(), using 100% of a core" in follow_on(5000.0)


def test_unexplained_unfinished_rank_is_incomplete() -> None:
    bs = ranks(2)
    for b in bs:
        b.user("all_reduce")
    bs[0].finish()
    report = diag(*bs)
    assert report.verdict == "incomplete"
    assert report.ranks[1].status == "unfinished"
    assert not report.has_errors


def test_a_job_that_ended_before_any_collective_is_untested_only_when_every_rank_finished(
        ) -> None:
    done = ranks(2)
    for b in done:
        b.finish()
    assert diag(*done).verdict == "untested"  # nothing compared, nothing left unfinished
    stuck = ranks(2)  # rank 0 still in init_process_group when the job was stopped
    stuck[0].trace.init = "pending"
    stuck[1].finish()
    report = diag(*stuck)
    assert report.verdict == "incomplete" and report.ranks[0].status != "finished"


def test_a_world_of_one_rank_is_untested_not_clean() -> None:
    alone = ranks(1)
    alone[0].user("all_reduce").user("barrier").finish()
    report = diag(*alone)
    assert report.verdict == "untested" and report.findings == []
    assert any("one rank" in n and "--nproc-per-node 2" in n for n in report.notes)
    pair = ranks(2)
    for b in pair:
        b.user("all_reduce").finish()
    assert diag(*pair).verdict == "clean"
    assert not any("one rank" in n for n in diag(*pair).notes)


def test_missing_rank_makes_the_run_incomplete_with_a_note() -> None:
    bs = ranks(3)
    for b in bs[:2]:
        b.user("all_reduce").finish()
    report = diagnose(make_run(bs[0], bs[1], world_size=3))
    assert report.verdict == "incomplete"
    assert report.ranks[2].status == "missing"
    assert any("rank 2" in n and "no trace" in n for n in report.notes)


def test_group_membership_conflict_is_an_error() -> None:
    bs = ranks(3)
    bs[0].new_group("1", [0, 1])
    bs[1].new_group("1", [0, 1])
    bs[2].new_group("1", [1, 2])
    bs[2].trace.groups["1"].ranks = [1, 2]
    for b in bs:
        b.finish()
    report = diag(*bs)
    assert report.root.kind == "group_mismatch" and report.verdict == "diverged"
    assert "group 1" in report.root.summary


def test_reader_notes_are_kept() -> None:
    report = diagnose(make_run(*healthy_ddp(world=2),
                               notes=["rank 1: 2 damaged line(s) skipped"]))
    assert "rank 1: 2 damaged line(s) skipped" in report.notes


def test_crash_inside_the_diverged_collective_is_a_follow_on() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[1].forward()
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[0].fail_last()
    bs[0].raise_("RuntimeError", "[enforce fail at gloo/allreduce.cc:9] op.preamble.length <= "
                 "op.nbytes. 840 vs 128", line=63, function="evaluate", internal=True)
    bs[1].backward().pend_last()
    report = diag(*bs)
    assert report.verdict == "diverged"
    assert report.root.kind == "callsite_divergence"
    crash = next(f for f in report.findings if f.kind == "rank_crashed")
    assert crash.follow_on and crash.cause == "rank_conditional_ddp_forward"


def test_sys_exit_with_a_non_zero_code_is_a_crash() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init(buffers=False).train(2, buffers=False)
    bs[1].sys_exit(3)
    bs[0].step(buffers=False).pend_last()
    report = diag(*bs, stopped_for_hang=True)
    assert report.verdict == "crashed"
    root = report.root
    assert root.kind == "rank_crashed" and root.ranks[1].state == "failed"
    assert "Rank 1 called sys.exit(3)" in root.summary
    assert report.ranks[1].status == "failed"
    missing = next(f for f in report.findings if f.kind == "missing_collective")
    assert missing.follow_on and missing.cause == "rank_crashed"


def test_ranks_that_all_exit_alike_at_start_read_as_one_crash() -> None:
    """A usage error on 4 ranks (argparse's sys.exit(2) before init_process_group): torchrun
    saw two exit first and sent the other two SIGTERM while they were exiting (their process
    codes -15). One crash of four ranks, said in the plural, not two crashes of which one
    speaks of "its start" for two ranks."""
    bs = ranks(4)
    for b in bs:
        b.sys_exit(2)
    report = diag(*bs, exit_codes={0: 2, 1: 2, 2: -15, 3: -15})
    crashes = [f for f in report.findings if f.kind == "rank_crashed"]
    assert len(crashes) == 1, [f.summary for f in crashes]
    assert crashes[0].summary == ("Ranks 0-3 called sys.exit(2) during their starts, before any "
                                  "collective.")


def test_ranks_left_alike_are_said_in_the_plural() -> None:
    bs = ranks(4)
    for b in bs:
        b.ddp_init(buffers=False).train(3, buffers=False)
    bs[0].step(buffers=False).pend_last()
    for b in bs[1:]:
        b.finish()
    report = diag(*bs, stopped_for_hang=True)
    missing = next(f for f in report.findings if f.kind == "missing_collective")
    assert "ranks 1-3 finished their scripts after iteration 3" in missing.summary, \
        missing.summary
    assert "its script" not in missing.summary


def test_rank_stuck_before_init_process_group_is_named_with_its_stack() -> None:
    from ddpdoctor.analysis import diagnose
    from ddpdoctor.trace.model import RankTrace, Run, Site

    waiting = RankTrace(rank=0, process={"world_size": 2}, init="pending",
                        hang={"threads": [{"main": True, "frames": [
                            {"file": "/job/train.py", "line": 15, "function": "<module>"}]}]})
    late = RankTrace(rank=1, process={"world_size": 2},
                     hang={"threads": [{"main": True, "frames": [
                         {"file": "/job/train.py", "line": 14, "function": "<module>"},
                         {"file": "/job/train.py", "line": 10, "function": "load_data"}]}]})
    report = diagnose(Run(ranks={0: waiting, 1: late}, world_size=2, stopped_for_hang=True))
    root = report.root
    assert root.kind == "init_incomplete" and root.cause == "rank_never_initialised"
    assert root.ranks[0].op == "init_process_group" and root.ranks[1].op is None
    assert root.ranks[1].site == Site("/job/train.py", 10, "load_data")
    assert "never reached it" in root.summary and report.verdict == "diverged"


def test_a_round_the_script_ran_with_one_rank_does_not_decide_a_compared_job() -> None:
    """PyTorch's DDP tutorial under --cpu: its model-parallel round has world size
    n_gpus // 2 = 1. The rounds of two ranks decide (clean here); the lone round is said."""
    from ddpdoctor.analysis import diagnose_rounds

    two = make_run(*healthy_ddp(2))
    one = make_run(*healthy_ddp(1))
    report = diagnose_rounds([two, one])
    assert report.verdict == "clean", report.notes
    assert any("round 2 ran one rank, as the script asked" in n for n in report.notes)
    # A lone round alone is still untested, and a divergence elsewhere still shows.
    assert diagnose_rounds([one, one]).verdict == "untested"
    bad = ranks(2)
    bad[0].ddp_init().train(2).finish()
    bad[1].ddp_init().train(3).finish()
    assert diagnose_rounds([make_run(*bad), one]).verdict != "clean"


def test_the_findings_a_stuck_rank_explains_are_its_follow_ons_with_its_cause() -> None:
    """Issue 54: rank 1 stays in its own code (stuck); rank 0 waits in iteration 4's bucket.
    The missing collective rank 1 never issued is the stuck rank's consequence: a follow-on,
    with the root's cause, never a second story (uneven_inputs) of its own."""
    from ddpdoctor.trace.schema import Stop

    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].step().pend_last()
    bs[1].trace.init = "completed"
    bs[1].trace.hang = {"kind": "hang", "t": 2000.0, "pending": [], "threads": [
        {"thread": "MainThread", "main": True,
         "frames": [{"file": "/job/train.py", "line": 17, "function": "main"}]}]}
    run = make_run(*bs, stopped_for_hang=True)
    run.stop = Stop.STUCK
    report = diagnose(run)
    assert [f.kind for f in report.findings][:2] == ["rank_stuck", "missing_collective"]
    root, second = report.findings[:2]
    assert (second.follow_on, second.explained_by, second.cause) == (
        True, "rank_stuck", root.cause), (second.cause, root.cause)
