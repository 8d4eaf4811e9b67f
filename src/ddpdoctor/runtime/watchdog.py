"""In-rank watchdog: on the launcher's request, write the rank's evidence into its trace.

When the launcher decides the job hangs it creates ``<logdir>/hang-request.json``. A daemon
thread in every rank polls for that file; the main thread is blocked inside gloo with the GIL
released, so this thread can read every thread's Python stack with ``sys._current_frames()``
(no ptrace, no py-spy). It records the pending collectives and the stacks as a ``hang`` record,
flushes the trace and acknowledges with ``<logdir>/hang-ack-<rank>``. Standard library only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from ddpdoctor.trace import schema

REQUEST_FILE = "hang-request.json"
POLL_SECONDS = 0.2


def ack_file(rank: int) -> str:
    return f"hang-ack-{rank}"


def thread_stacks() -> list[dict]:
    """Python stacks of all threads of this process, outermost frame first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    out = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident, "").startswith("ddpdoctor-"):
            continue
        frames = [{"file": f.filename, "line": f.lineno, "function": f.name}
                  for f in traceback.extract_stack(frame)]
        out.append({"thread": names.get(ident, str(ident)), "main": ident == main,
                    "frames": frames})
    out.sort(key=lambda s: not s["main"])
    return out


class Watchdog:
    """Polls for a hang request and answers it with the rank's pending work and stacks."""

    def __init__(self, recorder: object, logdir: str, rank: int) -> None:
        self._recorder = recorder
        self._request = os.path.join(logdir, REQUEST_FILE)
        self._ack = os.path.join(logdir, ack_file(rank))
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not os.path.exists(self._request):
            time.sleep(POLL_SECONDS)
        try:
            self.dump()
        finally:
            with open(self._ack, "w") as fh:
                fh.write("ok\n")

    def dump(self) -> None:
        """Record the pending collectives and every thread's stack, and flush."""
        writer = self._recorder.writer
        pending = [{"id": r.id, "group": r.group, "seq": r.seq, "op": r.op, "label": r.label}
                   for r in (writer.pending() if writer else [])]
        self._recorder.emit({"kind": schema.HANG, "t": time.time(), "pending": pending,
                             "threads": thread_stacks()})
        self._recorder.flush()
