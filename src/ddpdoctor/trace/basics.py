"""Two small functions of the trace that the in-rank runtime needs too: a library call's name
and a collective's element count. Kept apart from :mod:`ddpdoctor.trace.model` so that every
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
