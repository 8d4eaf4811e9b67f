"""``ddpdoctor run`` notices hangs in seconds, collects every rank's stack and stops the job."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from ddpdoctor.launch.command import free_port
from ddpdoctor.trace.reader import load_run

from .jobs import (
    EXAMPLES,
    SCRIPTS,
    BackgroundJob,
    ddpdoctor,
    job_processes,
    marker_line,
    run_job,
)

HANG_TIMEOUT = 5
GRACE = 2
# Interpreter and torch start-up, rendezvous and the diagnosis itself, on a 2-core machine.
SLACK = 20

HANGS = [
    pytest.param("seed001_uneven.py", ("--case", "4"), ("--launcher", "python"),
                 {0: "case4_join", 1: "case4_barrier"}, "collective_inside_join",
                 id="join-barrier"),
    pytest.param("seed001_uneven.py", ("--case", "5"), ("--launcher", "python"),
                 {0: "case5_barrier", 1: "case5_backward"}, "uneven_inputs", id="uneven-barrier"),
    pytest.param("rank0_only_barrier.py", (), (), {0: "rank0_barrier", 1: "train_backward"},
                 "rank_conditional_collective", id="rank0-barrier"),
    pytest.param("group_order_inversion.py", (), (), {0: "rank0_first", 1: "rank1_first"},
                 "group_order_inversion", id="cross-group"),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("example, args, options, stuck_at, cause", HANGS)
def test_hang_is_stopped_within_the_timeout_with_each_ranks_stack(
        tmp_path: Path, example: str, args: tuple, options: tuple, stuck_at: dict,
        cause: str) -> None:
    path = EXAMPLES / example
    started = time.monotonic()
    job = run_job(tmp_path, path, *args, options=options, hang_timeout=HANG_TIMEOUT)
    elapsed = time.monotonic() - started
    assert job.returncode == 3, job.stderr[-3000:]
    assert "hang detected" in job.stderr
    assert elapsed < HANG_TIMEOUT + GRACE + SLACK, elapsed
    report = job.report
    assert report["findings"][0]["cause"] == cause
    if cause == "group_order_inversion":
        assert report["findings"][0]["kind"] == "wait_cycle"
    for rank, marker in stuck_at.items():
        stack = report["ranks"][str(rank)]["hang_stack"]
        assert stack, f"rank {rank} has no stack"
        assert Path(stack[0]["file"]).name == example
        assert stack[0]["line"] == marker_line(path, marker)
    assert "Stacks at the hang" in job.stderr
    # Every rank wrote its evidence into its own trace before the job was stopped.
    run = job.run()
    assert all(t.hang and t.hang["pending"] for t in run.ranks.values())


@pytest.mark.timeout(120)
def test_crash_names_the_exception_its_line_and_where_the_others_were_left(
        tmp_path: Path) -> None:
    path = EXAMPLES / "seed003_crash.py"
    job = run_job(tmp_path, path)
    assert job.returncode == 1
    root = job.report["findings"][0]
    assert root["kind"] == "rank_crashed"
    assert "ValueError: Simulated error in process 1" in root["summary"]
    crashed = root["ranks"]["1"]
    assert crashed["site"]["line"] == marker_line(path, "raise_error")
    survivor = root["ranks"]["0"]
    assert survivor["op"] == "all_reduce" and survivor["label"] == "ddp.bucket"
    assert survivor["site"]["line"] == marker_line(path, "train_backward")
    assert "left waiting" in root["summary"]


@pytest.mark.timeout(120)
def test_a_script_that_refuses_its_arguments_is_reported_in_argparse_s_words(
        tmp_path: Path) -> None:
    """Exit 2 before any collective: what argparse wrote on each rank's stderr is the reason."""
    job = run_job(tmp_path, SCRIPTS / "blocked_rank.py")  # its required --on left out
    assert job.returncode == 1, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["kind"] == "rank_crashed" and "sys.exit(2)" in root["summary"], root
    words = "blocked_rank.py: error: the following arguments are required: --on"
    assert [e for e in root["evidence"] if e.endswith(f'stderr: "{words}"')], root["evidence"]
    assert f'stderr: "{words}"' in job.stderr.split("Root cause")[-1]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_ddpdoctor_stops_the_job_and_keeps_readable_logs(tmp_path: Path,
                                                                    sig: int) -> None:
    with BackgroundJob(tmp_path, SCRIPTS / "long_loop.py") as job:
        job.wait_for_collectives(1, 10)
        job.proc.send_signal(sig)
        code = job.finish()
    assert code == 130, job.stderr[-3000:]
    assert "interrupted" in job.stderr
    logdir = job.logdir
    run = load_run([logdir])
    assert sorted(run.ranks) == [0, 1]
    assert all(len(t.collectives) >= 10 for t in run.ranks.values())
    report = json.loads((tmp_path / "report.json").read_text())
    # Interrupted is no crash: no rank "raised KeyboardInterrupt", nothing to fix.
    assert report["verdict"] == "incomplete", report["findings"][:1]
    assert not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    assert any("interrupted" in n for n in report["notes"]), report["notes"]
    assert "KeyboardInterrupt" not in job.stderr.split("ddpdoctor: interrupted")[-1]


@pytest.mark.timeout(120)
def test_diff_on_the_folder_of_a_running_job_says_it_runs(tmp_path: Path) -> None:
    """`ddpdoctor diff` while `ddpdoctor run` still writes the folder: the job still runs
    (the run holds the folder's lock), not "cut, or still runs, or killed"."""
    with BackgroundJob(tmp_path, SCRIPTS / "long_loop.py") as job:
        job.wait_for_collectives(1, 10)
        live = ddpdoctor("diff", "--json", str(job.logdir))
        job.proc.send_signal(signal.SIGINT)
        job.finish()
    report = json.loads(live.stdout)
    assert any("the job is still running" in n for n in report["notes"]), report["notes"]
    assert not any("was cut, or the job still runs" in n for n in report["notes"])
    after = ddpdoctor("diff", "--json", str(job.logdir))  # ended: the lock is free
    assert not any("still running" in n for n in json.loads(after.stdout)["notes"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script, options", [
    ("long_loop.py", ()), ("rank0_only_barrier.py", ()),
    ("seed001_uneven.py", ("--launcher", "python")),
    ("process_workers.py", ("--launcher", "python")),
], ids=["torchrun-running", "torchrun-hung", "mp.spawn", "multiprocessing-fork"])
def test_sigkill_of_ddpdoctor_leaves_no_process_of_the_job(tmp_path: Path, script: str,
                                                          options: tuple) -> None:
    path = SCRIPTS / script if (SCRIPTS / script).exists() else EXAMPLES / script
    extra: tuple = ("--case", "4") if script.startswith("seed001") else ()
    if script == "process_workers.py":  # forked workers: no death signal of their own
        extra = ("--start-method", "fork", "--steps", "1000000", "--port", str(free_port()))
    with BackgroundJob(tmp_path, path, options=("--hang-timeout", "60", *options),
                       script_args=extra) as job:
        job.wait_for_collectives(1, 5)
        assert job_processes(job.logdir)
        job.proc.kill()
        job.proc.wait()
        deadline = time.monotonic() + 10
        while job_processes(job.logdir) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = job_processes(job.logdir)
        assert not survivors, f"processes outlived ddpdoctor's SIGKILL: {survivors}"


@pytest.mark.timeout(120)
def test_rank_that_never_reaches_init_process_group(tmp_path: Path) -> None:
    path = SCRIPTS / "late_rank.py"
    # Rank 1 sleeps in its own start-up: busy, not waiting, until the stuck timeout.
    job = run_job(tmp_path, path, hang_timeout=HANG_TIMEOUT, options=("--stuck-timeout", "3"))
    assert job.returncode == 3, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["kind"] == "init_incomplete" and root["cause"] == "rank_never_initialised"
    assert root["ranks"]["0"]["site"]["line"] == marker_line(path, "init")
    assert root["ranks"]["1"]["site"]["line"] == marker_line(path, "stuck_before_init")


@pytest.mark.timeout(120)
def test_a_receive_cycle_inside_one_group_gets_a_point_to_point_cause(tmp_path: Path) -> None:
    """Issue 54: both ranks receive first, in the default group alone: a p2p cause, not the
    two-group inversion whose premise the job denies."""
    path = SCRIPTS / "p2p_cycle.py"
    job = run_job(tmp_path, path, hang_timeout=HANG_TIMEOUT)
    assert job.returncode == 3, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"]) == ("wait_cycle", "p2p_peer_mismatch")
    assert "inside the default group" in root["summary"]
    assert all(d["site"]["line"] == marker_line(path, "recv") for d in root["ranks"].values())
