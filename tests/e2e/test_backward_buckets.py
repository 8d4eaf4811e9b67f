"""DDP's gradient buckets recorded once per backward (runtime/ddp_buckets.py, from a model's
third forward on), on two real gloo ranks: healthy shapes of training keep every bucket of every
iteration, in order and completed, and a job that diverges, dies or breaks DDP well after the
record changed hands gets the diagnosis it got when each bucket was recorded as it entered."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from .jobs import SCRIPTS, marker_line, run_job

SCRIPT = SCRIPTS / "late_buckets.py"
STEPS = 8  # the script's default


def _buckets(trace: object) -> dict[int, list[tuple]]:
    """(bucket, state, label) of each bucket by iteration."""
    out: dict[int, list[tuple]] = defaultdict(list)
    for c in trace.collectives:  # type: ignore[attr-defined]
        if c.label in ("ddp.bucket", "join.shadow_bucket"):
            out[c.iteration].append((c.bucket, c.state, c.label))
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["healthy", "grad_penalty", "no_sync", "comm_hook", "join"])
def test_healthy_training_keeps_every_bucket(tmp_path: Path, mode: str) -> None:
    job = run_job(tmp_path, SCRIPT, "--mode", mode)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report is not None and job.report["verdict"] == "clean"
    # A comm hook and join put the model back on the recording group, bucket by bucket.
    per_backward = mode not in ("comm_hook", "join")
    for rank in (0, 1):
        assert f"rank {rank}: per backward: {per_backward}" in job.stdout, job.stdout[-2000:]
    line = marker_line(SCRIPT, "backward")
    for rank, trace in job.run().ranks.items():
        assert not trace.lost and not trace.warnings, (rank, trace.warnings)
        per = _buckets(trace)
        iterations = list(range(1, STEPS + (2 if mode == "join" else 1)))
        if mode == "no_sync":  # every other one accumulates
            iterations = iterations[::2]
        assert sorted(per) == iterations, (rank, sorted(per))
        layout = [b for b, _, _ in per[iterations[1]]]
        assert len(layout) > 1
        for it in iterations[1:]:
            assert [b for b, _, _ in per[it]] == layout, (rank, it, per[it])
            assert all(state == "completed" for _, state, _ in per[it]), (rank, it, per[it])
        shadow = {it for it, got in per.items() if got[0][2] == "join.shadow_bucket"}
        assert shadow == ({STEPS + 1} if mode == "join" and rank == 0 else set())
        bucket_lines = {c.site.line for c in trace.collectives if c.label == "ddp.bucket"}
        assert bucket_lines == {line}


@pytest.mark.timeout(120)
def test_a_rank_with_one_step_more_is_found_at_its_backward(tmp_path: Path) -> None:
    job = run_job(tmp_path, SCRIPT, "--mode", "extra_step")
    assert job.returncode != 0 and job.report is not None
    root = job.report["findings"][0]
    assert root["kind"] == "op_mismatch", root["summary"]
    assert root["cause"] == "rank_conditional_collective"
    ranks = root["ranks"]
    assert (ranks["0"]["op"], ranks["1"]["op"]) == ("barrier", "all_reduce")
    assert ranks["1"]["label"] == "ddp.bucket" and ranks["1"]["iteration"] == STEPS + 1
    assert ranks["0"]["site"]["line"] == marker_line(SCRIPT, "barrier")
    assert ranks["1"]["site"]["line"] == marker_line(SCRIPT, "backward")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, exited", [("dies", "os._exit(3)"),
                                          ("skip_layer", "Expected to have finished reduction")])
def test_a_rank_that_stops_inside_or_after_its_backward_is_the_cause(
        tmp_path: Path, mode: str, exited: str) -> None:
    # dies: rank 1 ends inside its backward at iteration 7, after some of its buckets went out;
    # skip_layer: rank 1's backward at iteration 7 leaves a parameter out (no bucket goes out)
    # and DDP refuses its next forward. Rank 0 waits in iteration 7's buckets either way.
    job = run_job(tmp_path, SCRIPT, "--mode", mode)
    assert job.returncode != 0 and job.report is not None
    root = job.report["findings"][0]
    assert root["kind"] == "rank_crashed", root["summary"]
    assert exited in root["summary"]
    crashed = {int(r) for r, d in root["ranks"].items() if d["op"] is None}
    assert crashed == {1}
    waiting = root["ranks"]["0"]
    assert (waiting["label"], waiting["iteration"]) == ("ddp.bucket", 7)
    run = job.run()
    assert not any(t.lost for t in run.ranks.values())
    if mode == "skip_layer":  # its backward issued nothing, and its trace says so
        assert 7 not in _buckets(run.ranks[1])


GAN = SCRIPTS / "gan_two_models.py"


@pytest.mark.timeout(120)
def test_a_gan_of_two_ddp_models_is_clean_with_every_bucket_completed(tmp_path: Path) -> None:
    # pytorch/examples' dcgan loop: G's loss backward runs through D and G, two Reducers
    # issuing their buckets in one backward, both recorded once per backward.
    job = run_job(tmp_path, GAN)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.report is not None and job.report["verdict"] == "clean", job.report
    assert any(n.startswith("the script made 2 DDP models: an iteration here is a forward "
                            "through any of them") for n in job.report["notes"]), job.report
    for rank in (0, 1):
        for model in ("G", "D"):
            assert f"rank {rank}: {model} per backward: True" in job.stdout, job.stdout[-2000:]
    backward_lines = {marker_line(GAN, m)
                      for m in ("d_real_backward", "d_fake_backward", "g_backward")}
    run = job.run()
    for rank, trace in run.ranks.items():
        assert not trace.lost and not trace.warnings, (rank, trace.warnings)
        buckets = [c for c in trace.collectives if c.label == "ddp.bucket"]
        # Per iteration: D's bucket in each of D's two backwards, D's and G's in G's.
        assert len(buckets) == 4 * 6, (rank, len(buckets))
        assert all(c.state == "completed" for c in buckets), rank
        assert {c.site.line for c in buckets} == backward_lines, rank


@pytest.mark.timeout(120)
def test_a_gan_whose_rank_skips_d_on_real_data_is_found_at_both_lines(tmp_path: Path) -> None:
    job = run_job(tmp_path, GAN, "--skip-d-real-at", "2")
    assert job.returncode != 0 and job.report is not None, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert root["kind"] == "callsite_divergence", root["summary"]
    assert root["cause"] == "rank_conditional_ddp_forward", root
    lines = {int(r): d["site"]["line"] for r, d in root["ranks"].items()}
    assert lines == {0: marker_line(GAN, "d_real"), 1: marker_line(GAN, "g_forward")}, lines
    assert all(d["label"] == "ddp.buffers" for d in root["ranks"].values()), root["ranks"]
