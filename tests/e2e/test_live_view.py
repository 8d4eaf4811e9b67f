"""The live view under a pseudo-terminal: one line per rank redrawn in place (cursor moves), the
job's output above it, the first update while the job is still running (how soon after the
start depends on the machine's load: a figure for the bench, not a test)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import sys
import termios
import time
from pathlib import Path

import pytest

from .jobs import REPO, SCRIPTS, kill_job_processes


def _under_a_terminal(args: list[str], limit: float = 90) -> tuple[bytes, float | None, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: ddpdoctor on the terminal's other end
        os.chdir(REPO)
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
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
    assert "A\x1b[J" in text  # the region is erased in place (cursor up, clear below)
    assert "coll/s" in text and "rank 1" in text
    assert "busy" in text and "save_checkpoint()" in text  # rank 0 saving
    assert "waiting" in text and "barrier" in text  # rank 1 in the barrier
    assert "CLEAN" in text  # the report follows, after the view is gone


@pytest.mark.timeout(120)
def test_under_the_live_view_the_ranks_keep_a_terminal_and_their_progress_bars(
        tmp_path: Path) -> None:
    """The job runs on a pseudo-terminal of its own: each rank sees a terminal on stdout and
    stderr (of the real terminal's width), and its ``\\r`` progress bar reaches the terminal
    byte for byte, not a line at a time."""
    logdir = tmp_path / "logs"
    try:
        out, _first, code = _under_a_terminal(
            ["run", "--logdir", str(logdir), "--hang-timeout", "5",
             str(SCRIPTS / "tty_probe.py")])
    finally:
        assert not kill_job_processes(logdir)
    text = out.decode("utf-8", "replace")
    assert code == 0, text[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: stderr tty=True columns=120" in text, text[-3000:]
        assert f"rank {rank}: stdout tty=True" in text
        # Each update of the bar arrives as written (the ranks' bars interleave, as they do
        # under plain torchrun on one terminal), not a line at a time.
        assert all(f"\rrank {rank} bar {step}/3" in text for step in (1, 2, 3)), text[-3000:]
        assert f"rank {rank} says goodbye on stderr" in text
    assert "ddpdoctor: starting the job" in text and "CLEAN" in text
