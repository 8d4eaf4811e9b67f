"""``ddpdoctor run -- <launch command>``: jobs started by the user's own launcher — a shell
wrapper around torchrun, a Slurm-shaped launch (processes told their place by SLURM_*
variables), Hugging Face Accelerate's ``accelerate launch``, a Lightning Trainer that starts
its ranks itself, the ``deepspeed`` launcher — are recorded, watched and diagnosed as under
torchrun, healthy and diverged, at the user's line."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from .jobs import SCRIPTS, marker_line, run_job

ANY = SCRIPTS / "any_launcher.py"
ACCELERATE = SCRIPTS / "accelerate_job.py"
LIGHTNING = SCRIPTS / "lightning_job.py"
DEEPSPEED = SCRIPTS / "deepspeed_job.py"


def _command(tmp_path: Path, *command: str):
    return run_job(tmp_path, "--", *command, hang_timeout=10)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("wrapper", ["launch_torchrun.sh", "launch_slurm.sh"])
@pytest.mark.parametrize("uneven", [False, True], ids=["healthy", "uneven"])
def test_a_wrapper_script_launch_is_diagnosed(tmp_path: Path, wrapper: str, uneven: bool) -> None:
    job = _command(tmp_path, "bash", str(SCRIPTS / wrapper), *(["--uneven"] if uneven else []))
    assert job.report is not None, job.stderr[-3000:]
    assert len(job.report["ranks"]) == 2
    if not uneven:
        assert job.returncode == 0, job.stderr[-3000:]
        assert job.report["verdict"] == "clean"
        assert "rank 0 of 2 done" in job.stdout and "rank 1 of 2 done" in job.stdout
        return
    root = job.report["findings"][0]
    assert (job.report["verdict"], root["kind"], root["cause"]) == \
        ("diverged", "missing_collective", "uneven_inputs"), root["summary"]
    site = root["ranks"]["1"]["site"]
    assert (Path(site["file"]).name, site["line"]) == ("any_launcher.py",
                                                       marker_line(ANY, "backward"))
    if wrapper == "launch_torchrun.sh":  # the agent inside the wrapper recorded exit codes
        assert list(job.logdir.glob("exits-*.json"))


ACCELERATE_LAUNCH = ("accelerate", "launch", "--multi_gpu", "--num_processes", "2",
                     "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no")


@pytest.mark.timeout(150)
@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None or
                    shutil.which("accelerate") is None,
                    reason="accelerate is in the test extras")
@pytest.mark.parametrize("diverge", [False, True], ids=["healthy", "rank0-gather"])
def test_accelerate_launch_is_diagnosed_at_the_users_line(tmp_path: Path, diverge: bool) -> None:
    job = _command(tmp_path, *ACCELERATE_LAUNCH, str(ACCELERATE),
                   *(["--rank0-gather"] if diverge else []))
    assert job.report is not None, job.stderr[-3000:]
    if not diverge:
        assert job.returncode == 0, job.stderr[-3000:]
        assert job.report["verdict"] == "clean"
        return
    assert "Traceback" not in job.stderr  # the agent inside accelerate was stopped outright
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"]) == ("op_mismatch", "rank_conditional_collective")
    # accelerator.gather() reaches all_gather six frames deep in Accelerate: the line shown
    # is the user's call, not the library's.
    site = root["ranks"]["0"]["site"]
    assert (Path(site["file"]).name, site["line"]) == ("accelerate_job.py",
                                                       marker_line(ACCELERATE, "gather"))
    assert "Accelerate: gather() (its all_gather)" in root["summary"], root["summary"]


@pytest.mark.timeout(150)
@pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                    reason="pytorch-lightning is in the test extras")
@pytest.mark.parametrize("diverge", [False, True], ids=["healthy", "rank0-callback"])
def test_a_lightning_trainer_is_diagnosed_at_the_users_line(tmp_path: Path,
                                                            diverge: bool) -> None:
    job = _command(tmp_path, sys.executable, str(LIGHTNING),
                   *(["--rank0-callback"] if diverge else []))
    assert job.report is not None, job.stderr[-3000:]
    assert len(job.report["ranks"]) == 2  # the rank Lightning started itself is recorded
    if not diverge:
        assert job.returncode == 0, job.stderr[-3000:]
        assert job.report["verdict"] == "clean"
        assert "trained" in job.stdout
        return
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"]) == ("op_mismatch", "rank_conditional_collective")
    # The callback's line, thirty frames of Lightning below the user's trainer.fit().
    site = root["ranks"]["0"]["site"]
    assert (Path(site["file"]).name, site["line"]) == ("lightning_job.py",
                                                       marker_line(LIGHTNING, "callback"))
    assert "Lightning: reduce()" in root["summary"], root["summary"]
    assert Path(root["context"]["ranks"]["1"]["site"]["file"]).name == "lightning_job.py"


@pytest.mark.timeout(240)
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None or
                    shutil.which("deepspeed") is None,
                    reason="deepspeed is not installed (it compiles ops: not in the test extras)")
@pytest.mark.parametrize("uneven", [False, True], ids=["healthy", "uneven"])
def test_the_deepspeed_launcher_is_diagnosed(tmp_path: Path, uneven: bool) -> None:
    job = _command(tmp_path, "deepspeed", "--num_gpus", "2", str(DEEPSPEED),
                   *(["--uneven"] if uneven else []))
    assert job.report is not None, job.stderr[-3000:]
    assert len(job.report["ranks"]) == 2
    if not uneven:
        assert job.returncode == 0, job.stderr[-3000:]
        assert job.report["verdict"] == "clean"
        return
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"]) == ("missing_collective", "uneven_inputs"), root
    site = root["ranks"]["1"]["site"]  # the user's engine.backward(), not DeepSpeed's
    assert (Path(site["file"]).name, site["line"]) == ("deepspeed_job.py",
                                                       marker_line(DEEPSPEED, "backward"))


@pytest.mark.timeout(150)
@pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None or
                    shutil.which("accelerate") is None,
                    reason="Lightning and Accelerate are in the test extras")
@pytest.mark.parametrize("framework", ["lightning", "accelerate"])
def test_epoch_steps_makes_a_frameworks_epochs_short(tmp_path: Path, framework: str) -> None:
    """--epoch-steps 2 on the frameworks' own loaders (Lightning's loops stop at len(), never
    asking for more; Accelerate's prepared loaders are DataLoader subclasses): every training
    and evaluation pass is 2 batches, and the job stops at its third epoch, not its fifth."""
    out = tmp_path / "seen"
    script = SCRIPTS / f"{framework}_epochs.py"
    command = ((sys.executable, str(script)) if framework == "lightning" else
               (*ACCELERATE_LAUNCH, str(script)))
    job = run_job(tmp_path, "--", *command, str(out), hang_timeout=10,
                  options=("--epoch-steps", "2"))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.rank-{rank}.json").read_text())
        assert seen["train"] == [2, 2] and seen["val"] == [2, 2], seen
    assert {t.exit.get("epoch_steps") for t in job.run().ranks.values()} == {2}


@pytest.mark.timeout(60)
def test_a_launch_command_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    from .jobs import ddpdoctor

    proc = ddpdoctor("run", "--logdir", str(tmp_path / "logs"), "--", "no-such-launcher",
                     "train.py")
    assert proc.returncode == 2
    assert "command not found: no-such-launcher" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(150)
@pytest.mark.skipif(importlib.util.find_spec("pytorch_lightning") is None,
                    reason="pytorch-lightning is in the test extras")
@pytest.mark.parametrize("when", ["epoch", "step"])
def test_a_lightning_metric_logged_on_rank_0_alone_names_the_self_log_line(
        tmp_path: Path, when: str) -> None:
    # self.log("val_loss", ..., sync_dist=True) under `if self.trainer.is_global_zero:` in
    # validation_step: Lightning all-reduces it at the epoch's end (on_step: at once), deep in
    # its loops below trainer.fit(); the line to change is the self.log call.
    on_step = ["--on-step"] if when == "step" else []
    healthy = _command(tmp_path / "healthy", sys.executable, str(LIGHTNING), "--log", *on_step)
    assert healthy.report is not None and healthy.returncode == 0, healthy.stderr[-3000:]
    assert healthy.report["verdict"] == "clean"
    job = _command(tmp_path / "broken", sys.executable, str(LIGHTNING), "--rank0-log", *on_step)
    assert job.report is not None, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["cause"] == "rank_conditional_collective", root
    detail = root["ranks"]["0"]
    assert detail["label"] == f"lightning.{when}_sync"
    assert (Path(detail["site"]["file"]).name, detail["site"]["line"]) == (
        "lightning_job.py", marker_line(LIGHTNING, "log"))
    assert "metric 'val_loss'" in root["summary"]
    assert any("rank_zero_only=True" in e for e in root["evidence"]), root["evidence"]
    # The rank that never logged ran as many forwards (its validation ones issue nothing).
    assert "rank 1 finished its script after iteration 8" in root["summary"]
