"""How a set of ranks is written in words: 'rank 3', 'ranks 0, 2', 'ranks 0-127, 129-255'.

Shared by the reader's notes and the analysis' findings, so that a report writes ranks one way.
"""

from __future__ import annotations

from collections.abc import Iterable


def rank_list(ranks: Iterable[int]) -> str:
    """'rank 3', 'ranks 0, 2', 'ranks 0-127, 129-255'."""
    items = sorted(set(ranks))
    if not items:
        return "no rank"
    return ("rank " if len(items) == 1 else "ranks ") + rank_numbers(items)


def rank_numbers(ranks: Iterable[int]) -> str:
    """'3', '0, 2', '0-127, 129-255': the ranks of :func:`rank_list` without the word."""
    items = sorted(set(ranks))
    if not items:
        return ""
    spans: list[str] = []
    start = prev = items[0]
    for r in items[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        spans.append(str(start) if start == prev else
                     f"{start}, {prev}" if prev == start + 1 else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(spans)
