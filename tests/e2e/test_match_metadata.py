"""Split sizes and the backend's own words on real gloo ranks: a mismatch of each op family
is found with what each rank passed, gloo's line is quoted beside it, and the ranks' stderr
reaches the user as before (a terminal stays a terminal)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from .jobs import EXAMPLES, REPO, SCRIPTS, kill_job_processes, run_job


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case, summary, quoted", [
    ("all_to_all", "rank 0 sends 4 elements to rank 1, which expects 6",
     "ProcessGroupGloo::alltoall: invalid tensor size"),
    ("scatter", "rank 0 sends 6 elements to rank 1, which expects 4",
     "ProcessGroupGloo::scatter: invalid tensor size"),
    ("gather", "rank 1 sends 4 elements to rank 0, which expects 6",
     "ProcessGroupGloo::gather: invalid tensor size"),
])
def test_split_sizes_that_disagree_are_found_in_each_op_family(
        tmp_path: Path, case: str, summary: str, quoted: str) -> None:
    job = run_job(tmp_path, SCRIPTS / "split_mismatch.py", "--case", case)
    assert job.report is not None, job.stderr[-3000:]
    root = job.report["findings"][0]
    assert (root["kind"], root["cause"], root["seq"]) == \
        ("split_mismatch", "rank_dependent_split_sizes", 4), root["summary"]
    assert summary in root["summary"]
    assert any(quoted in item for item in root["evidence"]), root["evidence"]
    # The other rank's lost connection is a consequence, not quoted as a cause.
    assert not any("Connection closed" in item for item in root["evidence"])


@pytest.mark.timeout(120)
def test_gloo_abort_is_quoted_beside_both_ranks_sizes(tmp_path: Path) -> None:
    job = run_job(tmp_path, EXAMPLES / "moe_split_mismatch.py")
    root = job.report["findings"][0]
    assert root["kind"] == "split_mismatch"
    assert "rank 0 sends 4 rows to rank 1, which expects 5" in root["summary"]
    assert "rank 1 sends 5 rows to rank 0, which expects 4" in root["summary"]
    notes = {r: d["note"] for r, d in root["ranks"].items()}
    assert notes == {"0": "sends [4, 4] rows, expects [4, 4] rows (per rank of the group)",
                     "1": "sends [5, 3] rows, expects [5, 3] rows (per rank of the group)"}
    assert any("gloo pair.cc" in item and "Received data size doesn't match expected size"
               in item for item in root["evidence"]), root["evidence"]
    # What the user sees is unchanged: gloo's words still reach the terminal.
    assert "terminate called after throwing an instance of 'gloo::EnforceNotMet'" in job.stderr
    tails = list(job.logdir.glob("stderr-*.txt"))
    assert len(tails) == 2 and all(oct(p.stat().st_mode)[-3:] == "600" for p in tails)


@pytest.mark.timeout(120)
def test_a_rank_s_terminal_stays_a_terminal(tmp_path: Path) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 123, 0, 0))
    logdir = tmp_path / "logs"
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            seen.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(logdir),
             "--hang-timeout", "5", str(SCRIPTS / "tty_probe.py")],
            stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, text=True,
            timeout=100, cwd=REPO)
    finally:
        os.close(slave)
        leftovers = kill_job_processes(logdir)
        reader.join(5)
        os.close(master)
    assert not leftovers
    terminal = b"".join(seen).decode(errors="replace")
    assert proc.returncode == 0, terminal[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: stderr tty=True columns=123" in proc.stdout
        assert f"rank {rank} says goodbye on stderr\n" in terminal.replace("\r\n", "\n")
    tails = "".join(p.read_text() for p in logdir.glob("stderr-*.txt"))
    assert "rank 0 says goodbye" in tails and "rank 1 says goodbye" in tails
