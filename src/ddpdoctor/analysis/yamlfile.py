"""Reading the YAML files users hand to ddpdoctor (config, schedules): safe, one-line errors."""

from __future__ import annotations

from typing import Any

import yaml


def load(text: str, source: str) -> Any:
    """``yaml.safe_load`` whose error is a one-line ``ValueError`` naming the file and line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{source}: not valid YAML{line}") from None
