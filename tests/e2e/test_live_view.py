"""The live view under a pseudo-terminal: one line per rank redrawn in place (cursor moves), the
job's output above it, the first update while the job is still running (how soon after the
start depends on the machine's load: a figure for the bench, not a test)."""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest

from .jobs import REPO, SCRIPTS, kill_job_processes


def _under_a_terminal(args: list[str], limit: float = 90) -> tuple[bytes, float | None, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: ddpdoctor on the terminal's other end
        os.chdir(REPO)
        os.environ.update(COLUMNS="120", LINES="40", TERM="xterm")
        os.execv(sys.executable, [sys.executable, "-m", "ddpdoctor", *args])
    out, first, started = b"", None, time.monotonic()
    while time.monotonic() - started < limit:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
        if first is None and b"ddpdoctor: starting the job" in out:
            first = time.monotonic() - started
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return out, first, os.waitstatus_to_exitcode(status)


@pytest.mark.timeout(120)
def test_the_live_view_redraws_each_rank_in_place_above_nothing_but_its_region(
        tmp_path: Path) -> None:
    logdir = tmp_path / "logs"
    try:
        out, first, code = _under_a_terminal(
            ["run", "--logdir", str(logdir), "--hang-timeout", "2.5",
             str(SCRIPTS / "slow_checkpoint.py"), "--seconds", "5"])
    finally:
        assert not kill_job_processes(logdir)
    text = out.decode("utf-8", "replace")
    assert code == 0, text[-3000:]
    # The script works for 5 s after start-up: the view must be up well before it ends.
    assert first is not None and first < 5.0, first
    assert text.index("ddpdoctor: starting the job") < text.index("ddpdoctor: CLEAN")
    assert "\x1b[1A" in text and "\x1b[2K" in text  # the region is redrawn in place
    assert "coll/s" in text and "rank 1" in text
    assert "busy" in text and "save_checkpoint()" in text  # rank 0 saving
    assert "waiting" in text and "barrier" in text  # rank 1 in the barrier
    assert "CLEAN" in text  # the report follows, after the view is gone
