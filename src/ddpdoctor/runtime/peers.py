"""Several nodes, one view: ranks share their state through the job's own c10d store.

Each node's ``ddpdoctor run`` reads only its own ranks' traces, yet a hang is global: rank 0
may wait in a barrier on node 0 while rank 5 saves a checkpoint on node 1. So in a job of
several nodes every rank's watchdog publishes a small summary of its state once a second
under ``ddpdoctor/<run id>/<rank>`` in the store the process group already uses (the
rendezvous store torchrun runs; no protocol of ddpdoctor's own), and local rank 0 of each node
reads everyone's summaries back into its trace as a ``peers`` record, which that node's
launcher reads like the rest of the trace. Standard library only (the store is torch's).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ddpdoctor.trace.model import numel

KEY = "ddpdoctor/{run}/{rank}"
MAX_PENDING = 8  # pending collectives a summary lists


def multi_node() -> bool:
    """Whether this rank's world spans several nodes (torchrun's environment)."""
    world = int(os.environ.get("WORLD_SIZE", "0") or 0)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    return world > local > 0


def summary(recorder: Any, now: float, activity: dict | None) -> dict:
    """This rank's state, as the launcher's monitor needs it for another node's rank."""
    writer = recorder.writer
    pending = []
    for r in (writer.pending() if writer is not None else [])[:MAX_PENDING]:
        shapes = [list(shape) for shape, _ in r.tensors]
        dtypes = [str(dtype).replace("torch.", "") for _, dtype in r.tensors]
        site = r.stack[0] if r.stack else None
        pending.append({"id": r.id, "group": r.group, "seq": r.seq, "op": r.op,
                        "label": r.label, "shapes": shapes, "dtypes": dtypes,
                        "numel": numel(shapes), "t": r.t,
                        "reduce_op": getattr(r.reduce_op, "name", r.reduce_op)
                        if r.reduce_op is not None else None, "root": r.root, "peer": r.peer,
                        "site": list(site) if site else None})
    return {"t": round(now, 3), "status": recorder.status(), "iteration": recorder.iteration,
            "world_size": recorder.world_size, "issued": dict(writer.issued) if writer else {},
            "completed": writer.completed if writer else 0, "pending": pending,
            "activity": activity}


class Peers:
    """Publishes this rank's summary and, on local rank 0, reads every rank's."""

    def __init__(self, store: Any, run_id: str, rank: int, world: int) -> None:
        self.store = store
        self.run_id = run_id or "run"
        self.rank = rank
        self.world = world
        self.reader = os.environ.get("LOCAL_RANK", "0") == "0"

    def publish(self, state: dict) -> None:
        self.store.set(KEY.format(run=self.run_id, rank=self.rank), json.dumps(state))

    def others(self) -> dict[str, dict]:
        """Every other rank's last summary (ranks that published none are left out)."""
        keys = [KEY.format(run=self.run_id, rank=r) for r in range(self.world) if r != self.rank]
        # multi_get waits for missing keys: one check of all of them, key by key only while
        # some rank has not published yet.
        present = keys if self.store.check(keys) else [k for k in keys if self.store.check([k])]
        out: dict[str, dict] = {}
        for key, raw in zip(present, self.store.multi_get(present) if present else []):
            try:
                out[key.rsplit("/", 1)[1]] = json.loads(bytes(raw).decode())
            except (ValueError, UnicodeDecodeError):
                continue
        return out


def connect(recorder: Any) -> Peers | None:
    """A :class:`Peers` on the default group's store, in a multi-node job; else None."""
    if not multi_node() or not recorder.group_ready:
        # Not before init_process_group returned: this runs on the watchdog's thread, which
        # must never import torch while the main thread may still be importing it (a second
        # thread then sees a half-initialised torch._C, and the main thread's import fails).
        return None
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    store = dist.distributed_c10d._get_default_store()
    return Peers(store, recorder.run_id, dist.get_rank(), dist.get_world_size())
