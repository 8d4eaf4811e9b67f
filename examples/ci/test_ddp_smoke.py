"""A DDP smoke test for CI runners without GPUs: copy this file into your project's tests.

It runs your training script - written for CUDA/NCCL, unmodified - on the CPU, two ranks on
gloo, every collective recorded, with every epoch cut to two batches per DataLoader pass, so
that each epoch's end (evaluation, checkpoint, logging) and the next epoch's start run within
seconds; the job stops at the start of its third epoch::

    ddpdoctor run --cpu --epoch-steps 2 --junit ... --markdown ... train.py ARGS

and fails with ddpdoctor's diagnosis (the ranks that diverged, each one's source line, the
cause and the fix) when the job crashes, hangs or its ranks stop issuing the same
collectives. ``pytest --junitxml`` users get the diagnosis in the failure; ddpdoctor's own
JUnit file (``ddpdoctor-junit.xml`` in the test's temporary folder) and Markdown summary
(appended to ``$GITHUB_STEP_SUMMARY`` on GitHub Actions) are written as well.

Settings (environment variables, so that the file needs no editing):
    DDP_SMOKE_SCRIPT     the training script (default: train.py)
    DDP_SMOKE_ARGS       its arguments (default: none)
    DDP_SMOKE_EPOCH_STEPS  batches per DataLoader pass (default: 2)
    DDP_SMOKE_OPTIONS    more ddpdoctor run options, e.g. "--nproc-per-node 4 --hang-timeout 60"
    DDP_SMOKE_SCHEDULE   a schedule file (ddpdoctor schedule save) the run must match
"""
import os
import shlex
import subprocess
import sys
from pathlib import Path

SCRIPT = os.environ.get("DDP_SMOKE_SCRIPT", "train.py")
ARGS = shlex.split(os.environ.get("DDP_SMOKE_ARGS", ""))
EPOCH_STEPS = os.environ.get("DDP_SMOKE_EPOCH_STEPS", "2")
OPTIONS = shlex.split(os.environ.get("DDP_SMOKE_OPTIONS", "--hang-timeout 30"))
SCHEDULE = os.environ.get("DDP_SMOKE_SCHEDULE")


def test_ddp_training_smoke(tmp_path: Path) -> None:
    junit, summary = tmp_path / "ddpdoctor-junit.xml", tmp_path / "ddpdoctor.md"
    cmd = [sys.executable, "-m", "ddpdoctor", "run", "--cpu", "--epoch-steps", EPOCH_STEPS,
           "--logdir", str(tmp_path / "ddpdoctor-logs"), "--junit", str(junit),
           "--markdown", str(summary), *OPTIONS]
    if SCHEDULE:
        cmd += ["--expect-schedule", SCHEDULE]
    proc = subprocess.run(cmd + [SCRIPT, *ARGS], capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    report = summary.read_text() if summary.exists() else proc.stderr[-6000:]
    assert proc.returncode == 0, (
        f"ddpdoctor exit code {proc.returncode} (1: the ranks diverged or crashed, 3: hang; "
        f"see README)\n\n{report}")
