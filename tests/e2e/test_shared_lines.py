"""``ddpdoctor run --share-lines`` on a real job: identical ranks' traces become member files
of the first such rank's once the job has ended, and every reader gives the same diagnosis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.trace import shared_ref

from .jobs import SCRIPTS, ddpdoctor, run_job


@pytest.mark.timeout(200)
def test_identical_ranks_keep_their_lines_once_and_read_the_same(tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.json"
    job = run_job(tmp_path, SCRIPTS / "two_groups.py", timeout=180, hang_timeout=20,
                  options=("--nproc-per-node", "4", "--share-lines", "--timeline",
                           str(timeline)))
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report["verdict"] == "clean"
    # Two classes: the ranks of each half issue their half's all_reduce.
    assert "2 of 4 rank traces share their collective lines" in job.stderr, job.stderr[-2000:]
    refs = {r: shared_ref.of_file(str(job.logdir / f"rank-{r}.jsonl")) for r in range(4)}
    assert refs[0] is None and refs[2] is None
    assert refs[1] is not None and refs[1].file == "rank-0.jsonl"
    assert refs[3] is not None and refs[3].file == "rank-2.jsonl"
    sizes = {r: (job.logdir / f"rank-{r}.jsonl").stat().st_size for r in range(4)}
    assert sizes[1] < sizes[0] and sizes[3] < sizes[2]
    # What the run diagnosed before the rewrite, diff diagnoses after it.
    after = json.loads(ddpdoctor("diff", "--json", str(job.logdir)).stdout)
    for key in ("verdict", "findings", "ranks", "world_size"):
        assert after[key] == job.report[key], key
    # The timeline was drawn from the rewritten folder: every rank has its collectives.
    events = json.loads(timeline.read_text())["traceEvents"]
    per_rank = {e["pid"]: 0 for e in events if e.get("ph") == "X"}
    for e in events:
        if e.get("ph") == "X":
            per_rank[e["pid"]] += 1
    assert len(per_rank) == 4 and len(set(per_rank.values())) == 1, per_rank


@pytest.mark.timeout(200)
def test_small_jobs_keep_every_file_whole_by_default(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPTS / "two_groups.py", timeout=180, hang_timeout=20,
                  options=("--nproc-per-node", "4"))
    assert job.returncode == 0, job.stderr[-3000:]
    assert "share their collective lines" not in job.stderr
    assert all(shared_ref.of_file(str(job.logdir / f"rank-{r}.jsonl")) is None
               for r in range(4))
