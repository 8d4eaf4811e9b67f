"""The catalogue of known causes, loaded once from ``causes.yaml`` (data, not code)."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    """A known cause: stable id, one-line title, why it breaks, how to fix it, and the names
    of its premises (:mod:`ddpdoctor.analysis.premises`)."""

    id: str
    title: str
    explanation: str
    fix: str
    example: str | None = None
    premises: tuple[str, ...] = ()


@functools.lru_cache(maxsize=1)
def causes() -> dict[str, Cause]:
    """Every known cause by id (read with yaml's safe loader, once per process: libyaml's
    where PyYAML has it, 0.7 ms against 8 ms for the pure-Python one, every report)."""
    # Imported at first use: a job that ends clean reads no cause (ddpdoctor.cli's docstring).
    from importlib import resources

    import yaml

    text = resources.files("ddpdoctor.knowledge").joinpath("causes.yaml").read_text("utf-8")
    entries = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or []
    out: dict[str, Cause] = {}
    for entry in entries:
        cause = Cause(id=str(entry["id"]), title=str(entry["title"]),
                      explanation=str(entry["explanation"]).strip(),
                      fix=str(entry["fix"]).strip(), example=entry.get("example"),
                      premises=tuple(str(p) for p in entry.get("premises") or ()))
        if cause.id in out:
            raise ValueError(f"causes.yaml: duplicate cause id {cause.id!r}")
        out[cause.id] = cause
    return out


def get(cause_id: str | None) -> Cause | None:
    """The cause with this id, or None."""
    return causes().get(cause_id) if cause_id else None
