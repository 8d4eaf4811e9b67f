"""Alignment by sequence number: first divergence per group, classes of identical ranks,
legitimate differences (join shadows, default reduce op, uneven all_to_all), point-to-point."""

from __future__ import annotations

import pytest

from ddpdoctor.analysis import align as align_mod
from ddpdoctor.analysis import signature
from ddpdoctor.analysis.align import _next_diff, align

from .factories import TraceBuilder, healthy_ddp, make_run, ranks


def _only(alignment, group="0"):
    return alignment.groups[group]


def test_identical_ranks_form_one_class_and_never_compare_fields(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(align_mod, "hard_difference",
                        lambda a, b: calls.append((a, b)) or None)
    a = align(make_run(*healthy_ddp(world=4, iterations=5)))
    g = _only(a)
    assert g.classes == [[0, 1, 2, 3]]
    assert g.first_error is None and g.first_warning is None
    assert calls == []
    assert a.divergences() == []


def test_healthy_ddp_with_rebuild_and_unused_map_has_no_divergence() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init(find_unused_parameters=True).train(4, buckets=(16, 28), unused=8).finish()
    labels = [c.label for c in bs[0].trace.collectives]
    assert labels.count("ddp.rebuild_buckets") == 2 and labels.count("ddp.unused_params") == 4
    assert align(make_run(*bs)).divergences() == []


def _two_with_extra(op0: dict, op1: dict, before: int = 3):
    bs = ranks(2)
    for b in bs:
        for _ in range(before):
            b.user("all_reduce", shapes=[[4]], line=10)
    bs[0].coll(**op0)
    bs[1].coll(**op1)
    for b in bs:  # the cascade after the divergence
        b.user("barrier", line=50)
        b.user("all_reduce", shapes=[[9]], line=51)
    return make_run(*bs)


@pytest.mark.parametrize("op0, op1, kind", [
    ({"op": "barrier", "line": 30}, {"op": "all_reduce", "line": 30}, "op_mismatch"),
    ({"op": "all_reduce", "shapes": [[4]]}, {"op": "all_reduce", "shapes": [[5]]},
     "shape_mismatch"),
    ({"op": "all_reduce", "shapes": [[2, 3]]}, {"op": "all_reduce", "shapes": [[3, 2]]},
     "shape_mismatch"),
    ({"op": "all_reduce", "dtypes": ["float32"]}, {"op": "all_reduce", "dtypes": ["int64"]},
     "dtype_mismatch"),
    ({"op": "all_reduce", "reduce_op": "SUM"}, {"op": "all_reduce", "reduce_op": "MAX"},
     "reduce_op_mismatch"),
    ({"op": "broadcast", "root": 0}, {"op": "broadcast", "root": 1}, "root_mismatch"),
])
def test_first_mismatch_is_named_with_its_context(op0, op1, kind) -> None:
    g = _only(align(_two_with_extra(op0, op1)))
    d = g.first_error
    assert d is not None and d.kind == kind
    assert d.seq == 4
    assert sorted(d.at) == [0, 1] and d.at[0].op == op0["op"] and d.at[1].op == op1["op"]
    assert sorted(d.context) == [0, 1] and d.context[0].seq == 3
    assert g.first_warning is None


def test_only_the_first_divergence_is_reported_not_the_cascade() -> None:
    bs = ranks(2)
    bs[0].user("barrier").user("all_reduce", shapes=[[3]]).user("broadcast", root=0)
    bs[1].user("all_reduce").user("broadcast", root=0).user("barrier")
    a = align(make_run(*bs))
    assert [(d.kind, d.seq) for d in a.divergences()] == [("op_mismatch", 1)]


def test_missing_collective_when_one_rank_issued_more() -> None:
    bs = ranks(2)
    bs[0].ddp_init().train(5).finish()
    bs[1].ddp_init().train(5).step()
    bs[1].fail_last()
    d = _only(align(make_run(*bs))).first_error
    assert d.kind == "missing_collective"
    assert d.issued == [1] and d.absent == [0]
    assert d.at[1].label == "ddp.buffers" and d.at[1].iteration == 6
    assert d.seq == len(bs[0].trace.collectives) + 1


def test_callsite_divergence_is_kept_when_it_precedes_the_first_error() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].forward(line=63, function="evaluate", grad=False)  # rank 0 alone evaluates
    bs[1].forward()
    bs[0].forward(line=63, function="evaluate", grad=False)
    bs[1].backward()
    g = _only(align(make_run(*bs)))
    w, e = g.first_warning, g.first_error
    assert w.kind == "callsite_divergence" and w.field == "callsite"
    assert w.at[0].site.function == "evaluate" and w.at[1].site.function == "main"
    assert e.kind == "op_mismatch" and e.seq > w.seq
    assert e.at[0].op == "broadcast" and e.at[1].op == "all_reduce"


def test_callsite_divergence_after_the_first_error_is_not_reported() -> None:
    bs = ranks(2)
    bs[0].user("barrier", line=1).user("all_reduce", line=2)
    bs[1].user("all_reduce", line=1).user("all_reduce", line=3)
    g = _only(align(make_run(*bs)))
    assert g.first_error.seq == 1 and g.first_warning is None


def test_label_divergence_counts_as_callsite() -> None:
    bs = ranks(2)
    bs[0].coll("all_reduce", "ddp.bucket", shapes=[[244]], line=21)
    bs[1].coll("all_reduce", "user", shapes=[[244]], reduce_op="SUM", line=21)
    g = _only(align(make_run(*bs)))
    assert g.first_warning.field == "label" and g.first_error is None


def test_join_with_uneven_inputs_buffers_and_unused_params_is_aligned() -> None:
    bs = ranks(2)
    bs[0].ddp_init(find_unused_parameters=True)
    bs[1].ddp_init(find_unused_parameters=True)
    for _ in range(3):
        for b in bs:
            b.step((16, 28), join=True, authority=1, unused=8)
    bs[1].step((16, 28), join=True, authority=1, unused=8)  # rank 1 has one more batch
    bs[0].join_shadow((16, 28), unused=8, authority=1)
    for b in bs:
        b.join_end(last_joiner=1).finish()
    a = align(make_run(*bs))
    assert a.divergences() == []
    shadow = [c for c in bs[0].trace.collectives if c.label == "join.unused_params"]
    assert shadow and shadow[0].reduce_op is None  # c10d default: compared as SUM
    assert a.join_sites[0] == {("train.py", 18, "main")}


def test_reduce_op_none_means_sum_for_reducing_ops() -> None:
    bs = ranks(2)
    bs[0].coll("all_reduce", "user", shapes=[[3]], reduce_op=None, api="all_reduce")
    bs[0].trace.collectives[-1].reduce_op = None
    bs[1].coll("all_reduce", "user", shapes=[[3]], reduce_op="SUM")
    assert align(make_run(*bs)).divergences() == []


def test_all_to_all_single_may_have_uneven_sizes() -> None:
    bs = ranks(2)
    bs[0].user("all_to_all_single", shapes=[[3]])
    bs[1].user("all_to_all_single", shapes=[[5]])
    assert align(make_run(*bs)).divergences() == []


def test_one_deviating_rank_among_many_is_found_with_the_majority_as_reference() -> None:
    bs = ranks(8)
    for b in bs:
        b.ddp_init().train(4)
    bs[5].user("barrier", line=77)
    for b in bs:
        b.step().finish()
    g = _only(align(make_run(*bs)))
    assert g.classes[0] == [0, 1, 2, 3, 4, 6, 7] and g.classes[1] == [5]
    d = g.first_error
    assert d.kind == "op_mismatch"
    assert d.at[5].op == "barrier" and all(d.at[r].label == "ddp.buffers" for r in (0, 7))


def test_groups_are_aligned_separately_with_their_own_members() -> None:
    bs = ranks(4)
    for b in bs:
        b.new_group("1", [0, 1]).new_group("2", [2, 3])
        b.user("all_reduce", shapes=[[2]])
    for r in (0, 1):
        bs[r].user("all_reduce", group="1", shapes=[[7]])
    bs[2].user("all_reduce", group="2", shapes=[[7]])
    bs[3].user("all_reduce", group="2", shapes=[[8]])
    a = align(make_run(*bs))
    assert a.groups["1"].members == [0, 1] and a.groups["2"].members == [2, 3]
    assert a.groups["0"].members == [0, 1, 2, 3]
    assert a.groups["1"].first_error is None
    d = a.groups["2"].first_error
    assert d.kind == "shape_mismatch" and sorted(d.at) == [2, 3]


def test_conflicting_group_membership_is_recorded() -> None:
    bs = ranks(3)
    bs[0].new_group("1", [0, 1])
    bs[1].new_group("1", [0, 1])
    bs[2].trace.groups["1"] = bs[2].trace.groups["0"].__class__("1", "", [1, 2])
    g = align(make_run(*bs)).groups["1"]
    assert g.members == [0, 1]
    assert g.membership == {0: [0, 1], 1: [0, 1], 2: [1, 2]}


def test_gaps_from_damaged_lines_are_not_divergences() -> None:
    bs = ranks(2)
    for b in bs:
        b.user("all_reduce").user("barrier").user("all_reduce", shapes=[[3]])
    del bs[1].trace.collectives[1]  # a damaged line lost seq 2 on rank 1
    assert align(make_run(*bs)).divergences() == []


def test_point_to_point_pairs_sends_with_receives_in_order() -> None:
    bs = ranks(2)
    bs[0].user("send", peer=1, shapes=[[3]]).user("send", peer=1, shapes=[[4]])
    bs[1].user("recv", peer=0, shapes=[[3]]).user("recv", peer=0, shapes=[[4]])
    a = align(make_run(*bs))
    assert a.divergences() == []
    assert [len(x) for x in a.pairs[("0", 0, 1)]] == [2, 2]


def test_point_to_point_shape_mismatch_and_orphan_send() -> None:
    bs = ranks(2)
    bs[0].user("send", peer=1, shapes=[[3]])
    bs[1].user("recv", peer=0, shapes=[[4]])
    d = align(make_run(*bs)).p2p[0]
    assert d.kind == "shape_mismatch" and d.p2p and sorted(d.at) == [0, 1]

    bs = ranks(2)
    bs[0].user("send", peer=1, shapes=[[3]]).pend_last()
    d = align(make_run(*bs)).p2p[0]
    assert d.kind == "missing_collective" and d.issued == [0] and d.absent == [1]


def test_next_diff_finds_the_first_difference_across_chunks() -> None:
    a = list(range(2000))
    b = list(a)
    b[1500] = -5
    assert _next_diff(a, b, 0, 2000) == 1500
    assert _next_diff(a, b, 1501, 2000) == 2000
    assert _next_diff(a, a, 0, 2000) == 2000


def test_sites_compare_by_file_name_so_per_node_paths_do_not_differ() -> None:
    b0 = TraceBuilder(0, 2, file="/home/alice/job/train.py")
    b1 = TraceBuilder(1, 2, file="/scratch/node7/job/train.py")
    for b in (b0, b1):
        b.user("all_reduce", line=5)
    assert align(make_run(b0, b1)).divergences() == []
    assert signature.site_key(b0.trace.collectives[0].site) == ("train.py", 5, "main")


def test_alignment_work_is_linear_in_the_collectives(monkeypatch) -> None:
    """32 ranks, one deviating near the end: at most one key built per collective (none for
    a collective a rank's fast reader shares), fields compared only where ids differ, so
    the work grows with the trace, not with its square. The time itself is measured by
    ``bench/real_traces.py``, not here."""
    counts: list[tuple[int, int, int]] = []
    for steps in (500, 1000):
        work = {"keys": 0, "compares": 0}

        def key(c, site, _real=align_mod.full_key, _w=work):
            _w["keys"] += 1
            return _real(c, site)

        def compare(a, b, _real=align_mod.hard_difference, _w=work):
            _w["compares"] += 1
            return _real(a, b)

        monkeypatch.setattr(align_mod, "full_key", key)
        monkeypatch.setattr(align_mod, "hard_difference", compare)
        bs = ranks(32)
        for b in bs:
            b.ddp_init().train(steps, buckets=(244,))
        bs[17].trace.collectives[-5].shapes = [[999]]
        g = _only(align(make_run(*bs)))
        monkeypatch.undo()
        assert g.first_error is not None and g.first_error.at[17].shapes == [[999]]
        assert len(g.classes) == 2
        counts.append((work["keys"], work["compares"], sum(len(b.trace.collectives) for b in bs)))
    for keys, compares, collectives in counts:
        assert keys <= collectives and compares <= 2
    assert counts[1][0] - counts[0][0] <= counts[1][2] - counts[0][2]
