"""CPU mode (``ddpdoctor run --cpu``): a script written for GPUs runs unmodified on the CPU.

Installed in every rank by :func:`ddpdoctor.runtime.torch_hooks.install` when the launcher set
``DDPDOCTOR_CPU=1``. What is mapped, exactly (``docs/cpu-mode.md`` says the same for users):

* **devices** - a torch function mode moves every CUDA device argument to the CPU: ``device=``
  of the factory functions (``torch.zeros(..., device=f"cuda:{i}")``, ``torch.tensor``,
  ``new_*``, ``*_like``, ...), ``tensor.to(local_rank)`` / ``.to("cuda")`` /
  ``.to(device=...)``; ``tensor.cuda(...)`` and ``tensor.pin_memory()`` return the tensor.
  The mode is pushed in the thread that imports torch (the main thread), so forked DataLoader
  workers have it too; other threads do not.
* **modules** - ``module.to(local_rank)`` / ``.to("cuda:0")`` keep the module on the CPU
  (its dtype change still applies); ``module.cuda()`` returns the module;
  ``torch.set_default_device("cuda")`` sets the CPU.
* **torch.cuda** - for the script's own code ``is_available()`` is True and ``device_count()``
  is the number of processes per node (``DDPDOCTOR_CPU_DEVICES``); torch and installed
  libraries keep seeing the real answers (False, 0), so they stay on their CPU paths.
  ``set_device(i)`` is remembered and ``current_device()`` returns it (``LOCAL_RANK``
  before); ``with torch.cuda.device(i):``, ``synchronize()`` and
  ``reset_peak_memory_stats()`` do nothing; ``get_device_name()`` says it is the CPU.
* **torch.accelerator** - the same for the script's own code: ``is_available()`` is True,
  ``current_accelerator()`` is ``cuda``, ``device_count()`` the processes per node,
  ``set_device_index()`` / ``current_device_index()`` remembered, ``synchronize()`` nothing.
* **distributed** - ``init_process_group`` gets gloo for nccl (the launcher also sets
  ``DDPDOCTOR_BACKEND=gloo``) and loses a CUDA ``device_id``;
  ``DistributedDataParallel(device_ids=[i], output_device=i)`` becomes a CPU module's DDP
  (both set to None).
* **data** - ``DataLoader(pin_memory=True)`` runs with ``pin_memory=False``;
  ``torch.load(map_location=...)`` with a CUDA location (string, ``torch.device``, int, or
  the values of a dict) or none at all loads onto the CPU.

Not mapped: CUDA streams, events, graphs and generators (``torch.Generator(device="cuda")``),
``get_device_properties``, ``mem_get_info``, legacy ``torch.cuda.FloatTensor`` types,
``Storage.cuda()`` and a callable ``map_location``, custom CUDA kernels and extensions,
``SyncBatchNorm`` (needs a GPU), tensors created in threads other than the main one; checks
such as ``tensor.is_cuda`` or ``dist.get_backend() == "nccl"`` see the truth (False,
``"gloo"``). Mixed precision (``torch.autocast("cuda")``, ``GradScaler``) is disabled by torch
itself with a warning. Standard library and torch only: this runs inside every rank.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

from ddpdoctor.runtime import patches, user_code
from ddpdoctor.runtime.env import CPU_DEVICES

NCCL_NAMES = frozenset({"nccl", "cuda:nccl", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo"})

_installed = False
_current_device: int | None = None


# -- helpers ----------------------------------------------------------------------------------
def is_cuda_device(value: Any) -> bool:
    """Whether ``value`` names a CUDA device: an int (not a bool), ``"cuda"``, ``"cuda:N"``,
    or a ``torch.device`` of type cuda."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, str):
        return value.strip().lower().startswith("cuda")
    return getattr(value, "type", None) == "cuda" and type(value).__name__ == "device"


@functools.lru_cache(maxsize=1)
def _cpu() -> Any:
    import torch

    return torch.device("cpu")


def map_location(location: Any) -> Any:
    """A ``torch.load`` ``map_location`` with every CUDA target replaced by the CPU."""
    if location is None or is_cuda_device(location):
        return "cpu"
    if isinstance(location, dict):
        return {k: ("cpu" if is_cuda_device(v) else v) for k, v in location.items()}
    return location


def from_user_code(depth: int = 2) -> bool:
    """Whether the frame ``depth`` levels up is the script's own code, not torch, ddpdoctor,
    the standard library or an installed package."""
    try:
        filename = sys._getframe(depth).f_code.co_filename
    except ValueError:
        return False
    return not user_code.is_library(filename)


def device_count() -> int:
    """What ``torch.cuda.device_count()`` answers the script: one device per local process."""
    for name in (CPU_DEVICES, "LOCAL_WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def _device_index(device: Any) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    index = getattr(device, "index", None)
    if isinstance(device, str) and ":" in device:
        try:
            index = int(device.rsplit(":", 1)[1])
        except ValueError:
            index = None
    return index if isinstance(index, int) else 0


# -- the torch function mode ------------------------------------------------------------------
def _make_mode() -> Any:
    import torch
    from torch.overrides import TorchFunctionMode

    tensor_cuda, tensor_pin, tensor_to = (torch.Tensor.cuda, torch.Tensor.pin_memory,
                                          torch.Tensor.to)

    class CudaToCpuMode(TorchFunctionMode):
        """Moves CUDA device arguments of torch functions and tensor methods to the CPU."""

        def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                               kwargs: dict | None = None) -> Any:
            if kwargs is None:
                kwargs = {}
            if func is tensor_cuda or func is tensor_pin:
                return args[0]
            if func is tensor_to:
                args = tuple(_cpu() if is_cuda_device(a) else a for a in args)
            device = kwargs.get("device")
            if device is not None and is_cuda_device(device):
                kwargs = dict(kwargs, device=_cpu())
            return func(*args, **kwargs)

    return CudaToCpuMode()


# -- patches ----------------------------------------------------------------------------------
def _patch_cuda(torch: Any) -> None:
    cuda = torch.cuda
    real_available, real_count = cuda.is_available, cuda.device_count

    @functools.wraps(real_available)
    def is_available() -> bool:
        return True if from_user_code() else real_available()

    @functools.wraps(real_count)
    def count() -> int:
        return device_count() if from_user_code() else real_count()

    def set_device(device: Any) -> None:
        global _current_device
        _current_device = _device_index(device)

    def current_device() -> int:
        if _current_device is not None:
            return _current_device
        value = os.environ.get("LOCAL_RANK", "0")
        return int(value) if value.isdigit() else 0

    def synchronize(device: Any = None) -> None:
        return None

    def get_device_name(device: Any = None) -> str:
        return "cpu (ddpdoctor --cpu)"

    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    class device(cuda.device):  # type: ignore[name-defined]  # noqa: N801 - torch's name, isinstance
        """``torch.cuda.device`` that changes nothing (CPU mode)."""

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    for name, fn in (("is_available", is_available), ("device_count", count),
                     ("set_device", set_device), ("current_device", current_device),
                     ("synchronize", synchronize), ("get_device_name", get_device_name),
                     ("reset_peak_memory_stats", reset_peak_memory_stats), ("device", device)):
        patches.replace(cuda, name, fn)
    _patch_accelerator(torch, set_device, current_device, synchronize)


def _patch_accelerator(torch: Any, set_device: Any, current_device: Any, synchronize: Any) -> None:
    """``torch.accelerator`` (torch >= 2.6) answers the script's own code as ``torch.cuda``
    does in CPU mode: available, CUDA, one device per local process."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return
    real_available = getattr(acc, "is_available", None)
    real_current = getattr(acc, "current_accelerator", None)
    real_count = getattr(acc, "device_count", None)

    def is_available() -> bool:
        return True if from_user_code() else bool(real_available and real_available())

    def current_accelerator(*args: Any, **kwargs: Any) -> Any:
        if from_user_code():
            return torch.device("cuda")
        return real_current(*args, **kwargs) if real_current else None

    def count() -> int:
        return device_count() if from_user_code() else (real_count() if real_count else 0)

    def set_device_index(device: Any) -> None:
        set_device(device)

    def current_device_index() -> int:
        return current_device()

    replacements = {"is_available": is_available, "current_accelerator": current_accelerator,
                    "device_count": count, "set_device_index": set_device_index,
                    "set_device_idx": set_device_index,
                    "current_device_index": current_device_index,
                    "current_device_idx": current_device_index, "synchronize": synchronize}
    for name, fn in replacements.items():
        if hasattr(acc, name):
            patches.replace(acc, name, fn)


def _patch_modules(torch: Any) -> None:
    module = torch.nn.Module
    real_to = module.to

    @functools.wraps(real_to)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_cpu() if is_cuda_device(a) else a for a in args)
        if is_cuda_device(kwargs.get("device")):
            kwargs["device"] = _cpu()
        return real_to(self, *args, **kwargs)

    def cuda(self: Any, device: Any = None) -> Any:
        return self

    patches.replace(module, "to", to)
    patches.replace(module, "cuda", cuda)
    real_default = torch.set_default_device

    @functools.wraps(real_default)
    def set_default_device(device: Any) -> None:
        real_default(_cpu() if is_cuda_device(device) else device)

    patches.replace(torch, "set_default_device", set_default_device)


def _patch_data(torch: Any) -> None:
    import torch.serialization
    import torch.utils.data

    loader = torch.utils.data.DataLoader
    real_init = loader.__init__

    @functools.wraps(real_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) > 7:  # dataset is self's first argument; pin_memory is the 8th
            args = args[:7] + (False,) + args[8:]
        if "pin_memory" in kwargs:
            kwargs["pin_memory"] = False
        real_init(self, *args, **kwargs)

    patches.replace(loader, "__init__", __init__)
    real_load = torch.serialization.load

    @functools.wraps(real_load)
    def load(f: Any, map_location_: Any = None, *args: Any, **kwargs: Any) -> Any:
        if "map_location" in kwargs:
            map_location_ = kwargs.pop("map_location")
        return real_load(f, map_location(map_location_), *args, **kwargs)

    patches.replace(torch, "load", load)
    patches.replace(torch.serialization, "load", load)


def _patch_distributed(torch: Any) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    c10d = dist.distributed_c10d
    real_init = c10d.init_process_group

    @functools.wraps(real_init)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            backend = kwargs.pop("backend")
        if backend is not None and str(backend).lower() in NCCL_NAMES:
            backend = "gloo"
        if is_cuda_device(kwargs.get("device_id")):
            kwargs["device_id"] = None
        if len(args) >= 8 and is_cuda_device(args[7]):  # device_id, positionally
            args = args[:7] + (None,) + args[8:]
        return real_init(backend, *args, **kwargs)

    patches.replace(c10d, "init_process_group", init_process_group)
    patches.replace(dist, "init_process_group", init_process_group)

    from torch.nn.parallel import distributed as ddp_mod

    ddp = ddp_mod.DistributedDataParallel
    real_ddp_init = ddp.__init__

    @functools.wraps(real_ddp_init)
    def ddp_init(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        args = tuple(None if i < 2 else a for i, a in enumerate(args))  # device_ids, output
        for name in ("device_ids", "output_device"):
            if name in kwargs:
                kwargs[name] = None
        real_ddp_init(self, module, *args, **kwargs)

    patches.replace(ddp, "__init__", ddp_init)


def install() -> bool:
    """Map CUDA to the CPU in this process (idempotent); False when torch is not importable."""
    global _installed
    if _installed:
        return True
    try:
        import torch
    except ImportError:
        return False
    _patch_cuda(torch)
    _patch_modules(torch)
    _patch_data(torch)
    _patch_distributed(torch)
    mode = _make_mode()
    mode.__enter__()  # stays pushed for the life of the process (this thread)
    patches.on_uninstall("CUDA-to-CPU TorchFunctionMode", lambda: mode.__exit__(None, None, None))
    _installed = True
    return True

