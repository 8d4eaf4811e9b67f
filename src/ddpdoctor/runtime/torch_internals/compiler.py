"""Dynamo's private names: the module imported once ``torch.compile`` is about to be used, and
its list of frames it skips."""

from __future__ import annotations

DYNAMO_MODULE = "torch._dynamo"  # imported once torch.compile is about to be used


def hide_from_compiler(package: str) -> None:
    """Have Dynamo skip every frame of ``package``, as it skips torch's own."""
    from torch._dynamo import trace_rules

    trace_rules.add(package)
