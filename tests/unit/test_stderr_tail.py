"""The copier of a rank's stderr (runtime/stderr_tail.py, run as a script as ranks run it):
every byte reaches the original stderr, the tail file holds the last ones, and nothing about
the file (a full disk, a missing folder) stops the copying."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ddpdoctor.runtime import stderr_tail
from ddpdoctor.trace.reader import wait_for_tails

HELPER = stderr_tail.__file__


def _copy(data: bytes, path: Path) -> bytes:
    proc = subprocess.run([sys.executable, "-S", "-I", HELPER, str(path)], input=data,
                          capture_output=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == b""
    return proc.stdout


def test_every_byte_passes_and_the_tail_is_kept(tmp_path: Path) -> None:
    data = b"".join(b"line %d of the rank's stderr\n" % i for i in range(20_000))
    path = tmp_path / "stderr-1.txt"
    assert _copy(data, path) == data
    tail = path.read_bytes()
    assert stderr_tail.TAIL_BYTES <= len(tail) <= 2 * stderr_tail.TAIL_BYTES
    assert data.endswith(tail)
    assert oct(path.stat().st_mode)[-3:] == "600"


def test_a_tail_file_that_cannot_be_written_stops_nothing(tmp_path: Path) -> None:
    data = b"x" * 300_000 + b"\nthe end\n"
    assert _copy(data, tmp_path / "no-such-folder" / "stderr-1.txt") == data


def test_readers_wait_for_a_copier_still_writing(tmp_path: Path) -> None:
    path = tmp_path / "stderr-7.txt"
    path.write_text("")
    fd = os.open(path, os.O_WRONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    threading.Timer(0.3, os.close, (fd,)).start()  # the copier ends
    start = time.monotonic()
    wait_for_tails(str(tmp_path), timeout=5)
    assert 0.25 < time.monotonic() - start < 3
    start = time.monotonic()
    wait_for_tails(str(tmp_path), timeout=5)  # nobody writes: no wait (not the 5 s bound)
    assert time.monotonic() - start < 2
