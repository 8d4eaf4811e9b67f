"""Stand-ins for ddpdoctor's per-collective recording, for benchmarks that ask what a leaner
recording could at best cost (no part of ddpdoctor).

``floor_issue(group)``: the least any recording in Python can do on the calling thread, in
place of the recording group's ``_issue``: the caller's frame, a number, the caller's code and
instruction as a key, one append to a list, then the backend. ``use(variant)`` switches the
default group of a job under ``ddpdoctor run`` to one of :data:`VARIANTS`; a whole-job bench
names the variant in :data:`VARIANT_ENV` (``overhead.arms(..., floors=True)``).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

VARIANT_ENV = "DDPDOCTOR_BENCH_HOT_PATH"
# variant: what the calling thread does per collective
VARIANTS = {
    "full": "everything ddpdoctor does",
    "off": "the recording group's Python entry and forwarding, recording off",
    "floor": "the least a Python recording can do: number, caller key, one append",
}


def floor_issue(group: Any) -> Callable[..., Any]:
    """A replacement for ``group._issue`` (same arguments) that keeps only the floor."""
    log: list = []
    getframe, numbers = sys._getframe, itertools.count()
    inner, calls = group._inner, {}  # the backend's methods, bound once (as ddpdoctor's)

    def floor(op: str, method: str, args: tuple, tensors: Any, reduce_op: Any,
              root: int | None, peer: int | None, p2p: bool, meta: tuple = ()) -> Any:
        caller = getframe(2)
        log.append((next(numbers), op, id(caller.f_code), caller.f_lasti))
        if len(log) > 4096:
            log.clear()
        call = calls.get(method)
        if call is None:
            call = calls[method] = getattr(inner, method)
        return call(*args)

    return floor


def use(variant: str) -> None:
    """Switch the job's default group (the recording group) to ``variant``."""
    import torch.distributed as dist

    if variant not in VARIANTS:
        raise SystemExit(f"unknown hot-path variant {variant!r}: one of {', '.join(VARIANTS)}")
    if variant == "full":
        return
    group = dist.distributed_c10d._get_default_group()
    if getattr(group, "_issuer", None) is None:
        raise SystemExit("a hot-path variant needs ddpdoctor run's recording group")
    if variant == "off":
        group._enabled = False
    else:
        group._issue = floor_issue(group)
