"""The CI smoke test, end to end: CUDA/NCCL scripts run unmodified with ``--cpu``, short runs
with ``--epoch-steps`` and ``--max-steps``, JUnit and Markdown reports, and the collective
schedule, on real torchrun/gloo jobs. The examples of ``examples/ci/`` get the diagnosis they
document."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from .jobs import EXAMPLES, REPO, SCRIPTS, ddpdoctor, kill_job_processes, marker_line, run_job

CI = EXAMPLES / "ci"
HANG_TIMEOUT = 5
SMOKE = ("--cpu", "--epoch-steps", "2")  # the CI workflow's settings
_BLOCK = re.compile(r"Expected diagnosis:\n((?:[ \t]+\w+:.*\n)+)")


def _ci_examples() -> list:
    cases = []
    for path in sorted(CI.glob("*.py")):
        if path.name.startswith("test_"):
            continue
        blocks = _BLOCK.findall(path.read_text())
        assert len(blocks) == 1, f"{path.name}: one 'Expected diagnosis:' block"
        fields = dict(line.strip().split(":", 1) for line in blocks[0].strip().splitlines())
        expected = {k.strip(): v.strip().split()[0] for k, v in fields.items()}
        cases.append(pytest.param(path, expected, id=path.stem))
    return cases


def _timed_job(tmp_path: Path, script: Path, *args: str, options: tuple = ()):
    started = time.monotonic()
    job = run_job(tmp_path, script, *args, options=options, hang_timeout=HANG_TIMEOUT)
    return job, time.monotonic() - started


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path, expected", _ci_examples())
def test_ci_example_smoke_diagnosis_junit_and_markdown(tmp_path: Path, monkeypatch,
                                                       path: Path, expected: dict) -> None:
    """``ddpdoctor run --cpu --epoch-steps 2 --junit --markdown`` on each CUDA-only example."""
    summary = tmp_path / "step-summary.md"
    summary.write_text("previous step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    junit, md = tmp_path / "junit.xml", tmp_path / "report.md"
    job, elapsed = _timed_job(
        tmp_path, path, "--snapshot-path", str(tmp_path / "snapshot.pt"),
        options=(*SMOKE, "--junit", str(junit), "--markdown", str(md)))
    report = job.report
    assert report is not None, job.stderr[-3000:]
    assert report["verdict"] == expected["verdict"], job.stderr[-3000:]
    text = md.read_text()
    assert summary.read_text() == "previous step\n" + text  # appended, same summary
    suite = ET.parse(junit).getroot()
    case = suite.find("testsuite/testcase")
    assert case.get("name").startswith(str(path))
    if expected["finding"] in ("none", "-"):
        assert job.returncode == 0, job.stderr[-3000:]
        assert not [f for f in report["findings"] if f["severity"] == "error"]
        assert case.find("failure") is None and suite.get("failures") == "0"
        assert text.startswith("## ✅ ddpdoctor: CLEAN")
        # Every rank stopped at the start of its third epoch, together.
        run = job.run()
        assert {t.exit["status"] for t in run.ranks.values()} == {"max_steps"}
        assert {t.exit["epoch_steps"] for t in run.ranks.values()} == {2}
        assert {len(t.collectives) for t in run.ranks.values()} != set()
        assert len({len(t.collectives) for t in run.ranks.values()}) == 1
        print(f"{path.name}: clean smoke run in {elapsed:.1f}s")
        return
    assert job.returncode == int(expected.get("exit", 1)), job.stderr[-3000:]
    root = report["findings"][0]
    assert root["kind"] == expected["finding"], root["summary"]
    assert root["cause"] == expected["cause"]
    assert {int(r) for r in root["ranks"]} == {int(r) for r in expected["ranks"].split(",")}
    sites = {(Path(d["site"]["file"]).name, d["site"]["line"])
             for d in root["ranks"].values() if d.get("site")}
    for marker in expected["lines"].split(","):
        assert (path.name, marker_line(path, marker)) in sites, (marker, sites)
    failure = case.find("failure")
    assert failure is not None and suite.get("failures") == "1"
    assert failure.get("type") == root["kind"]
    assert root["kind"] in failure.get("message") and root["cause"] in failure.get("message")
    assert f"{path.name}:{marker_line(path, 'rank0_barrier')}" in failure.text
    assert text.startswith("## ❌ ddpdoctor: DIVERGED")
    assert f"### Root cause: `{root['kind']}`" in text and f"[{root['cause']}]" in text
    assert elapsed < HANG_TIMEOUT + 40, elapsed
    print(f"{path.name}: diverged smoke run in {elapsed:.1f}s")


@pytest.mark.timeout(150)
def test_barrier_example_under_max_steps_fails_as_a_divergence(tmp_path: Path) -> None:
    """Under --max-steps 2 rank 1 stops at the start of iteration 3 and leaves; rank 0's
    barrier then fails: a divergence (exit 1) with the same cause and the barrier's line."""
    path = CI / "multigpu_torchrun_rank0_barrier.py"
    job, elapsed = _timed_job(tmp_path, path, "--snapshot-path", str(tmp_path / "s.pt"),
                              options=("--cpu", "--max-steps", "2"))
    assert job.returncode == 1, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["kind"] == "missing_collective"
    assert root["cause"] == "rank_conditional_collective"
    assert root["ranks"]["0"]["site"]["line"] == marker_line(path, "rank0_barrier")
    print(f"{path.name} under --max-steps: divergence reported in {elapsed:.1f}s")


@pytest.mark.timeout(150)
def test_snapshot_resume_maps_cuda_map_location_to_the_cpu(tmp_path: Path) -> None:
    """The healthy example resumes from its snapshot: torch.load(map_location="cuda:N")."""
    path = CI / "multigpu_torchrun_style.py"
    snapshot = tmp_path / "snapshot.pt"
    first = run_job(tmp_path / "a", path, "--snapshot-path", str(snapshot),
                    options=("--cpu", "--max-steps", "2"))
    assert first.returncode == 0 and snapshot.exists(), first.stderr[-3000:]
    second = run_job(tmp_path / "b", path, "--snapshot-path", str(snapshot),
                     options=("--cpu", "--max-steps", "2"))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming training from snapshot at epoch 1" in second.stdout + second.stderr
    assert second.report["verdict"] == "clean"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("steps", [3, 5])
def test_max_steps_stops_every_rank_at_the_same_iteration(tmp_path: Path, steps: int) -> None:
    job = run_job(tmp_path, SCRIPTS / "ddp_steps.py", "--steps", "20",
                  options=("--max-steps", str(steps)))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean" and not job.report["findings"]
    run = job.run()
    assert sorted(run.ranks) == [0, 1]
    ends = []
    for trace in run.ranks.values():
        assert trace.exit["status"] == "max_steps" and trace.exit["code"] == 0
        assert trace.exit["steps"] == steps
        colls = list(trace.collectives)
        assert max(c.iteration for c in colls) == steps
        assert all(c.state == "completed" for c in colls)
        ends.append([(c.group, c.seq, c.op, c.label, c.iteration) for c in colls])
    assert ends[0] == ends[1]  # the same collectives, up to the same point
    assert all(r["status"] == "finished" and r["iterations"] == steps
               for r in job.report["ranks"].values())
    assert f"stopped by --max-steps {steps} at the start of iteration {steps + 1}" in job.stderr
    # The script's loop has no DataLoader epoch: the report says what the stop left unrun.
    assert f"stopped at iteration {steps + 1}, before any epoch ended" in job.stderr


def _seen(out: Path) -> dict[int, dict]:
    return {r: json.loads(Path(f"{out}.rank-{r}.json").read_text()) for r in (0, 1)}


@pytest.mark.timeout(120)
def test_epoch_steps_makes_every_pass_short_and_stops_at_the_third_epoch(
        tmp_path: Path) -> None:
    """20 training and 12 evaluation batches an epoch, 5 epochs: under --epoch-steps 3 each
    pass yields 3 batches (len() says so), evaluation runs at each epoch's end, and the job
    stops cleanly at the start of the third epoch."""
    out = tmp_path / "seen"
    job = run_job(tmp_path, SCRIPTS / "epoch_loader.py", "--out", str(out),
                  options=("--epoch-steps", "3"))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean" and not job.report["findings"]
    for seen in _seen(out).values():
        assert seen == {"len_train": 3, "len_val": 3, "train": [3, 3], "val": [3, 3]}
    for trace in job.run().ranks.values():
        assert trace.exit["status"] == "max_steps" and trace.exit["epoch_steps"] == 3
        assert max(c.iteration for c in trace.collectives) == 6
    assert ("ranks 0, 1 were stopped by --epoch-steps 3 at the start of their third epoch "
            "(after iteration 6)") in job.stderr


@pytest.mark.timeout(120)
def test_epoch_steps_keeps_uneven_inputs_uneven(tmp_path: Path) -> None:
    """Rank 1's shard holds one batch more: under --epoch-steps 3 it still trains one batch
    more than rank 0 in the first epoch, so the uneven-input bug at the epoch's end shows."""
    out = tmp_path / "seen"
    job = run_job(tmp_path, SCRIPTS / "epoch_loader.py", "--out", str(out), "--uneven",
                  options=("--epoch-steps", "3"))
    assert job.returncode == 1, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["cause"] == "uneven_inputs", root["summary"]
    seen = _seen(out)
    assert seen[0]["train"][0] == 3 and seen[1]["train"][0] == 4
    assert root["ranks"]["1"]["site"]["line"] == marker_line(SCRIPTS / "epoch_loader.py",
                                                             "backward")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name, lines", [
    ("rank0_only_barrier.py", {0: "rank0_barrier", 1: "train_backward"}),
    ("seed000_eval_nograd.py", {0: "eval_forward", 1: "train_forward"}),
])
def test_smoke_settings_fail_ci_on_epoch_end_bugs(tmp_path: Path, name: str,
                                                  lines: dict[int, str]) -> None:
    """The CI workflow's settings (--cpu --epoch-steps 2, a JUnit file) on the bundled bugs
    that live at an epoch's end: the step fails with each rank's line in the JUnit failure.
    (``--max-steps 2`` stopped both before their bug: a false green.)"""
    path = EXAMPLES / name
    junit = tmp_path / "junit.xml"
    job = run_job(tmp_path, path, options=(*SMOKE, "--junit", str(junit)))
    assert job.returncode in (1, 3), job.stderr[-3000:]
    root = job.report["findings"][0]
    for rank, marker in lines.items():
        assert root["ranks"][str(rank)]["site"]["line"] == marker_line(path, marker)
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None
    for marker in lines.values():
        assert f"{name}:{marker_line(path, marker)}" in failure.text


@pytest.mark.timeout(150)
@pytest.mark.parametrize("max_steps", [None, 2], ids=["to-the-end", "max-steps"])
def test_cpu_mode_runs_a_cuda_mp_spawn_script(tmp_path: Path, max_steps) -> None:
    """device_count(), set_device, torch.cuda.device, device_id, .cuda(), factories with a
    CUDA device, DDP(device_ids, output_device), pin_memory, synchronize, dict map_location."""
    out = tmp_path / "out.json"
    options = ("--cpu", "--launcher", "python")
    if max_steps:
        options += ("--max-steps", str(max_steps))
    job = run_job(tmp_path, SCRIPTS / "cuda_spawn.py", "--out", str(out), options=options)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    run = job.run()
    assert sorted(run.ranks) == [0, 1]
    assert all(t.process["backend"] == "gloo" for t in run.ranks.values())
    if max_steps:
        assert {t.exit["status"] for t in run.ranks.values()} == {"max_steps"}
        assert not out.exists()  # the script's end never runs
        return
    result = json.loads(out.read_text())
    assert result == {"world_size": 2, "count": 2.0, "steps": 3, "cuda_available": True,
                      "device": "cpu", "backend": "gloo"}
    ddp = run.ranks[0].ddp[0]
    assert ddp["device_ids"] == []


@pytest.mark.timeout(150)
def test_cuda_script_without_cpu_mode_fails_clearly(tmp_path: Path) -> None:
    """The same script without --cpu: the assertion a GPU script makes, reported as a crash."""
    job = run_job(tmp_path, CI / "multigpu_torchrun_style.py", "--snapshot-path",
                  str(tmp_path / "s.pt"))
    assert job.returncode == 1
    root = job.report["findings"][0]
    assert root["kind"] == "rank_crashed" and "this script needs GPUs" in root["summary"]
    assert root["cause"] == "no_gpu"


@pytest.mark.timeout(240)
def test_schedule_catches_an_added_all_reduce_and_a_changed_bucket_layout(
        tmp_path: Path) -> None:
    script = SCRIPTS / "schedule_job.py"
    schedule = tmp_path / "schedule.yaml"
    base = run_job(tmp_path / "base", script, options=("--max-steps", "3"))
    assert base.returncode == 0, base.stderr[-3000:]
    saved = ddpdoctor("schedule", "save", str(base.logdir), str(schedule))
    assert saved.returncode == 0, saved.stderr
    assert "(init and iteration 2) of 2 ranks" in saved.stdout
    # An unchanged run passes, checked during the run.
    same = run_job(tmp_path / "same", script,
                   options=("--max-steps", "3", "--expect-schedule", str(schedule)))
    assert same.returncode == 0, same.stderr[-3000:]
    assert "the collective schedule matches" in same.stderr
    # An all_reduce added to the loop fails the run (exit 1) with a readable difference.
    junit = tmp_path / "junit.xml"
    extra = run_job(tmp_path / "extra", script, "--extra-allreduce",
                    options=("--max-steps", "3", "--expect-schedule", str(schedule),
                             "--junit", str(junit)))
    assert extra.returncode == 1, extra.stderr[-3000:]
    assert extra.report["verdict"] == "clean"  # the job itself is healthy
    assert "the collective schedule differs" in extra.stderr
    line = f"schedule_job.py:{_line_of(script, 'dist.all_reduce(metric)')}"
    assert re.search(r"iteration 2 #\d+: added all_reduce user float32\[\]  \(" + line,
                     extra.stderr), extra.stderr[-2000:]
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("type") == "schedule_changed"
    # A changed bucket layout, checked afterwards with `schedule compare`.
    wide = run_job(tmp_path / "wide", script, "--hidden", "48", options=("--max-steps", "3"))
    assert wide.returncode == 0, wide.stderr[-3000:]
    compared = ddpdoctor("schedule", "compare", str(schedule), str(wide.logdir))
    assert compared.returncode == 1, compared.stdout + compared.stderr
    assert re.search(r"reshaped all_reduce ddp\.bucket float32\[\d+\] -> float32\[\d+\]",
                     compared.stdout), compared.stdout
    assert ddpdoctor("schedule", "compare", str(schedule), str(same.logdir)).returncode == 0
    bad = ddpdoctor("schedule", "compare", str(tmp_path / "nope.yaml"), str(same.logdir))
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.timeout(300)
def test_the_copyable_pytest_example_passes_and_fails_readably(tmp_path: Path) -> None:
    """examples/ci/test_ddp_smoke.py, run by pytest as a user's CI would."""
    results = {}
    for name in ("multigpu_torchrun_style.py", "multigpu_torchrun_rank0_barrier.py"):
        env = {**os.environ, "DDP_SMOKE_SCRIPT": str(CI / name),
               "DDP_SMOKE_ARGS": f"--snapshot-path {tmp_path / name}.pt",
               "DDP_SMOKE_OPTIONS": f"--hang-timeout {HANG_TIMEOUT}"}
        base = tmp_path / name
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "--basetemp", str(base), str(CI / "test_ddp_smoke.py")],
                capture_output=True, text=True, timeout=240, cwd=REPO, env=env,
                stdin=subprocess.DEVNULL)
        finally:
            leftovers = [pid for logs in base.glob("**/ddpdoctor-logs")
                         for pid in kill_job_processes(logs)]
        assert not leftovers
        results[name] = proc
    healthy, barrier = results.values()
    assert healthy.returncode == 0, healthy.stdout[-3000:]
    assert barrier.returncode == 1, barrier.stdout[-3000:]
    assert "ddpdoctor exit code 3" in barrier.stdout  # the barrier meets an all-reduce
    assert "Root cause: `op_mismatch`" in barrier.stdout
    assert "rank_conditional_collective" in barrier.stdout


@pytest.mark.timeout(120)
def test_a_cuda_use_cpu_mode_does_not_map_is_named_as_its_limit(tmp_path: Path) -> None:
    script = SCRIPTS / "cuda_stream.py"
    job = run_job(tmp_path, script, options=("--cpu",))
    assert job.returncode != 0
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"]) == ("rank_crashed", "cpu_mode_unmapped"), root
    assert f"cuda_stream.py:{marker_line(script, 'unmapped')}" in job.stderr
    assert all(t.cpu_mode for t in job.run().ranks.values())


@pytest.mark.timeout(120)
def test_a_bad_usage_stop_in_ci_mode_still_writes_the_failed_reports(tmp_path: Path) -> None:
    """An mp.spawn script run without --launcher python: exit 2, and the JUnit and Markdown
    files say why instead of being missing."""
    junit, md = tmp_path / "junit.xml", tmp_path / "summary.md"
    proc = ddpdoctor("run", "--logdir", str(tmp_path / "logs"), "--junit", str(junit),
                     "--markdown", str(md), "--hang-timeout", "10",
                     str(EXAMPLES / "seed001_uneven.py"), "--case", "1", timeout=100)
    kill_job_processes(tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-3000:]
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and "--launcher python" in failure.get("message", "")
    assert "--launcher python" in md.read_text()


_MACHINERY_NOISE = re.compile(r"Traceback|recvValue|TCPStore|frame #\d|Warning|\[W\d{4}|"
                              r"\[E\d{4}|Error|ddpdoctor: (could not|warning)")
SILENT_RUNS = [
    pytest.param(SCRIPTS / "tutorial_rounds.py", (), ("--launcher", "python"),
                 id="tutorial-two-spawn-rounds"),
    pytest.param(EXAMPLES / "seed001_uneven.py", ("--case", "6"), ("--launcher", "python"),
                 id="spawn-join"),
    pytest.param(EXAMPLES / "seed002_healthy.py", (), (), id="torchrun"),
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("script, args, options", SILENT_RUNS)
def test_a_clean_run_in_ci_mode_prints_nothing_of_ddpdoctors_machinery(
        tmp_path: Path, script: Path, args: tuple, options: tuple) -> None:
    """Only the script's own output and ddpdoctor's lines: no stack, warning or store error
    from ddpdoctor's threads and handshakes (the --max-steps handshake printed a 40-frame
    C++ stack when rank 0, which hosted the store, left first)."""
    job = run_job(tmp_path, script, *args, options=("--cpu", "--max-steps", "2", *options),
                  timeout=140, hang_timeout=20)
    assert job.returncode == 0 and job.report["verdict"] == "clean", job.stderr[-3000:]
    noise = [line for line in (job.stdout + job.stderr).splitlines()
             if _MACHINERY_NOISE.search(line)]
    assert not noise, noise[:10]
