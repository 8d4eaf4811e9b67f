"""Small functions of the trace that the in-rank runtime needs too: a library call's name,
a collective's element count, whether an exception only reports a lost peer, and the gist
of its message. Kept apart from :mod:`ddpdoctor.trace.model` so that every
process of a job does not import the model's dataclasses at start-up (3.5 ms each)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_MODULE_PATH = re.compile(r"(?:[/\\](?:site|dist)-packages[/\\]"
                          r"|[/\\]lib[/\\]python3[.\d]*[/\\](?!(?:site|dist)-packages))"
                          r"(.+?)(?:[/\\]__init__)?\.py$")


def call_name(path: str, function: str) -> str:
    """'queue.get()', 'multiprocessing.queues.get()': a library call by its module's dotted
    name (the file's name where the module cannot be told)."""
    found = _MODULE_PATH.search(path)
    module = found.group(1).replace("\\", "/").replace("/", ".") if found else \
        path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{function}()"


def numel(shapes: Sequence[Sequence[int]]) -> int:
    """Elements in all the tensors of these shapes."""
    return sum(math.prod(shape) for shape in shapes)


_COMM_TYPES = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"})
_COMM_TEXT = re.compile(
    r"connection closed by peer|connection reset by peer|timed out waiting|broken pipe"
    r"|remote worker crash|nccl error|nccl communicator|process ?group .*(destroyed|aborted)"
    r"|detected at least one rank that exhausted|socket timeout|watchdog caught collective"
    r"|econnreset|econnrefused|connection refused|collective operation timeout", re.I)


def is_comm_error(type_name: str, message: str) -> bool:
    """An exception (by its type's name and message) that reports a peer that went away or a
    wait that ran out: the consequence of a failure elsewhere, not a cause."""
    return type_name in _COMM_TYPES or bool(_COMM_TEXT.search(message))


_SOURCE_TAG = re.compile(r"^\[[^\]]*:\d+\]\s*")


def short_message(message: object, limit: int = 160) -> str:
    """The gist of an exception message: first line, without a leading ``[file:line]`` tag,
    cut after the first sentence ("Connection closed by peer [127.0.0.1]:27060")."""
    lines = str(message or "").strip().splitlines()
    text = _SOURCE_TAG.sub("", lines[0] if lines else "").strip()
    cut = text.find(". ")
    if 20 <= cut:
        text = text[:cut]
    return text if len(text) <= limit else text[:limit - 3] + "..."
