"""The attach diagnosis as a pure function of hand-built snapshots: each cause only where the
stacks show its premises, and no verdict over a rank that could not be seen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.analysis.attach import diagnose_snapshots
from ddpdoctor.analysis.stacks import Where, view
from ddpdoctor.trace import schema
from ddpdoctor.trace.snapshot import (
    Frame,
    RankSnapshot,
    Sample,
    Snapshot,
    SnapshotError,
    Thread,
    read,
    write,
)

C10D = "/site-packages/torch/distributed/distributed_c10d.py"
DDP = "/site-packages/torch/nn/parallel/distributed.py"
GRAPH = "/site-packages/torch/autograd/graph.py"
THREADING = "/usr/lib/python3.11/threading.py"
TRAIN = "/job/train.py"


def user(line: int, function: str = "main", text: str = "", blocks: tuple = (),
         **local: str) -> Frame:
    return Frame(function=function, file=TRAIN, line=line, text=text, indent=8,
                 blocks=[list(b) for b in blocks], locals=dict(local))


def api(op: str, **local: str) -> Frame:
    return Frame(function=op, file=C10D, line=4000, locals=dict(local))


def rank(number: int, *frames: Frame, cpu: tuple[float, float] = (1.0, 1.0),
         moved: bool = False, error: str = "", stderr: str = "",
         pid: int | None = 100) -> RankSnapshot:
    """A rank read twice, one second apart (its main thread in ``frames``, innermost first)."""
    if pid is None:
        return RankSnapshot(rank=number, pid=None, note="no process: it has exited")
    samples = []
    for i, used in enumerate(cpu):
        stack = list(frames)
        if moved and i:
            stack = [Frame(function="step", file=TRAIN, line=99)]
        threads = [] if error else [Thread("MainThread", pid + number, True, stack)]
        samples.append(Sample(t=float(i), cpu=used, io=0, threads=threads, error=error))
    return RankSnapshot(rank=number, pid=pid + number, samples=samples, stderr_tail=stderr)


def diagnose(*ranks: RankSnapshot, world: int | None = None) -> dict:
    snap = Snapshot(host="node0", t=0.0, kind="torchrun",
                    world_size=world or len(ranks), ranks=list(ranks))
    report = diagnose_snapshots([snap])
    return {"verdict": report.verdict, "findings": report.findings, "notes": report.notes}


IF_RANK = ((60, "if rank == 0:"), (40, "for epoch in range(EPOCHS):"))


def test_a_barrier_under_a_rank_test_against_a_backward_is_rank_conditional() -> None:
    out = diagnose(
        rank(0, api("barrier"), user(61, text="dist.barrier()", blocks=IF_RANK)),
        rank(1, Frame("_engine_run_backward", GRAPH, 979), user(53, text="loss.backward()")))
    root = out["findings"][0]
    assert out["verdict"] == "diverged"
    assert (root.kind, root.cause) == ("op_mismatch", "rank_conditional_collective")
    assert root.ranks[1].label == "ddp.bucket" and root.ranks[0].site.line == 61


def test_the_same_mismatch_without_a_rank_test_names_no_cause() -> None:
    """Contradicting facts: nothing around the line tests the rank, and both lines are in one
    loop: neither rank_conditional_collective nor uneven_inputs holds."""
    loop = ((40, "for step in range(STEPS):"),)
    out = diagnose(rank(0, api("barrier"), user(61, text="dist.barrier()", blocks=loop)),
                   rank(1, Frame("_engine_run_backward", GRAPH, 979),
                        user(53, text="loss.backward()", blocks=loop)))
    root = out["findings"][0]
    assert root.kind == "op_mismatch" and root.cause is None


def test_a_barrier_after_the_loop_against_a_backward_in_it_is_uneven_inputs() -> None:
    loop = ((40, "for x in loader:"), (30, "def worker(rank):"))
    out = diagnose(rank(0, api("barrier"),
                        user(47, "worker", "dist.barrier()", ((30, "def worker(rank):"),))),
                   rank(1, Frame("_engine_run_backward", GRAPH, 979),
                        user(46, "worker", "loss.backward()", loop)))
    assert out["findings"][0].cause == "uneven_inputs"


def test_every_rank_in_the_same_call_is_no_verdict_but_says_what_stacks_cannot_tell() -> None:
    out = diagnose(rank(0, api("all_reduce"), user(50, text="dist.all_reduce(t)")),
                   rank(1, api("all_reduce"), user(50, text="dist.all_reduce(t)")))
    assert out["verdict"] == "incomplete" and not out["findings"]
    assert any("ddpdoctor run" in n for n in out["notes"])


def test_a_rank_whose_stack_was_not_read_is_never_blamed_and_no_verdict_is_given() -> None:
    out = diagnose(rank(0, api("barrier"), user(61, blocks=IF_RANK)),
                   rank(1, error="Permission denied (os error 13)"))
    assert out["verdict"] == "incomplete" and not out["findings"]
    assert any("rank 1: no stack" in n and "CAP_SYS_PTRACE" in n for n in out["notes"])


def test_ranks_of_another_node_not_read_give_no_verdict() -> None:
    out = diagnose(rank(0, api("barrier"), user(61, blocks=IF_RANK)),
                   rank(1, api("all_reduce"), user(70)), world=4)
    assert out["verdict"] == "incomplete" and not out["findings"]
    assert any("ranks 2, 3" in n and "ddpdoctor diff" in n for n in out["notes"])


def test_two_nodes_snapshots_are_read_as_one_job() -> None:
    node0 = Snapshot("n0", 0.0, "torchrun", 4, [
        rank(0, api("all_reduce"), user(50)), rank(1, api("all_reduce"), user(50))])
    node1 = Snapshot("n1", 0.0, "torchrun", 4, [
        rank(2, api("barrier"), user(61, blocks=IF_RANK), pid=200),
        rank(3, api("barrier"), user(61, blocks=IF_RANK), pid=200)])
    report = diagnose_snapshots([node0, node1])
    assert report.verdict == "diverged"
    assert report.root is not None and sorted(report.root.ranks) == [0, 1, 2, 3]


def test_a_rank_that_raised_while_its_peer_waits_is_the_crash_with_its_line() -> None:
    tb = ('[rank1]: Traceback (most recent call last):\n'
          '[rank1]:   File "/job/train.py", line 27, in <module>\n'
          '[rank1]:     raise ValueError("bad batch")\n'
          '[rank1]: ValueError: bad batch\n')
    out = diagnose(rank(0, Frame("_engine_run_backward", GRAPH, 979), user(28)),
                   rank(1, Frame("_shutdown", THREADING, 1590), stderr=tb))
    root = out["findings"][0]
    assert (root.kind, root.cause, out["verdict"]) == ("rank_crashed", "rank_crashed", "crashed")
    assert root.ranks[1].site.line == 27 and "ValueError: bad batch" in root.summary


def test_an_ended_rank_without_an_error_is_not_called_a_crash() -> None:
    """Contradicting facts for rank_crashed: nothing the rank left shows an exception; and for
    uneven_inputs: the rank left behind waits in a barrier of its own, not in DDP's step."""
    out = diagnose(rank(0, api("barrier"), user(61)),
                   rank(1, Frame("_shutdown", THREADING, 1590)))
    root = out["findings"][0]
    assert root.kind == "rank_exited_early" and root.cause is None


def test_a_rank_that_ended_while_another_is_still_in_ddps_step_is_uneven_inputs() -> None:
    out = diagnose(rank(0, Frame("_shutdown", THREADING, 1590)),
                   rank(1, Frame("_engine_run_backward", GRAPH, 979), user(53)))
    root = out["findings"][0]
    assert (root.kind, root.cause) == ("rank_exited_early", "uneven_inputs")
    assert "more batches" in root.evidence[0]


def test_a_rank_that_ended_on_a_transport_error_is_a_consequence_not_the_root() -> None:
    tb = ('Traceback (most recent call last):\n'
          '  File "/job/train.py", line 28, in <module>\n'
          '    loss.backward()\n'
          'RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection '
          'closed by peer [127.0.0.1]:4000\n')
    out = diagnose(rank(0, api("barrier"), user(61)),
                   rank(1, Frame("_shutdown", THREADING, 1590), stderr=tb))
    assert not out["findings"] and out["verdict"] == "incomplete"
    assert any("transport error" in n for n in out["notes"])


def test_another_ranks_traceback_in_a_shared_stderr_is_not_this_ranks() -> None:
    tb = ('[rank0]: Traceback (most recent call last):\n'
          '[rank0]:   File "/job/train.py", line 27, in <module>\n'
          '[rank0]: ValueError: bad batch\n')
    out = diagnose(rank(0, api("barrier"), user(61)),
                   rank(1, Frame("_shutdown", THREADING, 1590), stderr=tb))
    assert out["findings"][0].kind == "rank_exited_early"


def test_a_blocked_rank_is_stuck_and_a_busy_one_is_only_named_in_a_note() -> None:
    lock = Frame("acquire", THREADING, 300)
    blocked = diagnose(rank(0, lock, user(14)), rank(1, api("barrier"), user(16)))
    assert (blocked["findings"][0].kind, blocked["findings"][0].cause) == \
        ("rank_stuck", "rank_stuck_in_user_code")
    busy = diagnose(rank(0, user(14), cpu=(1.0, 2.0), moved=True),
                    rank(1, api("barrier"), user(16)))
    assert not busy["findings"] and busy["verdict"] == "incomplete"
    assert any("rank 0 is busy" in n and "attach again" in n for n in busy["notes"])


def test_a_rank_not_yet_in_init_while_the_others_wait_in_the_rendezvous() -> None:
    init = Frame("init_process_group", "/site-packages/torch/distributed/distributed_c10d.py",
                 1700)
    out = diagnose(rank(0, init, user(8)), rank(1, Frame("get", THREADING, 300), user(5)))
    root = out["findings"][0]
    assert (root.kind, root.cause) == ("rank_stuck", "rank_never_initialised")
    assert root.ranks[1].site.line == 5


def test_every_rank_outside_collectives_is_running_and_a_still_one_is_noted() -> None:
    out = diagnose(rank(0, user(14), cpu=(1.0, 2.0), moved=True),
                   rank(1, user(14), cpu=(1.0, 2.0), moved=True))
    assert out["verdict"] == "running" and not out["findings"] and not out["notes"]
    sleeping = diagnose(rank(0, user(14), cpu=(1.0, 2.0), moved=True),
                        rank(1, user(14, "main", "time.sleep(1)")))
    assert sleeping["verdict"] == "running" and not sleeping["findings"]
    assert any("rank 1 sat at one place" in n for n in sleeping["notes"])


def test_point_to_point_tags_and_cycles() -> None:
    tags = diagnose(rank(0, api("send", dst="1", tag="3"), user(20)),
                    rank(1, api("recv", src="0", tag="1"), user(24)))
    assert (tags["findings"][0].kind, tags["findings"][0].cause) == \
        ("tag_mismatch", "p2p_tag_mismatch")
    cycle = diagnose(rank(0, api("recv", src="1"), user(12)),
                     rank(1, api("recv", src="0"), user(12)))
    assert (cycle["findings"][0].kind, cycle["findings"][0].cause) == \
        ("wait_cycle", "p2p_peer_mismatch")


def test_broadcast_roots_that_differ_are_a_root_mismatch() -> None:
    out = diagnose(rank(0, api("broadcast", src="0"), user(30)),
                   rank(1, api("broadcast", src="1"), user(30)))
    assert (out["findings"][0].kind, out["findings"][0].cause) == \
        ("root_mismatch", "broadcast_root_mismatch")


def test_group_order_inversion_needs_two_named_groups() -> None:
    two = diagnose(rank(0, api("all_reduce"), user(25, text="dist.all_reduce(g, group=ga)")),
                   rank(1, api("all_reduce"), user(28, text="dist.all_reduce(m, group=gb)")))
    assert two["findings"][0].cause == "group_order_inversion"
    # Contradicting facts: both lines pass the same group (or none): not an inversion.
    one = diagnose(rank(0, api("all_reduce"), user(25, text="dist.all_reduce(g, group=ga)")),
                   rank(1, api("all_reduce"), user(28, text="dist.all_reduce(m, group=ga)")))
    assert one["findings"][0].kind == "callsite_divergence"
    assert one["findings"][0].cause != "group_order_inversion"


def test_a_ddp_forward_from_a_function_only_one_rank_is_in() -> None:
    out = diagnose(
        rank(0, Frame("_sync_buffers", DDP, 2405), Frame("forward", DDP, 1800),
             user(40, "evaluate", "out = model(x)"), user(70, "main", "evaluate(model)")),
        rank(1, Frame("_engine_run_backward", GRAPH, 979), user(60, "main", "loss.backward()")))
    assert out["findings"][0].cause == "rank_conditional_ddp_forward"


def test_classification_uses_cpu_and_movement() -> None:
    assert view(rank(0, api("barrier"), user(5))).where is Where.WAITING
    assert view(rank(0, api("barrier"), user(5), cpu=(1.0, 2.0))).where is Where.BUSY
    assert view(rank(0, user(5), moved=True)).where is Where.BUSY
    assert view(rank(0, pid=None)).where is Where.GONE
    backward = view(rank(0, Frame("_engine_run_backward", GRAPH, 979), user(5),
                         cpu=(1.0, 1.9)))
    assert backward.where is Where.BUSY  # computing its backward, not waiting
    # Still inside a backward: waiting in DDP's gradient all-reduce; the native read of such
    # a rank shows the reducer there, and an async work's wait outside any torch call is one.
    still = view(rank(0, Frame("_engine_run_backward", GRAPH, 979), user(5), cpu=(1.0, 1.1)))
    assert (still.where, still.label) == (Where.WAITING, "ddp.bucket")
    wait = Frame("c10d::ProcessGroupGloo::AsyncWork::wait", "/torch/lib/libtorch_cpu.so",
                 native=True)
    snap = rank(0, user(5))
    main = snap.samples[-1].threads[0]
    snap.samples.append(Sample(t=1.5, cpu=1.0, io=0, threads=[
        Thread("MainThread", main.tid, True, [wait, *main.frames])]))
    waiting = view(snap)
    assert (waiting.where, waiting.op) == (Where.WAITING, "wait")


def test_snapshot_round_trip_and_damaged_files(tmp_path: Path) -> None:
    snap = Snapshot("n0", 1.0, "torchrun", 2, [rank(0, api("barrier"), user(5))])
    write(snap, tmp_path)
    again = read(tmp_path)
    assert again.ranks[0].samples[0].threads[0].frames[1].line == 5
    path = tmp_path / schema.SNAPSHOT_FILE
    body = json.loads(path.read_text())
    for damage in ("{", json.dumps({**body, "version": 99}),
                   json.dumps({**body, "ranks": [{"rank": "x"}]}), "[]"):
        path.write_text(damage)
        with pytest.raises(SnapshotError):
            read(tmp_path)
    link = tmp_path / "other"
    link.mkdir()
    (link / schema.SNAPSHOT_FILE).symlink_to(path)
    with pytest.raises(SnapshotError):
        read(link)


def test_torchrun_agents_are_launchers_not_ranks() -> None:
    from ddpdoctor.launch.discover import is_agent

    assert is_agent(["/usr/bin/python3", "/venv/bin/torchrun", "--nproc-per-node", "8"])
    assert is_agent(["python", "-m", "torch.distributed.run", "train.py"])
    from ddpdoctor.runtime.torch_internals import TORCHRUN_ENTRY  # ddpdoctor run's own form

    assert is_agent(["python", "-c", TORCHRUN_ENTRY, "train.py"])
    assert not is_agent(["python", "-c", "print(1)", "train.py"])
    assert not is_agent(["python", "-u", "train.py"])
