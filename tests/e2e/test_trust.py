"""Never wrong with confidence: evidence survives abrupt death, a busy rank is not a hang,
nothing tested is not green, a cut trace is incomplete, and crashes get their real cause."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .jobs import EXAMPLES, SCRIPTS, ddpdoctor, kill_job_processes, marker_line, run_job


def _root(job) -> dict:
    return job.report["findings"][0]


def _lines(finding: dict) -> dict[int, tuple[str, int]]:
    return {int(r): (Path(d["site"]["file"]).name, d["site"]["line"])
            for r, d in finding["ranks"].items() if d.get("site")}


ABORTS = [
    pytest.param("grad_accum_nosync.py", "rank_dependent_no_sync",
                 {0: "sync_backward", 1: "log_loss"}, id="no_sync-count"),
    pytest.param("iterable_uneven.py", "uneven_inputs", {0: "backward", 1: "metrics"},
                 id="iterable-dataset"),
    pytest.param("nan_skip.py", "data_dependent_skip",
                 {0: "loss_all_reduce", 1: "backward"}, id="nan-skip"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script, cause, lines", ABORTS)
def test_gloo_abort_keeps_the_mismatched_collective_of_both_ranks(
        tmp_path: Path, script: str, cause: str, lines: dict) -> None:
    job = run_job(tmp_path, SCRIPTS / script, hang_timeout=20)
    assert job.returncode == 1, job.stderr[-3000:]
    report = job.report
    root = _root(job)
    assert report["verdict"] == "diverged"
    assert root["kind"] == "shape_mismatch" and root["cause"] == cause, root
    for rank, marker in lines.items():
        assert _lines(root)[rank] == (script, marker_line(SCRIPTS / script, marker))
    # gloo killed one of the ranks with SIGABRT, yet its side of the mismatch was on disk.
    assert any(r["exit_code"] == -6 for r in report["ranks"].values()), report["ranks"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["", "--compute", "--subprocess"],
                         ids=["writing", "computing", "child-writing"])
def test_a_rank_busy_three_hang_timeouts_outside_collectives_is_not_a_hang(
        tmp_path: Path, how: str) -> None:
    args = ("--seconds", "7.5") + ((how,) if how else ())
    job = run_job(tmp_path, SCRIPTS / "slow_checkpoint.py", *args, hang_timeout=2.5)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    assert "hang detected" not in job.stderr and "rank stuck" not in job.stderr
    # A Python subprocess of a rank (here, the writer) is no rank and writes no trace.
    assert sorted(p.name for p in job.logdir.glob("rank-*")) == ["rank-0.jsonl", "rank-1.jsonl"]
    # While it saved, rank 0 told the launcher where it was and that it was outside any
    # collective; rank 1 meanwhile waited in the barrier. (Records from elsewhere may say
    # otherwise: on a loaded machine rank 0 can wait in DDP's construction for rank 1.)
    activity = [json.loads(line) for line in (job.logdir / "rank-0.jsonl").read_text()
                .splitlines() if '"activity"' in line]
    saving = [a for a in activity if a["frames"][0]["function"] == "save_checkpoint"]
    assert saving and all(a["pending"] == 0 and not a["in_collective"] for a in saving)


@pytest.mark.timeout(120)
def test_a_rank_stuck_in_user_code_is_reported_there(tmp_path: Path) -> None:
    path = SCRIPTS / "stuck_rank.py"
    job = run_job(tmp_path, path, hang_timeout=60, options=("--stuck-timeout", "3"))
    assert job.returncode == 3, job.stderr[-3000:]
    assert "rank stuck" in job.stderr
    root = _root(job)
    assert root["kind"] == "rank_stuck" and root["cause"] == "rank_stuck_in_user_code"
    assert _lines(root)[0] == ("stuck_rank.py", marker_line(path, "stuck"))
    assert _lines(root)[1] == ("stuck_rank.py", marker_line(path, "barrier"))


@pytest.mark.timeout(120)
def test_collectives_that_cannot_match_are_diagnosed_without_waiting_for_the_timeout(
        tmp_path: Path) -> None:
    started = time.monotonic()
    job = run_job(tmp_path, EXAMPLES / "rank0_only_barrier.py", hang_timeout=60)
    assert job.returncode == 3, job.stderr[-3000:]
    assert time.monotonic() - started < 60  # the bench measures how much sooner
    assert "can never match" in job.stderr
    assert _root(job)["cause"] == "rank_conditional_collective"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ci", [True, False], ids=["ci-mode", "plain"])
def test_nothing_tested_is_not_green_in_ci(tmp_path: Path, ci: bool) -> None:
    logdir = tmp_path / "logs"
    options = ["--cpu", "--max-steps", "2"] if ci else []
    proc = ddpdoctor("run", "--logdir", str(logdir), "--json", str(tmp_path / "r.json"),
                     *options, str(SCRIPTS / "not_distributed.py"), env={"CI": ""})
    assert not kill_job_processes(logdir)
    assert proc.returncode == (4 if ci else 0), proc.stderr[-3000:]
    assert "NOTHING WAS TESTED" in proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "untested"


@pytest.mark.timeout(120)
def test_cpu_mode_maps_torch_accelerator(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "accelerator_ddp.py", options=("--cpu",))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    assert job.report["ranks"]["0"]["iterations"] == 5


@pytest.mark.timeout(120)
def test_a_model_that_differs_between_ranks_is_named(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "param_mismatch.py")
    assert job.returncode == 1
    root = _root(job)
    assert root["kind"] == "rank_crashed" and root["cause"] == "ddp_model_mismatch"
    assert "params[0]" in " ".join(root["evidence"])


@pytest.mark.timeout(120)
def test_a_cuda_script_on_a_machine_without_gpu_is_told_to_use_cpu_mode(tmp_path: Path) -> None:
    path = SCRIPTS / "cuda_setup.py"
    job = run_job(tmp_path, path)
    assert job.returncode == 1
    root = _root(job)
    assert root["cause"] == "no_gpu", root
    assert "--cpu" in job.stderr
    # Both ranks fail on that line; torchrun stops the other rank as soon as one fails, so
    # the other's own exception record may never be written: the line is named for every
    # rank whose record was.
    sites = set(_lines(root).values())
    assert sites == {("cuda_setup.py", marker_line(path, "set_device"))}, root
    # With --cpu the same script runs, unmodified.
    cpu = run_job(tmp_path / "cpu", path, options=("--cpu",))
    assert cpu.returncode == 0 and cpu.report["verdict"] == "clean", cpu.stderr[-3000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how, words, code", [
    ("exit", "called os._exit(3)", 3), ("kill", "killed by SIGKILL", -9),
    ("segfault", "killed by SIGSEGV", -11)])
def test_every_way_a_rank_dies_is_named_with_its_exit_code(tmp_path: Path, how: str,
                                                           words: str, code: int) -> None:
    job = run_job(tmp_path, SCRIPTS / "rank_dies.py", "--how", how)
    assert job.returncode == 1
    root = _root(job)
    assert root["kind"] == "rank_crashed" and words in root["summary"], root["summary"]
    assert "after 4 collectives" in root["summary"]
    assert job.report["ranks"]["1"]["exit_code"] == code
    # Every collective rank 1 issued, the one it died after included, is in its trace.
    run = job.run()
    assert len(run.ranks[1].collectives) == 4
    # Rank 0's fifth all-reduce failed (its peer was gone), and says so: the writer asks
    # Work.is_success() when torch's warning about it could be taken out of the way. Rank 0
    # can be stopped by torchrun before it records its exit; when it recorded it, the
    # failure is in.
    zero = run.ranks[0]
    if zero.exit is not None:
        assert [c.state for c in zero.collectives] == ["completed"] * 4 + ["failed"]
    assert "deprecated" not in job.stderr


@pytest.mark.timeout(120)
def test_an_exception_in_backward_is_placed_in_its_iteration(tmp_path: Path) -> None:
    path = SCRIPTS / "backward_raises.py"
    job = run_job(tmp_path, path)
    root = _root(job)
    assert root["kind"] == "rank_crashed" and "during iteration 3" in root["summary"]
    assert _lines(root)[1] == ("backward_raises.py", marker_line(path, "raise"))


@pytest.mark.timeout(120)
def test_the_rank_everyone_waited_for_is_the_root_not_the_rank_torchrun_tore_down(
        tmp_path: Path) -> None:
    """The teardown story: rank 1's collective times out, torchrun SIGTERMs rank 0; the root
    is rank 0, blocked outside collectives after its prefetch thread died."""
    path = SCRIPTS / "dead_prefetch.py"
    job = run_job(tmp_path, path, "--gloo-timeout", "8", hang_timeout=60)
    assert job.returncode == 1, job.stderr[-3000:]
    root = _root(job)
    assert root["kind"] == "missing_collective", root["summary"]
    assert root["cause"] == "rank_blocked_outside_collectives", root["cause"]
    assert _lines(root)[1] == ("dead_prefetch.py", marker_line(path, "backward"))
    evidence = " ".join(root["evidence"])
    assert f"dead_prefetch.py:{marker_line(path, 'blocked')}" in evidence, evidence
    assert "using no CPU" in evidence
    assert 'thread "prefetch" died: ValueError: corrupt record 3' in evidence
    assert f"dead_prefetch.py:{marker_line(path, 'thread_dies')}" in evidence
    crashes = [f for f in job.report["findings"] if f["kind"] == "rank_crashed"]
    assert crashes and all(f["follow_on"] for f in crashes), crashes


@pytest.mark.timeout(120)
def test_a_rank_blocked_on_a_queue_whose_producer_died_is_stopped_at_the_hang_timeout(
        tmp_path: Path) -> None:
    path = SCRIPTS / "dead_prefetch.py"
    started = time.monotonic()
    job = run_job(tmp_path, path, hang_timeout=5)
    assert time.monotonic() - started < 60  # the hang timeout, not --stuck-timeout's 600 s
    assert job.returncode == 3, job.stderr[-3000:]
    assert "rank stuck" in job.stderr or "blocked" in job.stderr
    root = _root(job)
    assert root["kind"] == "rank_stuck" and root["cause"] == "rank_stuck_in_user_code", root
    assert _lines(root)[0] == ("dead_prefetch.py", marker_line(path, "blocked"))
    assert "(blocked in queue.get())" in root["summary"], root["summary"]
    evidence = " ".join(root["evidence"])
    assert 'thread "prefetch" died: ValueError: corrupt record 3' in evidence, evidence


BLOCKERS = [
    pytest.param("lock", "blocked_lock", 'thread "cache-refresh" died: RuntimeError: cache '
                 "refresh failed", id="lock-never-released"),
    pytest.param("worker", "blocked_worker", 'worker process "tokenizer"', id="worker-died"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on, marker, quoted", BLOCKERS)
def test_a_rank_blocked_on_what_never_comes_is_named_with_its_evidence(
        tmp_path: Path, on: str, marker: str, quoted: str) -> None:
    path = SCRIPTS / "blocked_rank.py"
    job = run_job(tmp_path, path, "--on", on, hang_timeout=5)
    assert job.returncode == 3, job.stderr[-3000:]
    root = _root(job)
    assert root["kind"] == "rank_stuck" and root["cause"] == "rank_stuck_in_user_code", root
    assert _lines(root)[0] == ("blocked_rank.py", marker_line(path, marker))
    assert _lines(root)[1] == ("blocked_rank.py", marker_line(path, "backward"))
    evidence = " ".join(root["evidence"])
    assert quoted in evidence, evidence


@pytest.mark.timeout(150)
def test_a_restarted_job_reports_its_last_attempt_and_what_the_earlier_did(
        tmp_path: Path) -> None:
    path = SCRIPTS / "restart_fails.py"
    job = run_job(tmp_path, path, options=("--max-restarts", "1"), hang_timeout=10,
                  timeout=140)
    assert job.returncode == 1, job.stderr[-3000:]
    root = _root(job)
    assert root["kind"] == "rank_crashed" and not root["follow_on"], root
    assert _lines(root)[1] == ("restart_fails.py", marker_line(path, "second_failure"))
    notes = " ".join(job.report["notes"])
    assert "this report is attempt 1's; in attempt 0, " in notes, notes
    assert (f"rank 1 raised OSError: shard-00003 unreadable at restart_fails.py:"
            f"{marker_line(path, 'first_failure')}") in notes, notes
