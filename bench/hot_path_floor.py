"""Stand-ins for ddpdoctor's per-collective recording, for benchmarks that ask what a leaner
recording could at best cost (no part of ddpdoctor).

``floor_issue(group)``: the least any recording in Python can do on the calling thread, in
place of the recording group's ``_issue``: the caller's frame, a number, the caller's code and
instruction as a key, one append to a list, then the backend. ``lean_issue(group)``: all the
per-collective work of ddpdoctor's recording on the calling thread (numbering, shapes, the
labeler's call-path walk, a site looked up by the full key, the previous Work released, the
fields packed into a ring slot with the issue time) in one function whose state is its own
(no recorder, writer, lock or thread-local): what gathering the hot path into one place could
reach. Its ring is private, so the look has no lines to format for it (~1 µs per collective
in one process, bench/RESULTS.md session 41). ``use(variant)`` switches the default group
of a job under ``ddpdoctor run`` to one of :data:`VARIANTS`; a whole-job bench names the
variant in :data:`VARIANT_ENV` (``--hot-paths``, ``overhead.arms``).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from typing import Any

VARIANT_ENV = "DDPDOCTOR_BENCH_HOT_PATH"
# variant: what the calling thread does per collective
VARIANTS = {
    "full": "everything ddpdoctor does",
    "off": "the recording group's Python entry and forwarding, recording off",
    "floor": "the least a Python recording can do: number, caller key, one append",
    "lean": "the recording's per-collective work in one function with its own state",
}
STAND_INS = tuple(name for name in VARIANTS if name != "full")  # what --hot-paths may name


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


def lean_issue(group: Any) -> Callable[..., Any]:
    """A replacement for ``group._issue`` (same arguments) doing the recording's work per
    collective in one function (see the module's docstring)."""
    from ddpdoctor.runtime.pg_wrapper import _Tensor, _tensors
    from ddpdoctor.trace import issue_ring

    getframe, now = sys._getframe, time.time
    place_id = group._recorder.labeler.place_id
    inner, calls = group._inner, {}
    ring = bytearray(issue_ring.size())
    pack, slot_bytes = issue_ring.SLOT.pack_into, issue_ring.SLOT.size
    head, mask = issue_ring.HEAD.size, issue_ring.SLOTS - 1
    sites: dict[tuple, int] = {}
    running: dict[int, Any] = {}  # Works not completed when the next collective came
    state: list[Any] = [0, 0, None]  # seq, id, the last Work

    def lean(op: str, method: str, args: tuple, tensors: Any, reduce_op: Any,
             root: int | None, peer: int | None, p2p: bool, meta: tuple = ()) -> Any:
        st = state
        st[0] = seq = st[0] + 1
        if type(tensors) is list and len(tensors) == 1 and isinstance(t := tensors[0], _Tensor):
            shapes: tuple = ((t.shape, t.dtype),)
        else:
            shapes = _tensors(tensors)
        key = (op, reduce_op, root, peer, shapes, meta, place_id(getframe(2)))
        sid = sites.get(key)
        if sid is None:
            sid = sites[key] = len(sites)
        last, cid = st[2], st[1]
        if last is not None and not (last.is_completed() and last.is_success()):
            running[cid] = last
            if len(running) > 4096:
                running.clear()
        st[1] = cid = cid + 1
        pack(ring, (cid & mask) * slot_bytes + head, cid, now(), seq, 0, 0, 0, sid, cid)
        call = calls.get(method)
        if call is None:
            call = calls[method] = getattr(inner, method)
        st[2] = work = call(*args)
        return work

    return lean


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
        group._issue = (lean_issue if variant == "lean" else floor_issue)(group)
