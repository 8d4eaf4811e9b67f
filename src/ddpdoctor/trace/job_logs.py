"""The logs a job left behind, read for a post-mortem (``ddpdoctor diff`` of a folder holding
no traces): torchrun's per-rank files (``--log-dir``: ``attempt_N/<local rank>/stderr.log``
and torchelastic's ``error.json``), a launcher's combined output (a Slurm ``*.out``, a file
torchrun's output was redirected to), read as text.

Bounded: at most :data:`MAX_FILES` files, :data:`MAX_DEPTH` folders down, the last
:data:`TAIL` bytes of each; links are not followed. Standard library only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

MAX_FILES = 4096
MAX_DEPTH = 6
TAIL = 4 * 1024 * 1024
SUFFIXES = (".log", ".out", ".err", ".txt", ".json")
_LOCAL_RANK_DIR = re.compile(r"^\d+$")


@dataclass
class LogFile:
    """One file's tail, and the rank its place in torchrun's log folder names (the local rank
    folder of ``attempt_N/<local rank>/``), if any."""

    path: Path
    text: str
    rank: int | None = None


def read_tail(path: str | Path, limit: int = TAIL) -> str:
    """The last ``limit`` bytes of a file, as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def find_logs(folder: Path) -> list[LogFile]:
    """Every log-like file under ``folder`` (its tail), in path order."""
    found: list[LogFile] = []
    base = len(folder.parts)
    for root, dirs, files in os.walk(folder, followlinks=False):
        here = Path(root)
        if len(here.parts) - base >= MAX_DEPTH:
            dirs[:] = []
        dirs.sort()
        for name in sorted(files):
            path = here / name
            if not name.endswith(SUFFIXES) or path.is_symlink() or not path.is_file():
                continue
            text = read_tail(path)
            parent = path.parent.name
            rank = int(parent) if _LOCAL_RANK_DIR.match(parent) and \
                path.parent.parent.name.startswith("attempt_") else None
            found.append(LogFile(path, text, rank))
            if len(found) >= MAX_FILES:
                return found
    return found
