"""CI runners are small and loaded: on this 2-core machine, with two CPU burners beside them,
healthy 4-rank jobs with a second group per half are never stopped as a hang."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .jobs import SCRIPTS, run_job

_BURN = "import time\nend = time.monotonic() + 240\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("attempt", [1, 2])
def test_a_healthy_four_rank_job_under_cpu_load_is_never_stopped(
        tmp_path: Path, attempt: int) -> None:
    burners = [subprocess.Popen([sys.executable, "-c", _BURN]) for _ in range(2)]
    try:
        job = run_job(tmp_path, SCRIPTS / "two_groups.py", options=("--nproc-per-node", "4"),
                      timeout=200, hang_timeout=8)
    finally:
        for proc in burners:
            proc.kill()
            proc.wait()
    assert "hang detected" not in job.stderr and "rank stuck" not in job.stderr, \
        job.stderr[-3000:]
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean", job.report["findings"][:1]
