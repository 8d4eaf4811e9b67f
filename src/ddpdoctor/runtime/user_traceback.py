"""The traceback a rank prints, as the user would see it without ddpdoctor.

* ddpdoctor's own frames (its wrappers around torch's collectives and DDP's hooks) are left
  out of every traceback the rank prints (and of an ``mp.spawn`` worker's, which its parent
  prints as text): a user's traceback read under ddpdoctor names the
  same frames as under plain torchrun, and never invites blaming the tool;
* an exception that only reports a lost peer or a wait that ran out (gloo's "Connection closed
  by peer" after another rank failed or left) is a consequence, which the diagnosis names:
  it is printed as one line, and its whole traceback goes to ``traceback-rank-N.txt`` in the
  log folder.

Standard library only: this runs inside every rank.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from types import TracebackType

from ddpdoctor.runtime import user_code
from ddpdoctor.trace import basics, schema


def _is_own(tb: TracebackType) -> bool:
    return user_code.is_own(tb.tb_frame.f_code.co_filename)


def without_own_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` relinked to skip ddpdoctor's frames (the traceback objects are changed)."""
    while tb is not None and _is_own(tb):
        tb = tb.tb_next
    head = tb
    while tb is not None:
        nxt = tb.tb_next
        while nxt is not None and _is_own(nxt):
            nxt = nxt.tb_next
        tb.tb_next = nxt
        tb = nxt
    return head


def without_own_frames_text(text: str) -> str:
    """A formatted traceback without ddpdoctor's frames (each frame's ``File`` line and the
    indented lines under it)."""
    own = "|".join(re.escape(p) for p in user_code.OWN)
    return re.sub(rf'^  File "(?:{own})[^"]*", line \d+, in [^\n]*\n(?:    [^\n]*\n)*', "",
                  text, flags=re.M)


def clean(exc: BaseException) -> None:
    """Leave ddpdoctor's frames out of ``exc`` and the exceptions it was raised from; an
    ``mp.spawn`` worker's traceback, which the parent raises as text, too."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = without_own_frames(e.__traceback__)
        if type(e).__name__ == "ProcessRaisedException" and e.args and \
                isinstance(e.args[0], str):
            e.args = (without_own_frames_text(e.args[0]), *e.args[1:])
            if isinstance(getattr(e, "msg", None), str):
                e.msg = e.args[0]  # type: ignore[attr-defined]  # torch's ProcessException
        todo += [e.__cause__, e.__context__]


def lost_peer(exc: BaseException) -> bool:
    """The exception only reports a peer that went away or a wait that ran out."""
    return basics.is_comm_error(type(exc).__name__, str(exc))


def fold(exc: BaseException, logdir: str, rank: int) -> bool:
    """Print a lost-peer exception as one line, its traceback into the log folder; False
    (print it whole) when the file cannot be written."""
    path = os.path.join(logdir, schema.traceback_file(rank))
    try:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
            fh.write("".join(traceback.format_exception(exc)))
    except OSError:
        return False
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if not user_code.is_library(f.filename)]
    if user:
        where = f" at {os.path.basename(user[-1].filename)}:{user[-1].lineno}"
    sys.stderr.write(f"ddpdoctor: rank {rank} ended on {type(exc).__name__}: "
                     f"{basics.short_message(exc)}{where} - it lost a peer, or waited past its "
                     f"timeout: a consequence the diagnosis explains (traceback: {path})\n")
    return True
