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

import pyte
import pytest

from .jobs import EXAMPLES, REPO, SCRIPTS, kill_job_processes, marker_line


def _under_a_terminal(args: list[str], limit: float = 90, rows: int = 40,
                      cols: int = 120) -> tuple[bytes, float | None, int]:
    pid, fd = pty.fork()
    if pid == 0:  # the child: ddpdoctor on the terminal's other end
        os.chdir(REPO)
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.environ.update(COLUMNS=str(cols), LINES=str(rows), TERM="xterm")
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


@pytest.mark.timeout(120)
def test_the_last_screen_of_a_30_row_terminal_holds_the_answer(tmp_path: Path) -> None:
    """seed 000 in an 80x30 terminal: after the run, the screen (as a terminal emulator draws
    it) shows the verdict, the rank/line table, both ranks' lines of code, the cause, the fix
    and where the rest is; the rank's lost-peer traceback is one line, without ddpdoctor's
    frames."""
    logdir = tmp_path / "logs"
    try:
        out, _, code = _under_a_terminal(
            ["run", "--logdir", str(logdir), "--hang-timeout", "5",
             str(EXAMPLES / "seed000_eval_nograd.py")], rows=30, cols=80)
    finally:
        assert not kill_job_processes(logdir)
    assert code == 1, out.decode("utf-8", "replace")[-3000:]
    screen = pyte.Screen(80, 30)
    pyte.ByteStream(screen).feed(out)
    shown = "\n".join(line.rstrip() for line in screen.display)
    path = EXAMPLES / "seed000_eval_nograd.py"
    for wanted in ("ddpdoctor: DIVERGED — root cause callsite_divergence", "rank   op",
                   f"seed000_eval_nograd.py:{marker_line(path, 'eval_forward')}",
                   f"seed000_eval_nograd.py:{marker_line(path, 'train_forward')}",
                   "out = model(x)  # ddpdoctor: eval_forward", "Cause:",
                   "[rank_conditional_ddp_forward]", "Fix:", "model.module(x)",
                   f"{logdir}/report.txt", "exit 1)"):
        assert wanted in shown, (wanted, shown)
    whole = (logdir / "report.txt").read_text()
    assert "Why:" in whole and "Also found (3)" in whole
    text = out.decode("utf-8", "replace")
    assert "ddpdoctor/runtime" not in text  # no frame of ddpdoctor's in a user's traceback
    assert "rank 0 ended on RuntimeError: Connection closed by peer" in text
    assert "Traceback" not in text
    assert "Connection closed by peer" in (logdir / "traceback-rank-0.txt").read_text()
