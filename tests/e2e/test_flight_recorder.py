"""PyTorch flight-recorder dumps: from gloo jobs *not* run under ddpdoctor (``diff`` reads them,
pickle and JSON), and from ``ddpdoctor run --flight-recorder`` (dumped on a hang)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.launch.command import free_port

from .jobs import EXAMPLES, REPO, SCRIPTS, ddpdoctor, kill_job_processes, marker_line, run_job

SCRIPT = SCRIPTS / "fr_dump_job.py"


def _plain_torchrun_dumps(tmp_path: Path, case: str, as_json: bool) -> Path:
    folder = tmp_path / "dumps"
    folder.mkdir()
    env = {**os.environ, "FR_DIR": str(folder), "TORCH_FR_BUFFER_SIZE": "2000"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-port", str(free_port()), str(SCRIPT), "--case", case,
                    *(["--json"] if as_json else [])], env=env, cwd=tmp_path,
                   capture_output=True, timeout=90, stdin=subprocess.DEVNULL)
    assert len(list(folder.iterdir())) == 2, "each rank dumps its flight recorder"
    return folder


def _diff(folder: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "diff", "--json", str(folder)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    return json.loads(proc.stdout)


CASES = [
    pytest.param("rank0_reduce", "rank_conditional_collective",
                 {0: "reduce", 1: "forward"}, id="rank0-only-reduce"),
    pytest.param("uneven", "uneven_inputs", {0: "uneven_barrier", 1: "uneven_backward"},
                 id="seed001-case5"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case, cause, lines", CASES)
def test_pickle_dumps_of_a_job_run_without_ddpdoctor_are_diagnosed(
        tmp_path: Path, case: str, cause: str, lines: dict) -> None:
    report = _diff(_plain_torchrun_dumps(tmp_path, case, as_json=False))
    root = report["findings"][0]
    assert report["verdict"] == "diverged" and root["kind"] == "op_mismatch"
    assert root["cause"] == cause, root
    for rank, marker in lines.items():
        site = root["ranks"][str(rank)]["site"]
        assert (Path(site["file"]).name, site["line"]) == (SCRIPT.name,
                                                           marker_line(SCRIPT, marker))


@pytest.mark.timeout(120)
def test_json_dumps_without_stacks_still_name_the_mismatch(tmp_path: Path) -> None:
    report = _diff(_plain_torchrun_dumps(tmp_path, "rank0_reduce", as_json=True))
    root = report["findings"][0]
    assert root["kind"] == "op_mismatch"
    assert {d["op"] for d in root["ranks"].values()} == {"reduce", "broadcast"}


@pytest.mark.timeout(120)
def test_run_with_the_flight_recorder_dumps_it_on_a_hang_and_diagnoses(tmp_path: Path) -> None:
    path = EXAMPLES / "rank0_only_barrier.py"
    job = run_job(tmp_path, path, options=("--flight-recorder",), hang_timeout=4)
    assert job.returncode == 3, job.stderr[-3000:]
    assert sorted(p.name for p in job.logdir.glob("fr-rank-*")) == ["fr-rank-0.json",
                                                                  "fr-rank-1.json"]
    root = job.report["findings"][0]
    assert root["cause"] == "rank_conditional_collective"
    assert root["ranks"]["0"]["site"]["line"] == marker_line(path, "rank0_barrier")


def _flight_recorder_in_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              size: str | None) -> list[dict]:
    """What PyTorch's flight recorder held at the end of each rank of a clean recorded job,
    with ``TORCH_FR_BUFFER_SIZE`` unset (None) or set by the user."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        monkeypatch.delenv(name, raising=False)
    folder = tmp_path / "fr"
    folder.mkdir()
    env = {"FR_DIR": str(folder), **({"TORCH_FR_BUFFER_SIZE": size} if size else {})}
    try:
        proc = ddpdoctor("run", "--logdir", str(tmp_path / "logs"), "--hang-timeout", "10",
                         "--nproc-per-node", "2", str(SCRIPTS / "fr_entries.py"), env=env,
                         timeout=90)
    finally:
        leftovers = kill_job_processes(tmp_path / "logs")
    assert not leftovers, f"processes of the job outlived ddpdoctor: {leftovers}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((folder / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.timeout(120)
def test_a_recorded_gloo_job_does_not_pay_for_a_second_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.13 keeps 2,000 entries by default; ddpdoctor records every gloo collective
    # itself, so on a host with no CUDA device the flight recorder is switched off.
    ranks = _flight_recorder_in_ranks(tmp_path, monkeypatch, None)
    assert ranks == [{"entries": 0, "size": "0"}] * 2


@pytest.mark.timeout(120)
def test_a_flight_recorder_the_user_sized_is_left_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = _flight_recorder_in_ranks(tmp_path, monkeypatch, "64")
    for rank in ranks:
        assert rank["size"] == "64" and 0 < rank["entries"] <= 64, rank
