"""Launch lines pasted from pytorch/examples after ``ddpdoctor run``, unchanged: torchrun reads
its options itself; the job runs on gloo here (``--cpu``) and stops after one DDP step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.launch.command import free_port

from .jobs import EXAMPLES, ddpdoctor, kill_job_processes, run_job

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
