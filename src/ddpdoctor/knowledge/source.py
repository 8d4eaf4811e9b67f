"""What the user's source says around a line, when the file is readable here.

Traces carry file, line and function, not code. When ``ddpdoctor`` runs where the script
lives (the usual case: ``ddpdoctor run`` diagnoses right after the job), the code settles
questions the traces cannot: is this collective inside an ``if rank == 0:`` block, or after
the training loop? Every function returns None when the file cannot be read.
"""

from __future__ import annotations

import linecache
import os
import re

from ddpdoctor.trace.model import Site

_MAX_LOOKBACK = 200
_RANK_TEST = re.compile(r"^\s*(el)?if\b.*(rank|is_main|main_process|is_master|master_process"
                        r"|is_primary|primary_process|local_main)", re.I)


def _lines(site: Site | None) -> list[str] | None:
    if site is None or not site.file or not os.path.isfile(site.file):
        return None
    lines = linecache.getlines(site.file)
    if not lines or not 0 < site.line <= len(lines):
        return None
    return lines


def _indent(text: str) -> int:
    expanded = text.expandtabs(4)
    return len(expanded) - len(expanded.lstrip())


def indent(site: Site | None) -> int | None:
    """Indentation of the line at ``site`` (None if unreadable or blank)."""
    lines = _lines(site)
    if lines is None or not lines[site.line - 1].strip():
        return None
    return _indent(lines[site.line - 1])


def enclosing_blocks(site: Site | None) -> list[tuple[int, str]] | None:
    """The block headers enclosing ``site``, innermost first: [(line, text), ...]."""
    lines = _lines(site)
    if lines is None:
        return None
    current = _indent(lines[site.line - 1])
    out: list[tuple[int, str]] = []
    for number in range(site.line - 1, max(0, site.line - 1 - _MAX_LOOKBACK), -1):
        text = lines[number - 1]
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        level = _indent(text)
        if level < current:
            out.append((number, stripped))
            current = level
            if level == 0 or stripped.startswith(("def ", "async def ", "class ")):
                break
    return out


def rank_condition(site: Site | None) -> tuple[int, str] | None:
    """The ``if rank == 0:``-like header enclosing ``site``, if any."""
    blocks = enclosing_blocks(site)
    for number, text in blocks or []:
        if text.startswith(("def ", "async def ", "class ")):
            break
        if _RANK_TEST.match(text):
            return number, text
    return None
