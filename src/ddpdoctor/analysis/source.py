"""What the user's source says around a line, as the rank captured it.

Each frame of a trace carries the line of code, its indentation and the headers of the blocks
around it, read by the rank that ran it (:mod:`ddpdoctor.runtime.source_capture`): they settle
questions the collectives alone cannot — is this collective inside an ``if rank == 0:`` block,
or after the training loop? Nothing here opens a file: a trace names files, and a report must
neither depend on what is on the machine that reads it nor show a file the trace points at.
Every function returns None when the frame carries no source (a flight-recorder dump).
"""

from __future__ import annotations

import re

from ddpdoctor.trace.model import Site

# ``gpu_id == 0``: PyTorch's own DDP tutorial series tests the rank so (multigpu_torchrun.py);
# ``trainer.is_global_zero``: Lightning's.
_RANK_TEST = re.compile(r"^\s*(el)?if\b.*(rank|is_main|main_process|is_master|master_process"
                        r"|is_primary|primary_process|local_main|gpu_id\s*==|global_zero)", re.I)


def indent(site: Site | None) -> int | None:
    """Indentation of the line at ``site`` (None when not captured)."""
    return site.indent if site is not None else None


def enclosing_blocks(site: Site | None) -> list[tuple[int, str]] | None:
    """The block headers enclosing ``site``, innermost first: [(line, text), ...]."""
    if site is None or site.indent is None:
        return None
    return list(site.blocks)


def rank_condition(site: Site | None) -> tuple[int, str] | None:
    """The ``if rank == 0:``-like header enclosing ``site``, if any."""
    for number, text in enclosing_blocks(site) or []:
        if text.startswith(("def ", "async def ", "class ")):
            break
        if _RANK_TEST.match(text):
            return number, text
    return None
