"""The user's source around a frame, captured once in the rank that ran it.

A report shows the line of code of each rank and uses the lines around it (is this collective
under ``if rank == 0:``? after the training loop?). That text is read here, in the rank, where
the script surely is, and stored in the trace with the frame: ``text`` (the line), ``indent``
(its indentation) and ``blocks`` (the headers of the blocks that enclose it, innermost first,
up to its function's ``def``). ``ddpdoctor diff`` then never opens a file a trace names, and a
report is the same on another machine. Cached per line; standard library only.
"""

from __future__ import annotations

import linecache
from functools import lru_cache

MAX_LOOKBACK = 200  # lines searched upwards for enclosing block headers
MAX_TEXT = 240


def _indent(text: str) -> int:
    expanded = text.expandtabs(4)
    return len(expanded) - len(expanded.lstrip())


@lru_cache(maxsize=4096)
def capture(file: str, line: int) -> dict:
    """``{"text", "indent", "blocks"}`` of ``file:line``, or {} when it cannot be read."""
    lines = linecache.getlines(file)
    if not lines or not 0 < line <= len(lines) or not lines[line - 1].strip():
        return {}
    current = _indent(lines[line - 1])
    blocks: list[list] = []
    level = current
    for number in range(line - 1, max(0, line - 1 - MAX_LOOKBACK), -1):
        text = lines[number - 1]
        stripped = text.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if _indent(text) < level:
            level = _indent(text)
            blocks.append([number, stripped[:MAX_TEXT]])
            if level == 0 or stripped.startswith(("def ", "async def ", "class ")):
                break
    return {"text": lines[line - 1].strip()[:MAX_TEXT], "indent": current, "blocks": blocks}


def frame(file: str, line: int, function: str) -> dict:
    """A frame record with its source captured (when readable)."""
    return {"file": file, "line": line, "function": function, **capture(file, line)}
