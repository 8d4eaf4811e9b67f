"""c10d's private names: the default group and store, a group's backends, a backend's
sequence numbers, ``Work`` from a future, the flight recorder's dumps, the store clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpdoctor.runtime.torch_internals.loading import import_quietly
from ddpdoctor.runtime.torch_internals.versions import SEQUENCE_NUMBERS_START_AT_ZERO, minor

# The flight recorders a process may have: ProcessGroupNCCL's own (every release) and the
# generic one gloo writes to (from 2.7): not one ring under two names; entries of one job
# may be in either, and a rank's dump is both rings' entries.
FLIGHT_RECORDER_DUMPS = ("_dump_nccl_trace", "_dump_fr_trace")


def default_group() -> Any:
    """The default process group (None before ``init_process_group``)."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_group() if dist.is_initialized() else None


def default_store() -> Any:
    """The default group's store."""
    import torch.distributed as dist

    return dist.distributed_c10d._get_default_store()


def name_group_backend(group: Any, name: str, config: str) -> None:
    """Set the backend name (``get_backend()``, DDP's logger and ``monitored_barrier`` look it
    up) and backend config c10d keeps for ``group``."""
    import torch.distributed as dist

    world = dist.distributed_c10d._world
    _, store = world.pg_map[group]
    world.pg_map[group] = (name, store)
    world.pg_backend_config[group] = config


def attach_backend(group: Any, backend: Any, kind: Any, devices: tuple[str, ...]) -> None:
    """Make ``backend`` (of ``ProcessGroup.BackendType`` ``kind``) serve ``group`` on
    ``devices``, and its default."""
    import torch

    for device in devices:
        group._register_backend(torch.device(device), kind, backend)
    group._set_default_backend(kind)


def set_timeout(options: Any, timeout: Any) -> None:
    """The timeout of a ``ProcessGroupNCCL.Options``."""
    options._timeout = timeout


def start_sequence_numbers(backend: Any) -> None:
    """Have a backend made outside c10d number its collectives as c10d's own do (from 0)."""
    import torch

    if (minor(torch.__version__) or (0, 0)) < SEQUENCE_NUMBERS_START_AT_ZERO:
        backend._set_sequence_number_for_group()


def work_from_future() -> Callable[[Any], Any] | None:
    """c10d's constructor of a ``Work`` from a future (None where this torch has none)."""
    import torch

    return getattr(torch._C._distributed_c10d, "_create_work_from_future", None)


def flight_recorder_dump() -> dict:
    """Every flight-recorder entry of this process, merged from the rings torch has (torch's
    own in-process pickle of its own ring: never a file)."""
    import pickle

    import torch

    c10d = torch._C._distributed_c10d
    merged: dict | None = None
    errors = []
    for name in FLIGHT_RECORDER_DUMPS:
        dump_fn = getattr(c10d, name, None)
        if dump_fn is None:
            continue
        try:
            dump = pickle.loads(dump_fn(includeCollectives=True, includeStackTraces=True))
        except Exception as exc:  # a ring that is off, or a build without it
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if not isinstance(dump, dict):
            continue
        if merged is None:
            merged = dump
            continue
        merged.setdefault("entries", []).extend(dump.get("entries") or [])
        for key in ("pg_config", "pg_status"):
            if isinstance(dump.get(key), dict):
                merged.setdefault(key, {}).update(dump[key])
    if merged is None:
        raise RuntimeError("; ".join(errors) or "this torch has no flight-recorder dump")
    return merged


def store_client(host: str, port: int, timeout_s: float) -> Any:
    """A client of a running ``TCPStore`` (torchrun's rendezvous store)."""
    from datetime import timedelta

    store = import_quietly("torch.distributed").TCPStore
    return store(host, port, is_master=False, wait_for_workers=False,
                 timeout=timedelta(seconds=timeout_s))


def store_server(timeout_s: float) -> Any:
    """A ``TCPStore`` served by this process on a free port (its ``port``), on every
    interface."""
    from datetime import timedelta

    store = import_quietly("torch.distributed").TCPStore
    return store("0.0.0.0", 0, is_master=True, wait_for_workers=False,
                 timeout=timedelta(seconds=timeout_s))
