"""Everything ddpdoctor changes in torch inside a rank, in one registry.

Each patch (recording: ``torch_hooks``; CPU mode: ``cpu_mode``; exit codes: ``exit_codes``) goes
through :func:`replace`, which remembers what was there, or registers its own undo with
:func:`on_uninstall` (CPU mode's TorchFunctionMode). :func:`uninstall_all` undoes everything in
reverse order, so patches stacked on one attribute (CPU mode's ``init_process_group`` over the
recorder's) unwind correctly. Standard library only: this runs inside every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MISSING = object()
# (what was patched, how to undo it), in the order installed.
_PATCHES: list[tuple[str, Callable[[], None]]] = []


def replace(owner: Any, name: str, new: Any) -> Any:
    """Set ``owner.name`` to ``new``; returns what ``owner.name`` was (the callee to wrap)."""
    current = getattr(owner, name, None)
    # A class's own attribute is put back; an inherited (or absent) one is deleted again.
    before = vars(owner).get(name, _MISSING) if isinstance(owner, type) else \
        getattr(owner, name, _MISSING)

    def undo() -> None:
        if before is _MISSING:
            try:
                delattr(owner, name)
            except AttributeError:
                pass
        else:
            setattr(owner, name, before)

    _PATCHES.append((f"{getattr(owner, '__name__', type(owner).__name__)}.{name}", undo))
    setattr(owner, name, new)
    return current


def on_uninstall(what: str, undo: Callable[[], None]) -> None:
    """Register a change made another way (a mode pushed, a backend registered)."""
    _PATCHES.append((what, undo))


def uninstall_all() -> None:
    """Undo every patch, last first."""
    while _PATCHES:
        _, undo = _PATCHES.pop()
        undo()
