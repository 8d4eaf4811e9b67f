"""Python tracebacks in what a rank wrote (its stderr, a log file, torchelastic's error file):
the exception, its user line, and whether it merely reports a peer that vanished.

A file may hold several ranks' lines: torchrun prefixes each line of a rank's traceback with
``[rankN]:``; :func:`own_lines` keeps one rank's. Used by ``attach`` (the stderr tail of a rank
whose script ended) and by the post-mortem of a job's logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.analysis.ranks import is_comm_error
from ddpdoctor.trace.model import Site, is_internal_file

RANK_PREFIX = re.compile(r"^\[(?:default)?rank(\d+)\]:\s?")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(?:.*\n)*?((\w[\w.]*)"
                        r"(?:Error|Exception|Interrupt|Exit|Warning)?\b(?::.*)?)$", re.M)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n(?:[ \t]+(\S.*)\n)?')
_TORCHELASTIC_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)"')


@dataclass
class RaisedError:
    """The last exception of a text: 'ValueError: bad batch', its frames' user line."""

    text: str
    type: str
    site: Site | None = None
    frames: list[Site] = field(default_factory=list)

    @property
    def comm(self) -> bool:
        """A transport error that reports another rank's end or a timeout, not a cause."""
        message = self.text.split(":", 1)[-1]
        return is_comm_error({"type": self.type, "message": message})


def prefixed_ranks(text: str) -> set[int]:
    return {int(m.group(1)) for line in text.splitlines()
            for m in [RANK_PREFIX.match(line)] if m}


def own_lines(text: str, rank: int) -> str:
    """The rank's own lines of a text that ranks may share: where lines carry the
    ``[rankN]:`` prefix, only this rank's (prefix removed): the unprefixed ones are the
    launcher's (torchrun's own ChildFailedError traceback) or unattributable."""
    lines = text.splitlines()
    if not any(RANK_PREFIX.match(line) for line in lines):
        return text
    own = [line[m.end():] for line in lines for m in [RANK_PREFIX.match(line)]
           if m is not None and int(m.group(1)) == rank]
    return "\n".join(own) + "\n"


def last_error(text: str) -> RaisedError | None:
    """The last traceback's exception in ``text`` (or torchelastic's error message)."""
    found = list(_TRACEBACK.finditer(text if text.endswith("\n") else text + "\n"))
    if found:
        block = found[-1]
        frames = [Site(file=m.group(1), line=int(m.group(2)), function=m.group(3),
                       text=(m.group(4) or "").strip())
                  for m in _FRAME.finditer(block.group(0))]
        user = [s for s in frames if not is_internal_file(s.file)]
        return RaisedError(text=block.group(1).strip()[:300], type=block.group(2),
                           site=user[-1] if user else None, frames=frames)
    match = _TORCHELASTIC_MESSAGE.search(text)
    if match:
        message = match.group(1).encode().decode("unicode_escape", "replace")[:300]
        return RaisedError(text=message, type=message.split(":", 1)[0].strip())
    return None
