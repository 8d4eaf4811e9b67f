"""Two nodes on one machine: two ``ddpdoctor run --nnodes 2`` processes with two ranks each
(as real nodes have several), static and c10d rendezvous: one run id, hang detection over
both nodes, each node's own report the whole job's diagnosis, and merged ``diff``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.launch.command import free_port

from .jobs import REPO, SCRIPTS, kill_job_processes, marker_line

SCRIPT = SCRIPTS / "two_nodes.py"


def _rendezvous(kind: str, port: int) -> list[str]:
    if kind == "static":
        return ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "two-node-test"]


PER_NODE = 2  # ranks per node


def _two_nodes(tmp_path: Path, kind: str, mode: str, hang_timeout: float = 60,
               extra: tuple = ()) -> list[tuple[subprocess.CompletedProcess, Path, dict]]:
    port = free_port()
    procs = []
    for node in (0, 1):
        logdir = tmp_path / f"node{node}"
        cmd = [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(logdir),
               "--json", str(tmp_path / f"report{node}.json"), "--grace", "2",
               "--hang-timeout", str(hang_timeout), "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", str(PER_NODE), *_rendezvous(kind, port), str(SCRIPT),
               "--mode", mode, *extra]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, cwd=REPO, stdin=subprocess.DEVNULL), logdir))
    out = []
    try:
        for proc, logdir in procs:
            stdout, stderr = proc.communicate(timeout=100)
            out.append((subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                        logdir))
    finally:
        for proc, _logdir in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        leftovers = [pid for _, logdir in procs for pid in kill_job_processes(logdir)]
    assert not leftovers, f"processes outlived ddpdoctor: {leftovers}"
    return [(p, d, json.loads((tmp_path / f"report{i}.json").read_text()))
            for i, (p, d) in enumerate(out)]


def _diff(*folders: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "diff", "--json",
                           *map(str, folders)], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["static", "c10d"])
def test_a_healthy_two_node_job_is_clean_per_node_and_merged(tmp_path: Path, kind: str) -> None:
    nodes = _two_nodes(tmp_path, kind, "healthy")
    for proc, _, report in nodes:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert report["verdict"] == "clean", report
        assert "ran on other nodes" in " ".join(report["notes"])
        # The launchers' store client says nothing, also when the store's node ends first.
        assert "TCPStore" not in proc.stderr and "frame #" not in proc.stderr, proc.stderr
    code, merged = _diff(nodes[0][1], nodes[1][1])
    assert code == 0 and merged["verdict"] == "clean"
    assert {r["status"] for r in merged["ranks"].values()} == {"finished"}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["static", "c10d"])
def test_a_rank_aborting_in_teardown_on_one_node_does_not_hold_the_other(tmp_path: Path,
                                                                        kind: str) -> None:
    """torchrun's agent whose workers all succeeded waits at its exit barrier (300 s) for
    every node's agent; the agent of a node whose rank aborted in teardown skips it. Seen in
    CI: the store's node held for the full wait. ddpdoctor ends that agent once every other
    node's job has ended (under c10d the aborting node may hold the store itself: its end
    then ends the other's wait)."""
    nodes = _two_nodes(tmp_path, kind, "teardown_abort")
    for proc, _, report in nodes:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert report["verdict"] == "clean", report
    # The last rank aborts: its node is the one whose report holds rank 3's own trace.
    [(aborted, stderr)] = [(r, p.stderr) for p, _, r in nodes
                           if r["ranks"]["3"]["status"] != "remote"]
    (other,) = [r for _, _, r in nodes if r is not aborted]
    assert aborted["findings"], (aborted, stderr[-3000:])
    warning = aborted["findings"][0]
    assert warning["kind"] == "teardown_abort", aborted["findings"]
    assert warning["summary"].startswith(
        "Rank 3 finished its script, then its process died with SIGABRT"), warning
    assert "exit barrier" not in " ".join(aborted["notes"]), aborted["notes"]
    assert not other["findings"], other["findings"]
    if kind == "static":  # node 0 holds the store: its agent waits until ddpdoctor ends it
        assert "exit barrier" in " ".join(other["notes"]), other["notes"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["static", "c10d"])
def test_a_mismatch_across_nodes_is_caught_by_both_nodes(tmp_path: Path, kind: str) -> None:
    nodes = _two_nodes(tmp_path, kind, "mismatch", hang_timeout=60)
    barrier, extra = marker_line(SCRIPT, "barrier"), marker_line(SCRIPT, "extra_step")

    def both_sides(report: dict) -> None:
        root = report["findings"][0]
        assert root["kind"] == "op_mismatch" and root["cause"] == \
            "rank_conditional_collective", report["findings"]
        lines = {int(r): d["site"]["line"] for r, d in root["ranks"].items() if d.get("site")}
        assert lines[0] == barrier, lines
        assert lines.keys() - {0} and all(lines[r] == extra for r in lines.keys() - {0}), lines

    for proc, logdir, report in nodes:
        assert proc.returncode == 3, proc.stderr[-3000:]
        assert "can never match" in proc.stderr
        # Each node's own report is the whole job's: the node without ranks 0 and 1 gets the
        # end of their traces through the store (a c10d rendezvous numbers nodes as they come).
        both_sides(report)
        if not (logdir / "rank-0.jsonl").exists():
            assert {p.name for p in logdir.glob("remote-*.jsonl")} == \
                {"remote-0.jsonl", "remote-1.jsonl"}
    # Merged, the folders give the same diagnosis from every rank's own trace.
    code, merged = _diff(nodes[0][1], nodes[1][1])
    assert code == 1
    both_sides(merged)
    stacks = {int(r): s["hang_stack"] for r, s in merged["ranks"].items()}
    assert len(stacks) == 2 * PER_NODE and all(stacks.values()), stacks


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind, attempt", [("static", 1), ("static", 2), ("c10d", 1),
                                           ("c10d", 2)])
def test_a_crash_on_one_node_is_rooted_at_its_line_by_both_nodes(tmp_path: Path, kind: str,
                                                                  attempt: int) -> None:
    """Issue 53: the last rank alone all-reduces a scalar; gloo fails the mismatched
    all-reduce and the other node's ranks only lose their peers ("Connection reset by peer").
    No verdict stops this job: it ends on its own, and the nodes tell each other at the end
    through node 0's own store. Both reports root it at the last rank's line."""
    nodes = _two_nodes(tmp_path, kind, "extra_reduce")
    extra, step = marker_line(SCRIPT, "extra_reduce"), marker_line(SCRIPT, "next_step")
    last = 2 * PER_NODE - 1
    for proc, logdir, report in nodes:
        assert proc.returncode == 1, proc.stderr[-3000:]
        root = report["findings"][0]
        assert root["kind"] == "shape_mismatch", report["findings"]
        assert root["cause"] == "rank_conditional_collective", root
        lines = {int(r): d["site"]["line"] for r, d in root["ranks"].items() if d.get("site")}
        assert lines[last] == extra and lines.keys() - {last}, lines
        assert all(lines[r] == step for r in lines.keys() - {last}), lines
        if not (logdir / f"rank-{last}.jsonl").exists():  # the node that only lost peers
            assert (logdir / f"remote-{last}.jsonl").exists()
            assert "Connection" not in root["summary"], root["summary"]
            assert any(n.startswith(f"rank {last}: its trace is cut") and
                       "another node, whose own folder holds how it ended" in n
                       for n in report["notes"]), report["notes"]
    code, merged = _diff(nodes[0][1], nodes[1][1])
    assert code == 1 and merged["findings"][0]["kind"] == "shape_mismatch"


@pytest.mark.timeout(150)
def test_a_rank_busy_on_the_other_node_keeps_the_job_alive(tmp_path: Path) -> None:
    nodes = _two_nodes(tmp_path, "static", "busy", hang_timeout=2.5,
                       extra=("--seconds", "7.5"))
    for proc, _, _report in nodes:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "hang detected" not in proc.stderr
