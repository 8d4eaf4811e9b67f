"""The YAML files users hand to ddpdoctor (config, schedules): read safely with one-line errors,
written with ``yaml.safe_dump``; PyYAML imported at first use (ddpdoctor.cli's docstring)."""

from __future__ import annotations

from typing import Any


def load(text: str, source: str) -> Any:
    """``yaml.safe_load`` whose error is a one-line ``ValueError`` naming the file and line."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{source}: not valid YAML{line}") from None


def dump(value: Any, **options: Any) -> str:
    """``yaml.safe_dump(value, **options)``."""
    import yaml

    return str(yaml.safe_dump(value, **options))
