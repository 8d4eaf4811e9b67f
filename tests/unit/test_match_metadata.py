"""What decides a match beyond the tensors: split sizes, tags, and the backend's own words.

The recording group's amounts per peer (real torch tensors, no process group), the pairwise
split check and the tag pairing on hand-built traces, the quoting of a rank's stderr tail,
and the placing of a rank killed before its completions were written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ddpdoctor.analysis.backend_words import CONSEQUENCE, evidence, explaining_lines
from ddpdoctor.analysis.diagnosis import diagnose
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.splits import Disagreement, disagreements
from ddpdoctor.runtime import pg_wrapper
from ddpdoctor.trace import ops
from ddpdoctor.trace.reader import load_run

from .factories import TraceBuilder, make_run

GLOO_ABORT = """\
[rank1]: some user output
terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456] \
op.preamble.length <= op.nbytes. 48 vs 32. Received data size doesn't match expected size. Is \
there a distributed collective mismatch in your code?
"""
PEER_LOST = ("[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:537] Read error "
             "[127.0.0.1]:51120: Connection reset by peer. This is typically caused by a remote "
             "worker hanging\n")
NCCL = """\
node1:4242:4300 [1] NCCL INFO Channel 00/02 : 0 1
node1:4242:4300 [1] NCCL WARN Cuda failure 'out of memory'
[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600024 \
milliseconds before timing out.
"""


# -- the recording group's amounts ------------------------------------------------------------
def test_every_op_with_split_sizes_has_a_describer() -> None:
    assert set(pg_wrapper._META) == ops.SPLITS


def test_all_to_all_single_amounts_in_elements_with_the_row_size() -> None:
    out, inp = torch.empty(5, 4), torch.empty(4, 4)
    meta = dict(pg_wrapper._all_to_all_single_meta((out, inp, [2, 3], [1, 3], None), 2, None))
    assert meta == {"sends": (4, 12), "recvs": (8, 12), "row": 4}
    # No split sizes: dim 0 split evenly.
    even = dict(pg_wrapper._all_to_all_single_meta((torch.empty(6), torch.empty(6), [], [], None),
                                                   3, None))
    assert even == {"sends": (2, 2, 2), "recvs": (2, 2, 2), "row": 1}


def test_list_and_rooted_amounts() -> None:
    a2a = dict(pg_wrapper._all_to_all_meta(([torch.empty(2), torch.empty(3)],
                                            [torch.empty(4), torch.empty(1)], None), 2, None))
    assert a2a == {"sends": (4, 1), "recvs": (2, 3)}
    root_gather = dict(pg_wrapper._gather_meta(([[torch.empty(3), torch.empty(5)]],
                                                [torch.empty(3)], None), 2, 0))
    assert root_gather == {"sends": (3, 0), "recvs": (3, 5)}
    other_gather = dict(pg_wrapper._gather_meta(([], [torch.empty(4)], None), 2, 0))
    assert other_gather == {"sends": (4, 0)}
    root_scatter = dict(pg_wrapper._scatter_meta(([torch.empty(2)],
                                                  [[torch.empty(2), torch.empty(2)]], None), 2, 0))
    assert root_scatter == {"sends": (2, 2), "recvs": (2, 0)}
    assert pg_wrapper._tag_meta(0) == () and pg_wrapper._tag_meta(3) == (("tag", 3),)


# -- the split check --------------------------------------------------------------------------
def _a2a(b: TraceBuilder, sends: tuple[int, ...], recvs: tuple[int, ...], row: int | None = 4,
         **kw) -> None:
    c = b.coll("all_to_all_single", shapes=[[sum(sends) // (row or 1), row or 1]], line=50, **kw)
    c.sends, c.recvs, c.row = sends, recvs, row


def test_disagreements_name_sender_receiver_and_both_amounts() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    _a2a(a, (8, 12), (8, 8))
    _a2a(b, (8, 8), (8, 8))
    found = disagreements({0: a.trace.collectives[0], 1: b.trace.collectives[0]}, [0, 1])
    assert found == [Disagreement(0, 1, 12, 8, 4)]
    assert found[0].text() == "rank 0 sends 3 rows to rank 1, which expects 2"
    assert Disagreement(1, 0, 10, 6).text() == "rank 1 sends 10 elements to rank 0, which expects 6"


@pytest.mark.parametrize("world", [2, 4])
def test_split_mismatch_is_the_root_cause_before_the_crash_it_causes(world: int) -> None:
    builders = [TraceBuilder(r, world) for r in range(world)]
    for b in builders:
        b.user("all_reduce")
        _a2a(b, (4,) * world, (4,) * world)  # a healthy dispatch first
    for b in builders:  # rank 1 routed one more row to rank 0 than rank 0 expects
        sends = tuple(8 if (b.rank == 1 and j == 0) else 4 for j in range(world))
        _a2a(b, sends, (4,) * world, state="pending")
    builders[-1].pend_last()
    run = make_run(*builders)
    run.exit_codes = {world - 1: -6}
    report = diagnose(run)
    root = report.findings[0]
    assert (root.kind, root.cause, root.seq) == (fk.SPLIT_MISMATCH, "rank_dependent_split_sizes",
                                                 3)
    assert "rank 1 sends 2 rows to rank 0, which expects 1" in root.summary
    assert root.ranks[1].note.startswith("sends [") and "rows" in root.ranks[1].note
    assert all(f.follow_on for f in report.findings[1:] if f.kind == fk.RANK_CRASHED)


def test_uneven_but_agreeing_splits_are_healthy() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    _a2a(a, (4, 12), (4, 8))  # rank 0 keeps 1 row, sends 3; receives 2 from rank 1
    _a2a(b, (8, 4), (12, 4))
    report = diagnose(make_run(a.finish(), b.finish()))
    assert not [f for f in report.findings if f.is_error]


def test_the_root_s_gather_list_is_checked_against_each_sender() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    g0 = a.coll("gather", root=0, shapes=[[3]])
    g0.sends, g0.recvs = (3, 0), (3, 4)  # the root allocated 4 elements for rank 1
    g1 = b.coll("gather", root=0, shapes=[[3]])
    g1.sends = (3, 0)
    report = diagnose(make_run(a.finish(), b.finish()))
    root = report.findings[0]
    assert root.kind == fk.SPLIT_MISMATCH
    assert "rank 1 sends 3 elements to rank 0, which expects 4" in root.summary


# -- tags -------------------------------------------------------------------------------------
def _p2p(b: TraceBuilder, op: str, peer: int, tag: int, state: str = "completed") -> None:
    c = b.coll(op, peer=peer, shapes=[[2, 16]], line=43 if op == "send" else 47, state=state)
    c.tag = tag or None


def test_a_receive_waiting_for_another_tag_is_a_tag_mismatch() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    _p2p(a, "send", 1, 0, "pending")
    _p2p(b, "recv", 0, 1, "pending")
    root = diagnose(make_run(a, b)).findings[0]
    assert (root.kind, root.cause) == (fk.TAG_MISMATCH, "p2p_tag_mismatch")
    assert "rank 1 waits to receive from rank 0 with tag 1" in root.summary
    assert "with tag 0" in root.summary


def test_tags_pair_out_of_order_as_the_backends_pair_them() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    _p2p(a, "send", 1, 1)
    _p2p(a, "send", 1, 2)
    _p2p(b, "recv", 0, 2)
    _p2p(b, "recv", 0, 1)
    report = diagnose(make_run(a.finish(), b.finish()))
    assert not [f for f in report.findings if f.is_error]


def test_an_unmatched_send_with_no_receive_is_still_missing() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    _p2p(a, "send", 1, 5, "pending")
    b.user("barrier", shapes=[])
    a.user("barrier", shapes=[])
    kinds = {f.kind for f in diagnose(make_run(a, b.finish())).findings}
    assert fk.TAG_MISMATCH not in kinds and fk.MISSING_COLLECTIVE in kinds


# -- the backend's own words ------------------------------------------------------------------
def test_gloo_abort_is_quoted_without_its_path() -> None:
    assert explaining_lines(GLOO_ABORT) == [(0, (
        "gloo pair.cc:456: op.preamble.length <= op.nbytes. 48 vs 32. Received data size "
        "doesn't match expected size. Is there a distributed collective mismatch in your "
        "code?"))]


def test_nccl_lines_and_lost_peers() -> None:
    lines = [text for _, text in explaining_lines(NCCL)]
    assert lines[0] == "NCCL WARN Cuda failure 'out of memory'"
    assert any("Watchdog caught collective operation timeout" in t for t in lines)
    assert "NCCL INFO" not in " ".join(lines)
    lost = explaining_lines(PEER_LOST)
    assert [kind for kind, _ in lost] == [CONSEQUENCE]
    # A lost peer is quoted only for a rank killed by a signal (no exception of its own says
    # it), and only where no rank has words of a cause.
    assert evidence({0: lost}, {0}) == [f'rank 0\'s stderr: "{lost[0][1]}"']
    assert evidence({0: lost}) == []
    both = evidence({0: lost, 1: explaining_lines(GLOO_ABORT)}, {0, 1})
    assert len(both) == 1 and both[0].startswith("rank 1's stderr: \"gloo pair.cc:456")


def test_the_backend_s_argument_checks_are_quoted() -> None:
    text = ("[rank1]: RuntimeError: ProcessGroupGloo::alltoall: invalid tensor size at index 1 "
            "(expected (6), got (4))\n")
    assert explaining_lines(text) == [
        (1, "ProcessGroupGloo::alltoall: invalid tensor size at index 1 (expected (6), got (4))")]


def test_the_script_s_argument_parser_is_quoted() -> None:
    text = ("usage: train.py [-h] --epochs EPOCHS\n"
            "train.py: error: the following arguments are required: --epochs\n")
    assert [t for _, t in explaining_lines(text)] == [
        "train.py: error: the following arguments are required: --epochs"]
    module = "[rank0]: python -m pkg.train: error: argument --lr: invalid float value: 'x'\n"
    assert [t for _, t in explaining_lines(module)] == [
        "python -m pkg.train: error: argument --lr: invalid float value: 'x'"]


def test_nothing_to_quote_in_ordinary_output() -> None:
    assert explaining_lines("epoch 1 loss 0.3\nWarning: something deprecated\n"
                            "epoch 1: error: 0.3\nRuntimeError: error: x\n") == []


def test_the_reader_takes_each_rank_s_tail_and_the_report_quotes_it(tmp_path: Path) -> None:
    from .writer_jobs import writer_job

    folder = writer_job(tmp_path / "logs", None, world=2, iterations=3, eval_rank=None)
    (folder / "stderr-101.txt").write_text("x" * 100_000 + "\n" + GLOO_ABORT)
    run = load_run([folder])
    assert run.ranks[1].stderr_tail.endswith(GLOO_ABORT)
    assert len(run.ranks[1].stderr_tail) <= 64 * 1024 and run.ranks[0].stderr_tail == ""


# -- a rank killed before its completions were written ----------------------------------------
def test_a_killed_rank_is_placed_at_its_last_collective_not_its_first() -> None:
    a, b = TraceBuilder(0), TraceBuilder(1)
    for _ in range(3):
        a.user("all_reduce", line=5)
        b.user("all_reduce", line=5, state="pending")  # no done record: all pending
    _a2a(a, (8, 12), (8, 8))
    _a2a(b, (8, 8), (8, 8), state="pending")
    run = make_run(a.finish(), b)
    run.exit_codes = {1: -6}
    from ddpdoctor.analysis.ranks import rank_states

    state = rank_states(run)[1]
    assert [c.seq for c in state.pending] == [4]
    assert state.crash_site is not None and state.crash_site.line == 50
