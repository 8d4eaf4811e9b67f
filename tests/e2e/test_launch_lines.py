"""Launch lines pasted from pytorch/examples after ``ddpdoctor run``, unchanged: torchrun reads
its options itself; the job runs on gloo here (``--cpu``) and stops after one DDP step."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ddpdoctor.launch.command import free_port
from ddpdoctor.trace.reader import load_run

from .jobs import EXAMPLES, SCRIPTS, ddpdoctor, kill_job_processes, run_job

SCRIPT = EXAMPLES / "ci" / "multigpu_torchrun_style.py"

LINES = {
    # distributed/ddp-tutorial-series/run_example.sh
    "ddp-tutorial-series": "--nnodes=1 --nproc_per_node=2 --rdzv_id=101 "
                           "--rdzv_endpoint=localhost:{port}",
    # distributed/minGPT-ddp/run_example.sh
    "minGPT-ddp": "--standalone --nproc_per_node=2",
    # the DDP tutorial series' page for multigpu_torchrun.py: one rank per GPU (under --cpu,
    # CPU mode's 2 ranks; torchrun itself stopped before with "Cuda is not available")
    "ddp-tutorial-gpu": "--standalone --nproc_per_node=gpu",
    "tee-and-filters": "--nproc-per-node 2 --tee 3 --local-ranks-filter 0 --log-dir {tmp}/tl "
                       "--monitor-interval 0.2 --local-addr 127.0.0.1 --rdzv-conf timeout=60",
    "no-python": "--nproc_per_node=2 --no-python python",
    "run-path": "--nproc-per-node=2 --run-path",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(LINES))
def test_a_pasted_launch_line_runs_unchanged(tmp_path: Path, name: str) -> None:
    line = LINES[name].format(port=free_port(), tmp=tmp_path).split()
    # --run-path starts the workers as multiprocessing children of torchrun's agent, which
    # waits for their return values: a rank stopped by --max-steps hands it over (once, the
    # agent waited forever).
    job = run_job(tmp_path, SCRIPT, "--snapshot-path", str(tmp_path / "s.pt"),
                  options=("--cpu", "--max-steps", "1", *line))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    assert sorted(job.report["ranks"]) == ["0", "1"]
    assert any("--max-steps 1" in note for note in job.report["notes"])
    if name == "tee-and-filters":
        assert (tmp_path / "tl").is_dir()  # torchrun's own --log-dir, not ddpdoctor's


@pytest.mark.timeout(120)
def test_a_script_that_spawns_its_own_workers_under_torchrun_is_refused_with_the_fix(
        tmp_path: Path) -> None:
    # The default launcher is torchrun; seed 001 starts its own workers with mp.spawn. Each
    # torchrun rank would start a whole job of its own on the same port (pytorch/examples'
    # distributed/rpc/ddp_rpc/main.py hung that way): ddpdoctor says how to run it instead of
    # diagnosing the hang or crash it caused itself.
    script = EXAMPLES / "seed001_uneven.py"
    job = run_job(tmp_path, script, "--case", "1")
    assert job.returncode == 2, job.stderr[-3000:]
    spawn_line = next(i for i, text in enumerate(script.read_text().splitlines(), 1)
                      if text.lstrip().startswith("mp.spawn("))
    assert f"(seed001_uneven.py:{spawn_line})" in job.stderr
    assert f"ddpdoctor run --launcher python {script}" in job.stderr
    assert job.report is None  # nothing was diagnosed
    # One line says it: the ranks print no traceback of their own for it.
    assert "Traceback" not in job.stderr and job.stderr.count("--launcher python") == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_started_with_multiprocessing_process_under_torchrun_are_refused_with_the_fix(
        tmp_path: Path, start_method: str) -> None:
    # The same mistake with multiprocessing.Process workers (PyTorch's "Writing Distributed
    # Applications" tutorial): the torchrun ranks wait in join() while their workers try to
    # form jobs of their own. ddpdoctor waited for ever (the ranks were busy in user code) and
    # a finished forked worker's trace was written over its parent's.
    script = SCRIPTS / "process_workers.py"
    job = run_job(tmp_path, script, "--start-method", start_method, "--port", str(free_port()))
    assert job.returncode == 2, job.stderr[-3000:]
    init_line = next(i for i, text in enumerate(script.read_text().splitlines(), 1)
                     if "init_process_group(" in text)
    assert f"(process_workers.py:{init_line})" in job.stderr
    assert f"ddpdoctor run --launcher python {script}" in job.stderr
    assert job.report is None  # nothing was diagnosed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("bug", [False, True], ids=["healthy", "rank0-barrier"])
def test_workers_started_with_multiprocessing_process_are_recorded_to_the_end(
        tmp_path: Path, start_method: str, bug: bool) -> None:
    # Run as its own launcher, each worker is a rank with its own trace. A forked worker used
    # to inherit a closed recorder: its trace had neither completions nor an exit record, and
    # a healthy job was reported with both ranks hung in their first all-reduce.
    script = SCRIPTS / "process_workers.py"
    job = run_job(tmp_path, script, "--start-method", start_method, "--port", str(free_port()),
                  *(["--rank0-barrier"] if bug else []), options=("--launcher", "python"))
    assert job.report is not None, job.stderr[-3000:]
    statuses = {rank: info["status"] for rank, info in job.report["ranks"].items()}
    for trace in sorted(job.logdir.glob("rank-*.jsonl")):
        kinds = [json.loads(line)["kind"] for line in trace.read_text().splitlines()]
        assert kinds.count("collective") == 5 + (bug and trace.name == "rank-0.jsonl")
        assert "done" in kinds and kinds[-1] == "exit", (trace.name, kinds)
    if not bug:
        assert job.returncode == 0, job.stderr[-3000:]
        assert job.report["verdict"] == "clean" and not job.report["findings"]
        assert statuses == {"0": "finished", "1": "finished"}
        return
    # Rank 1's exit usually fails rank 0's barrier at once (exit 1); if gloo does not notice,
    # the hang is caught (exit 3). The diagnosis is the same.
    assert job.returncode in (1, 3), job.stderr[-3000:]
    assert job.report["verdict"] == "diverged"
    assert statuses["1"] == "finished"
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"]) == ("missing_collective",
                                             "rank_conditional_collective"), root
    assert "rank 0 waits in user barrier()" in root["summary"]
    assert "rank 1 finished its script after 5 collectives" in root["summary"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("child_ends", ["exit", "raise"])
def test_a_child_a_rank_forks_writes_nothing_into_the_rank_s_trace(tmp_path: Path,
                                                                    child_ends: str) -> None:
    # The child of os.fork() has the rank's environment; at its exit it opened "its" trace,
    # which is the rank's file, and wrote its own records after the rank's reserved bytes
    # (the script checks the file once the child has ended: the rank trims it at its close).
    job = run_job(tmp_path, SCRIPTS / "fork_child.py", *([child_ends] if child_ends == "raise"
                                                          else []))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean" and not job.report["notes"], job.report
    for trace in sorted(job.logdir.glob("rank-*.jsonl")):
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        kinds = [r["kind"] for r in records]
        assert kinds.count("collective") == 6 and kinds.count("header") == 1, kinds
        assert kinds[-1] == "exit" and "exception" not in kinds, kinds
        assert {r["pid"] for r in records if r["kind"] == "process_start"} == \
            {records[1]["pid"]}


@pytest.mark.timeout(120)
def test_dataloader_workers_forked_by_the_ranks_write_no_trace(tmp_path: Path) -> None:
    # A forked child starts afresh (Recorder.after_fork): a DataLoader worker must still
    # write nothing, into its rank's trace or a trace of its own.
    job = run_job(tmp_path, SCRIPTS / "dataloader_workers.py")
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean" and not job.report["notes"], job.report
    traces = sorted(job.logdir.glob("rank-*.jsonl"))
    assert [t.name for t in traces] == ["rank-0.jsonl", "rank-1.jsonl"]
    for trace in traces:
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        assert len({r["pid"] for r in records if r["kind"] == "process_start"}) == 1
        assert [r["kind"] for r in records].count("header") == 1
    for trace in load_run([job.logdir]).ranks.values():
        assert sum(c.label == "ddp.bucket" for c in trace.collectives) == 4  # 4 steps


@pytest.mark.timeout(120)
def test_torchrun_stopping_before_any_rank_is_not_blamed_on_the_script(tmp_path: Path) -> None:
    # torchrun accepts the option and stops when it sets the job up, before any worker runs:
    # the report said "the script never called init_process_group".
    job = run_job(tmp_path, SCRIPT, "--snapshot-path", str(tmp_path / "s.pt"),
                  options=("--cpu", "--rdzv-backend=no-such-backend", "--nproc-per-node=2"))
    assert job.returncode == 1, job.stderr[-3000:]
    assert job.report["verdict"] == "untested"
    assert job.report["notes"] == ["torchrun started no rank: it stopped with exit code 1 "
                                   "before running the script (its own error is printed above)"]
    assert "no-such-backend" in job.stderr  # torchrun's own error, shown as it printed it


@pytest.mark.timeout(120)
def test_torchrun_s_own_log_lines_keep_their_prefix(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun warns about OMP_NUM_THREADS when it is unset; its lines read as torchrun prints
    # them ("W1129 04:32:17.599000 14593 .../torch/distributed/run.py:874] ..."), not bare.
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    job = run_job(tmp_path, EXAMPLES / "seed002_healthy.py", options=("--nproc-per-node", "2"))
    assert job.returncode == 0, job.stderr[-3000:]
    warned = [line for line in job.stderr.splitlines() if "OMP_NUM_THREADS" in line]
    assert warned and all(re.match(r"W\d{4} [\d:.]+ +\d+ .*run\.py:\d+\] ", line)
                          for line in warned), warned


@pytest.mark.timeout(120)
@pytest.mark.parametrize("body, code, note", [
    ("import no_such_module_for_ddpdoctor\n", 1,
     "the script stopped (exit code 1) before it called init_process_group: no rank was "
     "recorded (its error is printed above)"),
    ("print('no distributed work here')\n", 4,  # CI mode (--cpu): nothing tested fails
     "no rank trace was written: the script never called init_process_group"),
])
def test_a_script_that_never_became_a_rank_is_told_apart(tmp_path: Path, body: str, code: int,
                                                          note: str) -> None:
    # pytorch/examples' imagenet/main.py (its own launcher: mp.spawn) without torchvision
    # installed failed at its imports; the report only said the script never called
    # init_process_group. (Under torchrun each worker is a rank from its start: its
    # exception is recorded and reported as a crash.)
    script = tmp_path / "no_rank.py"
    script.write_text(body)
    job = run_job(tmp_path, script, options=("--cpu", "--launcher", "python"))
    assert job.returncode == code, job.stderr[-3000:]
    assert job.report["verdict"] == "untested"
    assert job.report["notes"] == [note]


@pytest.mark.timeout(120)
def test_one_visible_gpu_runs_one_rank_and_says_nothing_was_compared(tmp_path: Path) -> None:
    # On a machine with one GPU ddpdoctor's default, one rank per visible GPU, ran the examples
    # as one rank: the report said CLEAN ("every rank issued the same collectives") of a job
    # in which no rank could diverge from another.
    report = tmp_path / "r.json"
    proc = ddpdoctor("run", "--logdir", str(tmp_path / "logs"), "--json", str(report),
                     "--hang-timeout", "5", str(EXAMPLES / "rank0_only_barrier.py"),
                     env={"CUDA_VISIBLE_DEVICES": "0", "CI": "0"})
    assert not kill_job_processes(tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "one GPU is visible, so the job runs one rank" in proc.stderr
    assert "NOTHING WAS TESTED - no two ranks' collectives could be compared" in proc.stderr
    result = json.loads(report.read_text())
    assert result["verdict"] == "untested" and result["world_size"] == 1
    assert any("the job ran one rank" in note for note in result["notes"])
