"""The check that this torch has every private name the recorder relies on."""

from __future__ import annotations

from ddpdoctor.runtime.torch_internals.ddp import DDP_PRE_FORWARD, JOIN_MAIN_HOOK, ddp_classes
from ddpdoctor.runtime.torch_internals.launchers import SPAWN_WRAP, spawn_module


def contract_problems() -> list[str]:
    """The torch behaviours the recorder relies on that this torch lacks (empty: all there)."""
    import inspect

    import torch.distributed as dist

    if not dist.is_available():
        return ["torch.distributed is not available"]
    c10d = dist.distributed_c10d
    ddp, join_hook = ddp_classes()
    spawn = spawn_module()
    checks = {
        "Backend.register_backend(extended_api=)": "extended_api" in inspect.signature(
            dist.Backend.register_backend).parameters,
        "ProcessGroup._register_backend": hasattr(dist.ProcessGroup, "_register_backend"),
        "ProcessGroup._set_default_backend": hasattr(dist.ProcessGroup, "_set_default_backend"),
        "distributed_c10d._world.pg_map": hasattr(getattr(c10d, "_world", None), "pg_map"),
        "distributed_c10d._world.pg_backend_config": hasattr(getattr(c10d, "_world", None),
                                                              "pg_backend_config"),
        "distributed_c10d._get_default_group": hasattr(c10d, "_get_default_group"),
        "distributed_c10d._get_default_store": hasattr(c10d, "_get_default_store"),
        "ProcessGroupGloo": hasattr(dist, "ProcessGroupGloo"),
        f"DistributedDataParallel.{DDP_PRE_FORWARD}": hasattr(ddp, DDP_PRE_FORWARD),
        f"_DDPJoinHook.{JOIN_MAIN_HOOK}": hasattr(join_hook, JOIN_MAIN_HOOK),
        f"multiprocessing.spawn.{SPAWN_WRAP}(fn, i, args, error_file)": list(
            inspect.signature(getattr(spawn, SPAWN_WRAP)).parameters)
        == ["fn", "i", "args", "error_file"],
    }
    return [name for name, ok in checks.items() if not ok]
