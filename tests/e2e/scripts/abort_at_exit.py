"""Make this process die with SIGABRT after the interpreter has shut down, as gloo + DDP
sometimes does (``terminate called without an active exception``).

libc's ``abort`` is registered as an exit handler (``__cxa_atexit``, what C's ``atexit`` and
C++'s static destructors use; glibc exports no ``atexit``): it runs when ``main`` returns,
after Python's finalisation (its ``atexit`` handlers, ddpdoctor's exit record among them,
have run), every time. The object whose ``__del__`` aborted, used before, relied on
the shutdown's collection of ``__main__``'s globals, which Python does not promise ("It is
not guaranteed that __del__() methods are called for objects that still exist when the
interpreter exits"): in one CI run the aborting node reported no abort at all.
"""

import ctypes
import time


def abort_after_shutdown() -> None:
    """From now on, this process's exit ends in ``abort()``."""
    libc = ctypes.CDLL(None)
    if libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None) != 0:
        raise OSError("libc refused the exit handler")


def wait_until_ended(pids: list[int], timeout: float = 60.0) -> None:
    """Wait until these processes of this machine have exited (gone, or a zombie their
    parent has not reaped yet)."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
                    if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.05)
