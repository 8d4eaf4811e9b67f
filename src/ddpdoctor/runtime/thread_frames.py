"""Every thread's current frame, read from inside the rank without a deadlock.

``sys._current_frames()`` holds CPython's thread-list lock while it builds its answer; on
CPython 3.11 before the fix of gh-106883 (3.11.9), a garbage collection that starts inside
it can run a destructor that releases the GIL (torch's process groups do), and the process
deadlocks: that thread waits for the GIL while holding the list lock, and every other thread
waits for the lock. ddpdoctor's watchdog reads the main thread's frame while the rank runs,
so it pauses the collector for the call. Standard library only.
"""

from __future__ import annotations

import gc
import sys
from types import FrameType


def current_frames() -> dict[int, FrameType]:
    """``sys._current_frames()``, with the garbage collector paused while it runs."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        return sys._current_frames()
    finally:
        if paused:
            gc.enable()
