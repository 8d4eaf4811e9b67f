"""Faults during ``ddpdoctor run`` never cost the evidence, and ddpdoctor does no harm to the
job."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.trace.reader import load_run

from .jobs import REPO, SCRIPTS, ddpdoctor, kill_job_processes, marker_line, run_job


@pytest.mark.timeout(120)
def test_segfault_is_named_with_the_signal_and_faulthandler_output_kept(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "rank_dies.py", "--how", "segfault")
    assert job.returncode == 1
    root = job.report["findings"][0]
    assert root["kind"] == "rank_crashed"
    assert "SIGSEGV" in root["summary"]
    pid = job.run().ranks[1].process["pid"]
    fault = (job.logdir / f"fault-{pid}.txt").read_text()
    assert "Segmentation fault" in fault
    assert f"rank_dies.py\", line {marker_line(SCRIPTS / 'rank_dies.py', 'segfault')}" in fault


@pytest.mark.timeout(120)
def test_exit_code_stdout_stderr_and_user_sitecustomize_pass_through(tmp_path: Path) -> None:
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    env = {"PYTHONPATH": os.pathsep.join([str(user_site), str(REPO / "src")])}
    logdir = tmp_path / "logs"
    proc = ddpdoctor("run", "--launcher", "python", "--logdir", str(logdir),
                     str(SCRIPTS / "passthrough.py"), env=env)
    kill_job_processes(logdir)
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert "to stdout: sum 2.0" in proc.stdout
    assert "sitecustomize marker: yes" in proc.stdout
    assert "to stderr: marker" in proc.stderr
    trace = load_run([logdir]).ranks[0]
    assert len(trace.collectives) == 1 and trace.exit["code"] == 7


@pytest.mark.timeout(60)
def test_unwritable_log_folder_is_one_clear_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root ignores permissions: use a path under a file
        target = tmp_path / "a_file" / "logs"
        (tmp_path / "a_file").write_text("")
    else:
        target = locked / "logs"
    proc = ddpdoctor("run", "--logdir", str(target), str(SCRIPTS / "long_loop.py"))
    assert proc.returncode == 2
    assert "cannot use log folder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timeout(120)
def test_full_disk_stops_recording_not_the_job_and_the_report_says_incomplete(
        tmp_path: Path) -> None:
    logdir = tmp_path / "logs"
    limit = 64 * 1024

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    # Outside CI mode (as a user runs it; in CI mode an incomplete run exits 4).
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(logdir),
             "--json", str(tmp_path / "report.json"), "--hang-timeout", "10",
             str(SCRIPTS / "long_loop.py")],
            capture_output=True, text=True, timeout=100, cwd=REPO, preexec_fn=small_files,
            env=env)
    finally:
        leftovers = kill_job_processes(logdir)
    assert not leftovers
    assert "recording stopped, the job goes on" in proc.stderr
    assert "Traceback" not in proc.stderr
    # The job succeeded: its traces are cut, which is no divergence.
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "incomplete", report["findings"]
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    assert any("its trace is cut" in note for note in report["notes"])
    run = load_run([logdir])
    assert all(t.collectives and t.cut for t in run.ranks.values())
    assert all(Path(t.path).stat().st_size <= limit for t in run.ranks.values())


@pytest.mark.timeout(120)
def test_traces_are_private_and_hold_only_allow_listed_environment(tmp_path: Path) -> None:
    env = {"SECRET_TOKEN": "hunter2-do-not-record"}
    logdir = tmp_path / "logs"
    proc = ddpdoctor("run", "--logdir", str(logdir), str(SCRIPTS / "ddp_steps.py"),
                     "--steps", "2", env=env)
    kill_job_processes(logdir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    for trace in logdir.glob("rank-*.jsonl"):
        assert stat.S_IMODE(trace.stat().st_mode) == 0o600
        assert "hunter2" not in trace.read_text()
    env_keys = set(load_run([logdir]).ranks[0].process["env"])
    assert env_keys <= {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                        "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                        "TORCHELASTIC_RUN_ID", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}


@pytest.mark.timeout(120)
def test_a_daemon_a_rank_detached_outlives_the_job_as_under_torchrun(tmp_path: Path) -> None:
    """A process a rank detached into a session of its own is the user's (torchrun leaves it
    alone); a plain child the rank never waited for is the job's, and ends with it."""
    pids = tmp_path / "pids"
    pids.mkdir()
    logdir = tmp_path / "logs"
    daemon = None
    try:
        proc = ddpdoctor("run", "--logdir", str(logdir), "--grace", "2", "--hang-timeout", "20",
                         str(SCRIPTS / "detached_daemon.py"), str(pids))
        assert proc.returncode == 0, proc.stderr[-3000:]
        daemon, child = (int((pids / name).read_text()) for name in ("daemon", "child"))
        assert os.getsid(daemon) not in (os.getsid(0), daemon)  # (a session of its own)
        os.kill(daemon, 0)  # still running: left alone
        with pytest.raises(ProcessLookupError):  # the plain child ended with the job
            for _ in range(50):
                os.kill(child, 0)
                if b") Z" in Path(f"/proc/{child}/stat").read_bytes():
                    raise ProcessLookupError
                __import__("time").sleep(0.1)
    finally:
        if daemon is not None:
            try:
                os.kill(daemon, 9)
            except ProcessLookupError:
                pass
        leftovers = [p for p in kill_job_processes(logdir) if p != daemon]
    assert not leftovers
