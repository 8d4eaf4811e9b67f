"""A script that starts its own workers, run under torchrun: the rank tells the launcher.

``ddpdoctor run train.py`` starts torchrun by default. When ``train.py`` starts its own
workers (``torch.multiprocessing.spawn``, or ``multiprocessing.Process`` workers that call
``init_process_group``: the patterns of many tutorials), every torchrun rank would start a
whole job of its own, on the same ports, and the job hangs or fails to bind: a launch
mistake, not the user's bug. The rank refuses the spawn (the worker its ``init_process_group``)
and leaves
``nested-launch.json`` in the log folder (:func:`report`); the launcher reads it
(:func:`message`) and tells the user how to run the script instead of diagnosing a crash.
Standard library only: imported inside every rank.
"""

from __future__ import annotations

import json
import os

from ddpdoctor.trace import schema


def report(logdir: str | os.PathLike[str], rank: int, file: str | None,
           line: int | None) -> None:
    """Rank ``rank`` was asked to spawn workers at ``file:line``; the first rank's word stays."""
    path = os.path.join(logdir, schema.NESTED_LAUNCH)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:  # another rank said it first (or the folder is gone)
        return
    with open(fd, "w") as fh:
        json.dump({"rank": rank, "file": file, "line": line}, fh)


def message(logdir: str | os.PathLike[str], script: str) -> str | None:
    """What to tell the user who ran ``script``, when a rank reported a nested launch; else
    None."""
    try:
        with open(os.path.join(logdir, schema.NESTED_LAUNCH), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    file, line = data.get("file"), data.get("line")
    site = f" ({os.path.basename(str(file))}:{line})" if file and isinstance(line, int) else ""
    return (f"{script} starts its own worker processes{site}, so under "
            f"torchrun every rank started a whole job of its own; nothing was diagnosed. "
            f"Run it as its own launcher: ddpdoctor run --launcher python {script} ...")
