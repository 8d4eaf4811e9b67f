"""``ddpdoctor run --timeline`` / ``ddpdoctor timeline``: Chrome trace-event JSON that Perfetto
and chrome://tracing open, checked field by field against the documented format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .jobs import EXAMPLES, REPO, run_job

REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "i": {"name", "ph", "ts", "pid", "s"},
            "s": {"name", "ph", "ts", "pid", "tid", "id", "cat"},
            "f": {"name", "ph", "ts", "pid", "tid", "id", "cat", "bp"},
            "M": {"name", "ph", "pid", "args"}}


def _events(path: Path) -> list[dict]:
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    for e in events:
        assert REQUIRED[e["ph"]] <= set(e), e
        if e["ph"] == "X":
            assert e["dur"] > 0 and isinstance(e["ts"], float)
    return events


@pytest.mark.timeout(120)
def test_the_timeline_of_a_seed001_hang_marks_the_divergence_and_the_hang(
        tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    job = run_job(tmp_path, EXAMPLES / "seed001_uneven.py", "--case", "4",
                  options=("--launcher", "python", "--timeline", str(out)))
    assert job.returncode == 3
    events = _events(out)
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {0, 1}
    assert any(e["name"].startswith("DDP gradient bucket") for e in slices)
    assert any(e["cat"].startswith("join.") for e in slices)
    marks = [e for e in events if e["ph"] == "i" and e["name"].startswith("first divergence")]
    assert {e["pid"] for e in marks} == {0, 1}
    hang = [e for e in events if e["ph"] == "i" and e["name"].startswith("hang")]
    assert {e["pid"] for e in hang} == {0, 1}
    flows = {e["ph"]: e for e in events if e["ph"] in "sf"}
    assert set(flows) == {"s", "f"} and flows["s"]["id"] == flows["f"]["id"]
    assert flows["s"]["ts"] <= flows["f"]["ts"]
    # Still pending at the end: open to the end of the rank's trace.
    pending = [e for e in slices if e["args"]["state"] == "pending"]
    assert pending


@pytest.mark.timeout(120)
def test_the_timeline_of_a_healthy_job_has_every_collective_and_no_marks(tmp_path: Path) -> None:
    job = run_job(tmp_path, EXAMPLES / "seed002_healthy.py")
    assert job.returncode == 0
    out = tmp_path / "t.json"
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "timeline", str(job.logdir),
                           "-o", str(out)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0 and "ui.perfetto.dev" in proc.stderr
    assert out.stat().st_mode & 0o777 == 0o600  # private, as every report file
    events = _events(out)
    slices = [e for e in events if e["ph"] == "X"]
    run = job.run()
    assert len(slices) == sum(len(t.collectives) for t in run.ranks.values())
    assert not [e for e in events if e["ph"] in "isf"]
    assert all(e["args"]["state"] == "completed" for e in slices)
