"""The last words of a rank: its stderr, as the user sees it, with a bounded tail kept on disk.

The backend explains many deaths only on the dying rank's stderr: gloo's enforce failures
("Received data size doesn't match expected size", then SIGABRT), NCCL's WARN and watchdog
lines, CUDA errors. A rank killed by a signal cannot report them itself, so its file
descriptor 2 is routed through a small helper process (this file, run as a script with the
standard library only) that copies every byte to the original stderr unchanged and keeps the
last :data:`TAIL_BYTES` of them in ``stderr-<pid>.txt`` in the log folder, rewritten as it
goes, so the file holds the tail whenever the rank dies. Where stderr is a terminal the rank
gets a pseudo-terminal of the same size (``isatty()`` and colour stay as they were). The helper
ignores the signals a launcher sends to the job and ends when the last writer has gone.
``DDPDOCTOR_STDERR_TAIL=0`` turns it off.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys

if __name__ != "__main__":  # the helper runs as a script, with nothing but the standard library
    from ddpdoctor.trace import schema

TAIL_BYTES = 64 * 1024
ENV = "DDPDOCTOR_STDERR_TAIL"

helper_pid: int | None = None  # the helper of this process, not a child of the user's
_started_in: int | None = None  # the process that started it (a forked child starts its own)


def pseudo_terminal(like: int) -> tuple[int, int]:
    """(master, slave) of a new pseudo-terminal of the size of terminal ``like``, passing
    bytes as written (no "\n" -> "\r\n"): what the writer sees is a terminal, what the
    reader gets is what was written."""
    import termios

    master, slave = os.openpty()
    try:
        attrs = termios.tcgetattr(slave)
        attrs[1] &= ~termios.OPOST
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        size = fcntl.ioctl(like, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, size)
    except OSError:
        pass
    return master, slave


def _pipe_like() -> tuple[int, int]:
    """(read end, write end) for the rank's stderr: a pseudo-terminal when fd 2 is one."""
    return pseudo_terminal(2) if os.isatty(2) else os.pipe()


def start(logdir: str) -> None:
    """Route this process's fd 2 through the helper (once per process; a forked child that
    becomes a rank gets a helper of its own). Any failure leaves stderr as it was."""
    global helper_pid, _started_in
    if _started_in == os.getpid() or os.environ.get(ENV, "1") == "0":
        return
    _started_in = os.getpid()
    try:
        read_end, write_end = _pipe_like()
    except OSError:
        return
    import subprocess  # here, not at boot: every process of the job imports this module

    path = os.path.join(logdir, schema.stderr_file(os.getpid()))
    try:
        sys.stderr.flush()
        helper = subprocess.Popen(
            [sys.executable, "-S", "-I", os.path.abspath(__file__), path], stdin=read_end,
            stdout=2, stderr=subprocess.DEVNULL, close_fds=True,
            # The log folder names it as the job's (tests find what a job left running).
            env={"PATH": os.environ.get("PATH", ""), "DDPDOCTOR_LOGDIR": logdir})
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    helper_pid = helper.pid


def _copy(path: str) -> None:
    """The helper: stdin to stdout, the last TAIL_BYTES also to ``path``. It must outlive
    its rank whatever happens to the file (a full disk): a copier that died would turn the
    rank's next write to stderr into a broken pipe."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        # Held until the last byte is in: readers wait for it (trace.reader.wait_for_tails).
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        fd = -1
    tail = b""
    out_ok = True
    while True:
        try:
            data = os.read(0, 65536)
        except OSError:  # a pseudo-terminal whose last writer closed it (EIO)
            break
        if not data:
            break
        if out_ok:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view):]
            except OSError:  # the terminal went away: keep the tail all the same
                out_ok = False
        if fd < 0:
            continue
        tail += data
        try:
            if len(tail) > 2 * TAIL_BYTES:
                tail = tail[-TAIL_BYTES:]
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, tail)
            else:
                os.write(fd, data)
        except OSError:  # a full disk, a file-size limit: the copying goes on
            os.close(fd)
            fd = -1
    if fd >= 0:
        os.close(fd)


if __name__ == "__main__":
    _copy(sys.argv[1])
