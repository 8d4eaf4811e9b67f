"""``ddpdoctor run`` records every collective of every rank: real torchrun jobs on gloo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from ddpdoctor.launch.command import free_port
from ddpdoctor.trace.reader import read_rank

from .jobs import EXAMPLES, REPO, SCRIPTS, BackgroundJob, ddpdoctor, marker_line, run_job


def _object_gather_op() -> str:
    """The collective torch's ``all_gather_object`` issues (twice: sizes, then data):
    ``all_gather``, or ``all_gather_into_tensor`` where it gathers into one tensor (torch 2.15's
    ``all_gather_single``)."""
    import inspect

    import torch.distributed as dist

    source = inspect.getsource(dist.all_gather_object)
    single = "all_gather_single(" in source or "all_gather_into_tensor(" in source
    return "all_gather_into_tensor" if single else "all_gather"


def _signature(c):
    return (c.group, c.seq, c.op, c.label, c.shapes, c.dtypes, c.bucket, c.iteration)


@pytest.mark.timeout(120)
def test_healthy_ddp_run_records_buckets_buffers_rebuild_and_groups(tmp_path: Path) -> None:
    steps = 4
    job = run_job(tmp_path, SCRIPTS / "ddp_steps.py", "--steps", str(steps))
    assert job.returncode == 0, job.stderr
    run = job.run()
    assert sorted(run.ranks) == [0, 1]
    for trace in run.ranks.values():
        labels = Counter(c.label for c in trace.collectives)
        assert labels["ddp.init.verify_params"] >= 1 and labels["ddp.init.sync_params"] >= 1
        buckets = [c for c in trace.collectives if c.label == "ddp.bucket"]
        per_iter = Counter(c.iteration for c in buckets)
        assert sorted(per_iter) == list(range(1, steps + 1))
        # After the rebuild on iteration 2 the layout is fixed: B buckets every iteration.
        steady = {per_iter[i] for i in range(2, steps + 1)}
        assert len(steady) == 1 and steady.pop() > 1
        b = per_iter[steps]
        assert len(buckets) == per_iter[1] + (steps - 1) * b
        assert [c.bucket for c in buckets if c.iteration == steps] == list(range(b))
        assert all(c.op == "all_reduce" and c.reduce_op == "SUM" and c.api is None
                   for c in buckets)
        # BatchNorm buffers are broadcast in every forward, from root 0.
        buffers = [c for c in trace.collectives if c.label == "ddp.buffers"]
        assert {c.iteration for c in buffers} == set(range(1, steps + 1))
        assert all(c.op == "broadcast" and c.root == 0 for c in buffers)
        rebuild = [c for c in trace.collectives if c.label == "ddp.rebuild_buckets"]
        assert rebuild and {c.iteration for c in rebuild} == {2}
        assert [c.dtypes for c in rebuild] == [["int32"], ["int32"]]
        # The side group's barrier and the object collective are the script's own.
        side = [c for c in trace.collectives if c.group != "0"]
        assert [(c.op, c.label, c.seq) for c in side] == [("barrier", "user", 1)]
        assert len(trace.groups) == 2
        objs = [c for c in trace.collectives if c.api == "all_gather_object"]
        assert [c.op for c in objs] == [_object_gather_op()] * 2
        assert all(c.state == "completed" for c in trace.collectives)
        assert trace.finished and trace.ddp and trace.ddp[0]["broadcast_buffers"] is True
        # Every record points at the script's own line.
        assert all(c.site and c.site.file.endswith("ddp_steps.py") for c in trace.collectives)
        loss_line = [c.site.line for c in buckets]
        assert set(loss_line) == {_line_of(SCRIPTS / "ddp_steps.py", "loss.backward()")}
    sigs = [[_signature(c) for c in run.ranks[r].collectives] for r in (0, 1)]
    assert sigs[0] == sigs[1]


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.timeout(120)
def test_find_unused_parameters_used_map_is_labelled(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "ddp_steps.py", "--steps", "2", "--find-unused")
    assert job.returncode == 0, job.stderr
    trace = job.run().ranks[0]
    unused = [c for c in trace.collectives if c.label == "ddp.unused_params"]
    assert [c.iteration for c in unused] == [1, 2]
    assert all(c.dtypes == ["int32"] and c.op == "all_reduce" for c in unused)
    assert trace.ddp[0]["find_unused_parameters"] is True


@pytest.mark.timeout(180)
def test_final_parameters_are_bit_identical_with_and_without_ddpdoctor(tmp_path: Path) -> None:
    plain_out, doc_out = tmp_path / "plain.pt", tmp_path / "doctor.pt"
    plain = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(SCRIPTS / "ddp_steps.py"), "--steps", "5",
         "--out", str(plain_out)],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert plain.returncode == 0 or plain_out.exists(), plain.stderr[-2000:]
    job = run_job(tmp_path / "doc", SCRIPTS / "ddp_steps.py", "--steps", "5", "--out",
                  str(doc_out))
    assert doc_out.exists(), job.stderr
    a, b = torch.load(plain_out), torch.load(doc_out)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.timeout(120)
def test_ddps_coalesced_broadcasts_reach_every_rank_and_are_recorded_per_broadcast(
        tmp_path: Path) -> None:
    # ddpdoctor records these in Python and runs them on gloo directly (pg_wrapper's
    # _Issuer.broadcast_coalesced): rank 1's parameters and buffers, set apart from rank 0's,
    # must be rank 0's after DDP's construction and after a forward.
    job = run_job(tmp_path, SCRIPTS / "buffers_synced.py")
    assert job.returncode == 0, job.stdout + job.stderr
    assert "rank 1: synced" in job.stdout and "NOT synced" not in job.stdout
    for trace in job.run().ranks.values():
        ddp = [(c.label, c.op, c.shapes, c.dtypes, c.root, c.state, c.iteration)
               for c in trace.collectives if c.label in ("ddp.init.sync_params", "ddp.buffers")]
        assert ddp == [
            ("ddp.init.sync_params", "broadcast", [[208]], ["float32"], 0, "completed", 0),
            ("ddp.init.sync_params", "broadcast", [[68]], ["float64"], 0, "completed", 0),
            ("ddp.init.sync_params", "broadcast", [[1]], ["int64"], 0, "completed", 0),
            ("ddp.buffers", "broadcast", [[32]], ["float32"], 0, "completed", 1),
            ("ddp.buffers", "broadcast", [[1]], ["int64"], 0, "completed", 1)]
        sites = {c.site.line for c in trace.collectives if c.label == "ddp.buffers"}
        assert sites == {marker_line(SCRIPTS / "buffers_synced.py", "forward")}


@pytest.mark.timeout(120)
def test_spawn_script_runs_unmodified_under_python_launcher(tmp_path: Path) -> None:
    job = run_job(tmp_path, EXAMPLES / "seed001_uneven.py", "--case", "1",
                  options=("--launcher", "python"))
    assert job.returncode == 0, job.stderr
    assert sorted(p.name for p in job.logdir.glob("rank-*.jsonl")) == ["rank-0.jsonl",
                                                                      "rank-1.jsonl"]
    run = job.run()
    labels = {r: Counter(c.label for c in t.collectives) for r, t in run.ranks.items()}
    # Rank 0 runs out of inputs first and shadows rank 1's last iteration through join().
    assert labels[0]["join.shadow_bucket"] >= 1 and labels[0]["join.num_nonjoined"] >= 1
    assert labels[1]["join.notify"] >= 1 and labels[1]["join.shadow_bucket"] == 0
    assert all(t.finished for t in run.ranks.values())


@pytest.mark.timeout(120)
def test_sigkilled_rank_leaves_a_readable_trace_ending_at_its_last_collective(
        tmp_path: Path) -> None:
    with BackgroundJob(tmp_path, SCRIPTS / "long_loop.py") as job:
        victim = job.wait_for_collectives(1, 20)["pid"]
        os.kill(victim, signal.SIGKILL)
        assert job.finish() != 0
    logdir = job.logdir
    trace = read_rank(logdir / "rank-1.jsonl")
    assert trace.exit is None and trace.collectives
    assert trace.collectives[-1].op == "all_reduce"
    assert trace.damaged_lines == 0
    assert len(trace.collectives) >= 20


@pytest.mark.timeout(120)
def test_teardown_abort_after_finishing_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "teardown_abort.py")
    assert job.run().ranks[1].finished
    assert job.returncode == 0, job.stderr
    assert job.report is not None and job.report["verdict"] == "clean", job.stderr
    (warning,) = job.report["findings"]
    assert warning["kind"] == "teardown_abort" and warning["severity"] == "warning", warning
    assert warning["summary"].startswith("Rank 1 finished its script, then its process died "
                                         "with SIGABRT"), warning["summary"]
    assert "teardown" in job.stderr


@pytest.mark.timeout(120)
def test_a_rank_stopped_by_the_launcher_after_a_teardown_abort_is_not_the_cause(
        tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "teardown_abort.py", "--rank0-works", "20")
    assert job.returncode != 0 and job.report is not None, job.stderr
    assert job.report["verdict"] == "crashed", job.report
    root = job.report["findings"][0]
    assert root["kind"] == "teardown_abort" and root["severity"] == "error", root
    assert root["summary"].startswith("Rank 1 finished its script, then its process died "
                                      "with SIGABRT"), root["summary"]
    assert "stopped rank 0 with SIGTERM" in root["summary"], root["summary"]
    assert all(f["follow_on"] for f in job.report["findings"][1:]
               if f["kind"] == "rank_crashed"), job.report["findings"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, message", [
    (["run", "does_not_exist.py"], "script not found"),
    (["run", "--nproc-per-node", "zero", "x.py"], "--nproc-per-node must be a number"),
    (["run", "--bogus-option", "x.py"], "unknown option --bogus-option"),
    (["diff", "/nonexistent/logs"], "no such file or folder"),
])
def test_bad_input_gives_one_clear_line_and_no_traceback(tmp_path: Path, argv: list[str],
                                                         message: str) -> None:
    proc = ddpdoctor(*argv, cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.timeout(60)
def test_syntax_error_in_script_is_reported_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nfor x in range(3)\n    print(x)\n")
    proc = ddpdoctor("run", "--logdir", str(tmp_path / "logs"), str(bad), cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{bad}:2: syntax error" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()


def _gloo_has_all_to_all() -> bool:
    """Whether this torch's gloo has the list ``all_to_all`` (torch 2.6's refuses it)."""
    import torch.distributed as dist

    group = dist.ProcessGroupGloo(dist.HashStore(), 0, 1)
    try:
        group.alltoall([torch.empty(1)], [torch.ones(1)], dist.AllToAllOptions()).wait()
    except RuntimeError:
        return False
    return True


@pytest.mark.timeout(120)
def test_every_op_kind_is_recorded_with_root_peer_reduce_op_and_amounts(tmp_path: Path) -> None:
    a2a_list = _gloo_has_all_to_all()
    job = run_job(tmp_path, SCRIPTS / "all_ops.py", *([] if a2a_list else ["--no-all-to-all"]))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    for rank, trace in job.run().ranks.items():
        ops = [(c.op, c.api) for c in trace.collectives]
        assert ops == [
            ("all_reduce", "all_reduce"), ("broadcast", "broadcast"), ("reduce", "reduce"),
            ("all_gather", "all_gather"), ("all_gather_into_tensor", "all_gather_into_tensor"),
            ("reduce_scatter_tensor", "reduce_scatter_tensor"),
            ("all_gather_into_tensor_coalesced", None), ("reduce_scatter_tensor_coalesced", None),
            ("all_to_all_single", "all_to_all_single"),
            *([("all_to_all", "all_to_all")] if a2a_list else []),
            ("gather", "gather"),
            ("scatter", "scatter"), ("barrier", "barrier"),
            ("send" if rank == 0 else "recv", "send" if rank == 0 else "recv"),
            (_object_gather_op(), "all_gather_object"), (_object_gather_op(), "all_gather_object")]
        by_op = {c.op: c for c in trace.collectives}
        assert by_op["broadcast"].root == 1 and by_op["reduce"].root == 0
        assert by_op["reduce"].reduce_op == "SUM" and by_op["scatter"].root == 0
        p2p = by_op["send" if rank == 0 else "recv"]
        assert p2p.seq is None and p2p.p2p_seq == 1 and p2p.peer == 1 - rank
        assert [c.seq for c in trace.collectives if c.seq is not None] == \
            list(range(1, 16 if a2a_list else 15))
        # What decides a match beyond the tensors: amounts per peer, and the tag.
        assert p2p.tag == 5
        a2a = by_op["all_to_all_single"]
        assert (a2a.sends, a2a.recvs, a2a.row) == ((2, 2), (2, 2), 1)
        if a2a_list:
            assert (by_op["all_to_all"].sends, by_op["all_to_all"].recvs) == ((2, 2), (2, 2))
        assert by_op["gather"].sends == (4, 0) and by_op["scatter"].recvs == (4, 0)
        assert (by_op["gather"].recvs, by_op["scatter"].sends) == \
            (((4, 4), (4, 4)) if rank == 0 else (None, None))
        # The coalesced ops (gloo binds them in C++ only: the recorder once broke FSDP2 jobs
        # there) ran, and their site is the script's line, not contextlib's __exit__.
        coalesced = [c for c in trace.collectives if c.op.endswith("_coalesced")]
        assert [c.shapes for c in coalesced] == [[[4], [2]], [[2 * 2], [2]]]
        managers = {i for i, line in enumerate(
            (SCRIPTS / "all_ops.py").read_text().splitlines(), 1)
            if line.startswith("with dist._coalescing_manager()")}
        assert {(c.site.file_name, c.site.line) for c in coalesced if c.site} == \
            {("all_ops.py", line) for line in managers} and len(managers) == 2


@pytest.mark.timeout(120)
def test_a_group_started_by_init_device_mesh_is_recorded(tmp_path: Path) -> None:
    # device_mesh imports init_process_group by name while torch is imported, before
    # ddpdoctor's patch: once, tensor-parallel scripts ran unrecorded ("nothing was tested").
    job = run_job(tmp_path, SCRIPTS / "device_mesh_tp.py")
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    for trace in job.run().ranks.values():
        assert "0" in trace.groups
        forward = [c for c in trace.collectives if c.op == "all_reduce"]
        assert len(forward) == 3
        assert {(c.site.file_name, c.site.line) for c in forward if c.site} == \
            {("device_mesh_tp.py", 15)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("diverge", [False, True], ids=["healthy", "rank-local-save"])
def test_a_monitored_barrier_is_recorded(tmp_path: Path, diverge: bool) -> None:
    """``dist.monitored_barrier`` reaches the backend from the C++ base group unless the
    recording group takes it: recorded, a rank alone in one is found at once."""
    path = SCRIPTS / "monitored_barrier.py"
    job = run_job(tmp_path, path, *(("--diverge",) if diverge else ()), hang_timeout=20)
    ops = {c.op for t in job.run().ranks.values() for c in t.collectives}
    assert "monitored_barrier" in ops, ops
    if not diverge:
        assert job.returncode == 0 and job.report["verdict"] == "clean", job.stderr[-3000:]
        return
    assert job.returncode == 3, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["kind"] == "op_mismatch" and root["cause"] == "rank_conditional_collective"
    lines = {int(r): d["site"]["line"] for r, d in root["ranks"].items()}
    assert lines == {0: marker_line(path, "monitored"), 1: marker_line(path, "backward")}
