"""A script that makes its process group several times (PyTorch's DDP tutorial runs one
``mp.spawn`` per demo) is one job of several rounds: each round recorded in files of its own,
each diagnosed, and a healthy script is CLEAN in CI mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from .jobs import SCRIPTS, marker_line, run_job

SCRIPT = SCRIPTS / "tutorial_rounds.py"


@pytest.mark.timeout(150)
def test_two_healthy_spawn_rounds_are_clean_in_ci_mode(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    job = run_job(tmp_path, SCRIPT, options=("--launcher", "python", "--junit", str(junit)),
                  timeout=120)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean", job.report
    assert any("2 times (rounds" in n and "round 1 clean" in n for n in job.report["notes"])
    assert not any("damaged" in n for n in job.report["notes"]), job.report["notes"]
    assert "<failure" not in junit.read_text()
    names = sorted(p.name for p in job.logdir.glob("rank-*.jsonl"))
    assert names == ["rank-0.jsonl", "rank-0.round-1.jsonl", "rank-1.jsonl",
                     "rank-1.round-1.jsonl"]


@pytest.mark.timeout(150)
def test_a_divergence_in_the_second_round_is_that_rounds_diagnosis(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPT, "--bad-round", "2", options=("--launcher", "python"),
                  timeout=120, hang_timeout=5)
    assert job.returncode in (1, 3), job.stderr[-3000:]
    assert job.report["verdict"] in ("diverged", "crashed"), job.report
    root = job.report["findings"][0]
    lines = {int(r): d["site"]["line"] for r, d in root["ranks"].items() if d.get("site")}
    assert lines.get(0) == marker_line(SCRIPT, "rank0_all_reduce"), root
    assert any("this report is round 2's; round 1 clean" in n for n in job.report["notes"])


REINIT = SCRIPTS / "reinit_rounds.py"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("bad", [0, 2], ids=["healthy", "second-round-diverges"])
def test_a_process_group_made_again_in_the_same_processes_is_a_round(
        tmp_path: Path, bad: int) -> None:
    """Before, the second group's collectives reused the first one's numbers and were
    dropped: a divergence there was reported CLEAN."""
    job = run_job(tmp_path, REINIT, "--bad-round", str(bad), timeout=120, hang_timeout=5)
    names = sorted(p.name for p in job.logdir.glob("rank-*.jsonl"))
    assert names == ["rank-0.jsonl", "rank-0.round-1.jsonl", "rank-1.jsonl",
                     "rank-1.round-1.jsonl"]
    notes = " ".join(job.report["notes"])
    if not bad:
        assert job.returncode == 0 and job.report["verdict"] == "clean", job.stderr[-3000:]
        assert "2 times (rounds" in notes and "round 1 clean" in notes
        return
    assert job.returncode in (1, 3), job.stderr[-3000:]
    assert job.report["verdict"] in ("diverged", "crashed")
    root = job.report["findings"][0]
    lines = {int(r): d["site"]["line"] for r, d in root["ranks"].items() if d.get("site")}
    assert lines.get(0) == marker_line(REINIT, "metric"), root
    assert "this report is round 2's; round 1 clean" in notes
