"""Do no harm under the compiler: ``torch.compile(DDP(model))``, compiled autograd, FSDP2 and
DTensor tensor parallelism run under ddpdoctor as under plain torchrun, their collectives are
recorded, and a divergence in them is found."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.launch.command import free_port

from .jobs import REPO, SCRIPTS, marker_line, run_job

SCRIPT = SCRIPTS / "compiled.py"
MODES = {  # the ops each mode's steps must have recorded, by label
    "ddp": {("all_reduce", "ddp.bucket")},
    "autograd": {("all_reduce", "ddp.bucket")},  # DDP's Python reducer in the compiled graph
    "fsdp2": {("all_gather_into_tensor", "user"), ("reduce_scatter_tensor", "user")},
    "dtensor": {("all_reduce", "user")},  # RowwiseParallel's forward all-reduce
}


def _skip_unrunnable(mode: str) -> None:
    import torch

    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if mode == "fsdp2" and (major, minor) <= (2, 6):
        pytest.skip("FSDP2 on the CPU needs torch 2.7 or newer (2.6: 'Stream' object has no "
                    "attribute 'record_event', under plain torchrun too)")


def _checksums(output: str) -> list[str]:
    return sorted(re.findall(r"rank \d step \d weights -?[\d.]+", output))


def _plain_torchrun(mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPDOCTOR_")}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(SCRIPT), "--mode", mode],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env,
        stdin=subprocess.DEVNULL)
    return proc.stdout


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_compiled_or_sharded_job_runs_as_under_torchrun_and_is_recorded(
        tmp_path: Path, mode: str) -> None:
    _skip_unrunnable(mode)
    job = run_job(tmp_path, SCRIPT, "--mode", mode, timeout=180, hang_timeout=30)
    assert job.returncode == 0, job.stderr[-4000:]
    assert job.report["verdict"] == "clean", job.report["findings"][:1]
    assert "Error" not in job.stderr, job.stderr[-4000:]
    plain = _checksums(_plain_torchrun(mode))
    assert len(plain) == 6 and _checksums(job.stdout) == plain
    run = job.run()
    for trace in run.ranks.values():
        ops = {(c.op, c.label) for c in trace.collectives}
        assert MODES[mode] <= ops, ops


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["ddp", "autograd", "fsdp2", "dtensor"])
def test_an_uneven_compiled_or_sharded_job_is_diagnosed_at_the_users_line(
        tmp_path: Path, mode: str) -> None:
    _skip_unrunnable(mode)
    job = run_job(tmp_path, SCRIPT, "--mode", mode, "--uneven", timeout=180, hang_timeout=10)
    assert job.returncode == 1, job.stderr[-4000:]
    assert job.report["verdict"] == "diverged"
    root = job.report["findings"][0]
    assert root["kind"] == "missing_collective", root
    site = root["ranks"]["1"]["site"]
    assert Path(site["file"]).name == "compiled.py"
    if mode != "fsdp2":
        assert root["cause"] == "uneven_inputs"
        marker = {"autograd": "backward_ca", "dtensor": "forward"}.get(mode, "backward")
        assert site["line"] == marker_line(SCRIPT, marker)  # not the code torch.fx generated
