"""``ddpdoctor attach`` on jobs started without ddpdoctor (plain torchrun, mp.spawn, one process
per rank as srun starts them): the root rank, its line and the cause, from stacks read while
the job hangs; a healthy job is said to progress; the job is left running and unchanged."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ddpdoctor.launch.proctree import alive

from .jobs import EXAMPLES, SCRIPTS, PlainJob, attach, ddpdoctor, marker_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# (script, its arguments, launcher, ranks, root kind, cause, {rank: marker of its line})
CASES = [
    pytest.param(EXAMPLES / "rank0_only_barrier.py", (), "torchrun", 2, "op_mismatch",
                 "rank_conditional_collective", {0: "rank0_barrier", 1: "train_backward"},
                 id="rank0_only_barrier"),
    pytest.param(EXAMPLES / "rank0_only_barrier.py", (), "torchrun", 8, "op_mismatch",
                 "rank_conditional_collective", {0: "rank0_barrier", 7: "train_backward"},
                 id="rank0_only_barrier_8_ranks"),
    pytest.param(EXAMPLES / "rank0_only_reduce.py", (), "torchrun", 2, "op_mismatch",
                 "rank_conditional_collective", {0: "rank0_reduce"}, id="rank0_only_reduce"),
    pytest.param(EXAMPLES / "seed000_eval_grad.py", (), "torchrun", 2, "op_mismatch",
                 "rank_conditional_ddp_forward", {0: "eval_forward", 1: "train_backward"},
                 id="seed000_bn_broadcast"),
    pytest.param(EXAMPLES / "seed001_uneven.py", ("--case", "4"), "python", 2, "op_mismatch",
                 "collective_inside_join", {0: "case4_join", 1: "case4_barrier"},
                 id="seed001_barrier_in_join_spawn"),
    pytest.param(EXAMPLES / "seed001_uneven.py", ("--case", "5"), "python", 2, "op_mismatch",
                 "uneven_inputs", {0: "case5_barrier", 1: "case5_backward"},
                 id="seed001_uneven_spawn"),
    pytest.param(EXAMPLES / "broadcast_root_mismatch.py", (), "torchrun", 2, "root_mismatch",
                 "broadcast_root_mismatch", {0: "broadcast_best", 1: "broadcast_best"},
                 id="broadcast_root_mismatch"),
    pytest.param(EXAMPLES / "p2p_tag_mismatch.py", (), "torchrun", 2, "tag_mismatch",
                 "p2p_tag_mismatch", {0: "send", 1: "recv"}, id="p2p_tag_mismatch"),
    pytest.param(SCRIPTS / "p2p_cycle.py", (), "torchrun", 2, "wait_cycle",
                 "p2p_peer_mismatch", {0: "recv", 1: "recv"}, id="p2p_deadlock"),
    pytest.param(EXAMPLES / "group_order_inversion.py", (), "torchrun", 2, "wait_cycle",
                 "group_order_inversion", {0: "rank0_first", 1: "rank1_first"},
                 id="group_order_inversion"),
    pytest.param(SCRIPTS / "four_rank_groups.py", (), "torchrun", 4, "wait_cycle",
                 "group_order_inversion",
                 {0: "grads_first", 1: "grads_first", 2: "metrics_first", 3: "metrics_first"},
                 id="four_ranks_two_groups"),
    pytest.param(SCRIPTS / "stuck_rank.py", (), "env", 2, "rank_stuck",
                 "rank_stuck_in_user_code", {0: "stuck", 1: "barrier"},
                 id="stuck_in_user_code_srun_shaped"),
    pytest.param(SCRIPTS / "lightning_job.py", ("--rank0-callback",), "python", 2,
                 "op_mismatch", "rank_conditional_collective", {0: "callback"},
                 id="lightning_rank0_callback"),
    pytest.param(SCRIPTS / "uneven_lingering.py", (), "torchrun", 2, "rank_exited_early",
                 "uneven_inputs", {1: "backward"}, id="seed001_uneven_rank_left"),
    pytest.param(SCRIPTS / "crash_thread_alive.py", (), "torchrun", 2, "rank_crashed",
                 "rank_crashed", {0: "backward", 1: "raise"}, id="crashed_rank_others_wait"),
]


@pytest.mark.parametrize("script, args, launcher, nproc, kind, cause, lines", CASES)
def test_attach_names_the_root_its_line_and_the_cause(
        tmp_path: Path, script: Path, args: tuple, launcher: str, nproc: int, kind: str,
        cause: str, lines: dict[int, str]) -> None:
    with PlainJob(tmp_path, script, *args, nproc=nproc, launcher=launcher) as job:
        pids = job.wait_until_still(timeout=150)
        found = attach(tmp_path, *pids)
        assert found.returncode == 3, found.stderr[-3000:]
        assert found.report is not None
        root = found.report["findings"][0]
        assert (root["kind"], root["cause"]) == (kind, cause), root["summary"]
        sites = {int(r): (Path(d["site"]["file"]).name, d["site"]["line"])
                 for r, d in root["ranks"].items() if d.get("site")}
        for rank, marker in lines.items():
            assert sites.get(rank) == (script.name, marker_line(script, marker)), (rank, sites)
        assert cause in found.stdout
        # The job is left as it was: every rank still runs.
        assert all(alive(pid) for pid in pids)
        # The folder is read again by diff, to the same diagnosis.
        again = ddpdoctor("diff", "--json", str(found.logdir))
        assert again.returncode == 1, again.stderr
        assert json.loads(again.stdout)["findings"][0]["kind"] == kind


def test_two_nodes_each_attached_then_diffed_together(tmp_path: Path) -> None:
    """2 nodes x 2 ranks (two torchrun agents, a static rendezvous on this machine): each
    node's attach names the ranks it cannot see instead of blaming its own; `diff` of both
    folders roots the hang at rank 0's barrier under `if rank == 0:`."""
    from ddpdoctor.launch.command import free_port

    script = EXAMPLES / "rank0_only_barrier.py"
    port = str(free_port())
    nodes = [("--nnodes", "2", "--node-rank", str(k), "--master-addr", "127.0.0.1",
              "--master-port", port) for k in range(2)]
    with PlainJob(tmp_path, script, torchrun=nodes[0]) as node0, \
            PlainJob(tmp_path, script, torchrun=nodes[1]) as node1:
        folders = []
        for k, node in enumerate((node0, node1)):
            pids = node.wait_until_still()
            folder = tmp_path / f"node{k}"
            folder.mkdir()
            found = attach(folder, *pids)
            assert found.report is not None, found.stderr[-2000:]
            assert found.report["verdict"] == "incomplete", found.stdout
            assert not found.report["findings"], found.stdout
            assert "no stack here" in found.stdout
            folders.append(str(found.logdir))
        merged = ddpdoctor("diff", "--json", *folders)
        report = json.loads(merged.stdout)
        root = report["findings"][0]
        assert (root["kind"], root["cause"]) == ("op_mismatch", "rank_conditional_collective")
        assert sorted(int(r) for r in root["ranks"]) == [0, 1, 2, 3]
        assert root["ranks"]["0"]["site"]["line"] == marker_line(script, "rank0_barrier")


def test_flight_recorder_dumps_the_job_left_are_kept_and_aligned(tmp_path: Path,
                                                                 monkeypatch) -> None:
    script = SCRIPTS / "fr_dump_then_hang.py"
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")
    monkeypatch.setenv("TORCH_FR_DUMP_TEMP_FILE", str(tmp_path / "nccl_trace_rank_"))
    with PlainJob(tmp_path, script) as job:
        pids = job.wait_until_still()
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("nccl_trace_rank_*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        found = attach(tmp_path, *pids)
        assert found.report is not None and found.returncode == 3
        assert "flight-recorder" in found.stdout
        copies = sorted(p.name for p in (found.logdir / "flight-recorder").iterdir())
        assert copies == ["nccl_trace_rank_0", "nccl_trace_rank_1"]
        aligned = ddpdoctor("diff", "--json", str(found.logdir / "flight-recorder"))
        root = json.loads(aligned.stdout)["findings"][0]
        assert root["ranks"]["0"]["op"] == "barrier", root


def test_attach_finds_the_job_by_itself_and_says_a_healthy_job_progresses(
        tmp_path: Path) -> None:
    with PlainJob(tmp_path, SCRIPTS / "healthy_training.py") as job:
        deadline = time.monotonic() + 60
        while len(job.rank_pids()) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # past init_process_group and DDP's construction, into training
        found = attach(tmp_path)
        if found.returncode == 2 and "jobs found on this node" in found.stderr:
            # Other jobs run on this machine (a test run beside this one): each is listed,
            # and ours is picked by its number, as a user would.
            import re

            number = re.search(rf"\[(\d+)\] torchrun \(pid {job.procs[0].pid}\)",
                               found.stderr)
            assert number is not None, found.stderr
            found = attach(tmp_path, options=("--job", number.group(1)))
        assert found.returncode == 0, found.stdout + found.stderr[-3000:]
        assert found.report is not None and found.report["verdict"] == "running"
        assert "RUNNING" in found.stdout
        assert not [f for f in found.report["findings"] if f["severity"] == "error"]


def test_attach_with_no_job_and_with_a_pid_that_is_no_rank_says_so_in_one_line(
        tmp_path: Path) -> None:
    import os

    proc = ddpdoctor("attach", "--logdir", str(tmp_path / "a"), str(os.getpid()))
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no torch.distributed job found" in lines[0], proc.stderr


def test_stacks_that_cannot_be_read_are_one_line_with_the_fix(tmp_path: Path) -> None:
    """py-spy denied (attach without CAP_SYS_PTRACE, as in a container): one line saying so
    and how to fix it, exit 2; no verdict."""
    import shlex
    import shutil
    import subprocess
    import sys

    if shutil.which("capsh") is None:
        pytest.skip("capsh (libcap2-bin) is not installed")
    with PlainJob(tmp_path, EXAMPLES / "rank0_only_barrier.py") as job:
        pids = job.wait_until_still()
        command = shlex.join([sys.executable, "-m", "ddpdoctor", "attach", "--logdir",
                              str(tmp_path / "denied"), *map(str, pids)])
        proc = subprocess.run(["capsh", "--drop=cap_sys_ptrace", "--", "-c", command],
                              capture_output=True, text=True, timeout=90)
        if "could not read" not in proc.stderr and proc.returncode != 2:
            pytest.skip("this machine lets a process without CAP_SYS_PTRACE read its peers")
        lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(lines) == 1 and "Permission denied" in lines[0], proc.stderr
        assert "CAP_SYS_PTRACE" in lines[0] and "Traceback" not in proc.stderr
        assert not proc.stdout.strip()
