"""Text that came from a trace, made safe to show: no terminal control sequences, no NUL.

A trace is data written by the user's processes (exception messages, function and file
names): a crafted one could clear the terminal, set its title or plant OSC 8 links. Every
reporter renders a report passed through :func:`clean_report`, which copies it with every
string stripped of control characters (tab and newline kept); Markdown's also escapes HTML and
link syntax (:func:`markdown_text`); XML escaping is the XML library's.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypeVar

from ddpdoctor.analysis.report import Report

# ESC-introduced sequences (CSI, OSC ... BEL/ST, single-character escapes), then any other C0
# or C1 control character except tab and newline.
_SEQUENCES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\\\)?|\x1b[@-_]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

T = TypeVar("T")


def clean(text: str) -> str:
    """``text`` without terminal control sequences and control characters."""
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


def markdown_text(text: str) -> str:
    """:func:`clean` text that Markdown shows as written: no HTML, no links."""
    return (clean(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("](", "]\\("))


def _map(value: T, fn: Callable[[str], str], memo: dict[int, Any]) -> T:
    """``value`` with ``fn`` applied to every string in it; the same object where nothing
    changed, and one result per object however often the report refers to it (1024 ranks'
    details share their call stacks)."""
    if isinstance(value, str):
        new_text = fn(value)
        return value if new_text == value else new_text  # type: ignore[return-value]
    key = id(value)
    if key in memo:
        return memo[key]
    out: Any = value
    if isinstance(value, (list, tuple)):
        items = [_map(v, fn, memo) for v in value]
        if any(a is not b for a, b in zip(items, value)):
            out = items if isinstance(value, list) else tuple(items)
    elif isinstance(value, dict):
        pairs = [(_map(k, fn, memo), _map(v, fn, memo)) for k, v in value.items()]
        if any(a is not k or b is not v for (a, b), (k, v) in zip(pairs, value.items())):
            out = dict(pairs)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if not f.init:
                continue
            old = getattr(value, f.name)
            new = _map(old, fn, memo)
            if new is not old:
                changes[f.name] = new
        if changes:
            out = dataclasses.replace(value, **changes)
    memo[key] = out
    return out


def clean_report(report: Report, fn: Callable[[str], str] = clean) -> Report:
    """A copy of ``report`` whose every string went through ``fn`` (:func:`clean`); what no
    string of changed is shared with ``report``."""
    return _map(report, fn, {})
