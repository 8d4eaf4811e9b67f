"""``ddpdoctor diff`` of what a dead job left, started by plain torchrun (never by ddpdoctor):
torchrun's own log folder, or its output redirected to one file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .jobs import EXAMPLES, ddpdoctor, marker_line

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.mark.parametrize("layout", ["log_dir", "one_file"])
def test_a_dead_jobs_logs_name_the_crashed_rank_and_its_line(tmp_path: Path,
                                                             layout: str) -> None:
    script = EXAMPLES / "seed003_crash.py"
    logs = tmp_path / "logs"
    logs.mkdir()
    options = ["--log-dir", str(logs / "torchrun"), "--redirects", "3"] \
        if layout == "log_dir" else []
    from ddpdoctor.launch.command import free_port

    with open(logs / "job.log" if layout == "one_file" else tmp_path / "out.txt", "wb") as out:
        job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                              "2", "--master-port", str(free_port()), *options, str(script)],
                             stdout=out, stderr=subprocess.STDOUT, timeout=90)
    assert job.returncode != 0
    proc = ddpdoctor("diff", "--json", str(logs))
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    root = report["findings"][0]
    assert (root["kind"], root["cause"]) == ("rank_crashed", "rank_crashed")
    assert root["ranks"]["1"]["site"]["line"] == marker_line(script, "raise_error")
    assert "ValueError" in root["summary"]
