"""What ddpdoctor changes in torch to record: backend, group and DDP hooks.

* registers the ``ddpdoctor`` c10d backend whose creator wraps a real ``ProcessGroupGloo`` in
  :class:`RecordingProcessGroup`;
* wraps ``init_process_group`` / ``new_group`` so gloo groups are created through it, then
  restores the name ``gloo`` in c10d's world map (``get_backend()``, DDP's logger and
  ``monitored_barrier`` look the backend up by name);
* switches PyTorch's flight recorder off where it would keep a second record of the
  collectives ddpdoctor records (``flight_recorder_redundant``);
* counts DDP forwards (the ``iteration`` of each record) and join shadow iterations, and records
  each DDP construction with its flags;
* once a recording group exists, records DDP's coalesced broadcasts (buffers, start-up
  parameter sync) per broadcast in Python and runs them on the backend directly
  (``_patch_broadcast_coalesced``), and DDP's gradient buckets once per backward
  (``_patch_ddp_buckets``, ``ddp_buckets.py``);
* records an exception escaping an ``mp.spawn`` worker function (``spawn._wrap`` swallows it);
* with ``DDPDOCTOR_CPU=1`` installs CPU mode first (``cpu_mode.py``), and with
  ``DDPDOCTOR_MAX_STEPS`` stops the rank at the start of DDP iteration N+1 (``max_steps.py``);
  ``DDPDOCTOR_EPOCH_STEPS`` makes every DataLoader pass short (``epoch_steps.py``).

Each of these relies on a torch behaviour that ``torch_internals.contract_problems`` checks at
start-up (and ``tests/unit/test_torch_contract.py`` in more depth); every private torch name is
reached through ``torch_internals``. Torch releases in ``torch_internals.VERIFIED`` passed the
test suite (``scripts/torch-matrix``); on another release ddpdoctor warns once and
records all the same, unless the start-up check finds a behaviour missing: then nothing is
patched, one warning says which, and the job runs untouched.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from ddpdoctor.runtime import env, epoch_steps, max_steps, patches, user_code
from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace import nested_launch

PLUGIN = "ddpdoctor"
_GLOO_NAMES = ("gloo", "cpu:gloo", "cpu:gloo,cuda:gloo", "cuda:gloo,cpu:gloo")

_recorder: Recorder = None  # type: ignore[assignment]  # set by install() before any use
_backend_override: str | None = None


def install(recorder: Recorder, backend_override: str | None) -> bool:
    """Patch torch for recording; returns False (after one warning) when this torch lacks a
    behaviour the recorder needs."""
    global _recorder, _backend_override
    import torch

    if os.environ.get(env.CPU) == "1":
        # CPU mode first: the job cannot run without it, recorded or not.
        from ddpdoctor.runtime import cpu_mode

        cpu_mode.install()
    problems = internals.contract_problems()
    if problems:
        sys.stderr.write(f"ddpdoctor: torch {torch.__version__} lacks what the recorder needs "
                         f"({', '.join(problems)}); the job runs without recording\n")
        return False
    if not internals.supported(torch.__version__) and os.environ.get("RANK", "0") == "0":
        low, high = (".".join(map(str, v)) for v in internals.VERIFIED)
        sys.stderr.write(f"ddpdoctor: torch {torch.__version__} is outside the verified range "
                         f"({low} to {high}); recording anyway\n")
    _recorder = recorder
    _backend_override = backend_override
    recorder.set_internal_dirs(list(user_code.internal_prefixes()))
    max_steps.configure_from_env()
    epoch_steps.install(recorder)
    import torch.distributed as dist

    if not dist.is_available():
        return False
    c10d = dist.distributed_c10d
    dist.Backend.register_backend(PLUGIN, _create_backend, extended_api=True,
                                  devices=["cpu", "cuda"])
    for name, wrap in (("init_process_group", _wrap_init), ("new_group", _wrap_new_group)):
        real = getattr(c10d, name)
        wrapped = wrap(real)
        for module in _holders(name, real):
            patches.replace(module, name, wrapped)
    _patch_ddp()
    _patch_spawn()
    return True


def hide_from_compiler() -> None:
    """Have Dynamo skip every frame of ddpdoctor's code, as it skips torch's own: inside a
    compiled DDP forward, DDP's C++ calls the recording group's Python methods (the bucket
    rebuild's broadcasts), and Dynamo would otherwise try to compile them and fail the job.
    Collectives issued from compiled code still reach the recording group at run time."""
    internals.hide_from_compiler(__name__.split(".")[0])


def _holders(name: str, real: Callable) -> list[Any]:
    """The torch modules whose attribute ``name`` is ``real``: besides ``torch.distributed``,
    those that imported it by name while torch was being imported (``device_mesh``, whose
    ``init_device_mesh`` starts the default group of scripts that never call
    ``init_process_group`` themselves: tensor parallelism)."""
    # vars(), not getattr(): a module's own __getattr__ may import, warn or raise.
    return [module for key, module in sorted(sys.modules.items())
            if (key == "torch" or key.startswith("torch.")) and isinstance(module, ModuleType)
            and vars(module).get(name) is real]


# -- process groups ---------------------------------------------------------------------------
def _create_backend(opts: Any, backend_options: Any) -> Any:
    import torch.distributed as dist

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup

    inner: Any
    devices: tuple[str, ...]
    if _inner_kind == "nccl":
        # DDPDOCTOR_RECORD_NCCL=1 (checked on one GPU by scripts/gpu-check): the same wrapper
        # around ProcessGroupNCCL; completion comes from each Work's future as for gloo.
        nccl_opts = dist.ProcessGroupNCCL.Options()
        internals.set_timeout(nccl_opts, opts.timeout)
        inner = dist.ProcessGroupNCCL(opts.store, opts.group_rank, opts.group_size, nccl_opts)
        kind, devices = dist.ProcessGroup.BackendType.NCCL, ("cuda",)
    else:
        inner = dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size,
                                      timeout=opts.timeout)
        kind, devices = dist.ProcessGroup.BackendType.GLOO, ("cpu", "cuda")
    for name, value in (("global_ranks_in_group", opts.global_ranks_in_group),
                        ("group_name", opts.group_id)):
        try:  # the backend's options carry these from torch 2.8 on
            setattr(inner.options, name, value)
        except AttributeError:
            pass
    internals.start_sequence_numbers(inner)
    pg = RecordingProcessGroup(inner, opts.store, opts.group_rank, opts.group_size,
                               opts.group_id, _recorder)
    internals.attach_backend(pg, inner, kind, devices)
    # Here, not in install(): a process that imports torch and makes no group (torchrun's
    # agent, a spawned DataLoader worker) does not import pg_wrapper or ddp_buckets for them.
    _patch_broadcast_coalesced()
    _patch_ddp_buckets()
    return pg


FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"  # entries of PyTorch's flight recorder; 0: off
# the same, as torch releases before the flight recorder's own name spelled it
_FR_SETTINGS = (FR_BUFFER_SIZE, "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_redundant(inner_kind: str, environ: Mapping[str, str]) -> bool:
    """Whether PyTorch's flight recorder would only keep what ddpdoctor records: the job's
    groups are gloo groups ddpdoctor wraps and no NCCL group can follow (no CUDA device, or
    CPU mode), and the user did not size the recorder. Its size is read once per process
    and holds for every group, so a GPU host keeps it for the NCCL groups it may make."""
    if inner_kind != "gloo" or any(name in environ for name in _FR_SETTINGS):
        return False
    if environ.get(env.CPU) == "1":
        return True
    import torch

    return not torch.cuda.is_available()


_NCCL_NAMES = ("nccl", "cuda:nccl")
_inner_kind = "gloo"  # what the next recording group wraps: gloo, or nccl (opt-in)


def _recordable(backend: Any) -> bool:
    """Whether groups of ``backend`` are recorded: gloo always, NCCL only with
    ``DDPDOCTOR_RECORD_NCCL=1`` (checked on one GPU); sets what the group wraps."""
    global _inner_kind
    name = str(backend).lower() if backend is not None else None
    if name is None:
        import torch

        name = "nccl" if torch.cuda.is_available() else "gloo"
    _inner_kind = "nccl" if name in _NCCL_NAMES else "gloo"
    if _inner_kind == "nccl":
        return os.environ.get(env.RECORD_NCCL) == "1"
    return name in _GLOO_NAMES


def _finish_group(pg: Any) -> None:
    """Give a recording group back its gloo name and record its identity."""
    import torch.distributed as dist

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup

    if not isinstance(pg, RecordingProcessGroup):
        return
    nccl = pg._inner.name().lower() == "nccl"
    internals.name_group_backend(pg, "nccl" if nccl else "gloo",
                                 "cuda:nccl" if nccl else "cpu:gloo,cuda:gloo")
    pg._name = pg.group_name
    _recorder.group_created({"group": pg.group_name, "desc": pg.group_desc,
                             "ranks": dist.get_process_group_ranks(pg), "size": pg.size(),
                             "group_rank": pg.rank(), "backend": "nccl" if nccl else "gloo"})


def _wrap_init(real: Callable) -> Callable:
    if getattr(real, "_ddpdoctor", False):
        return real

    @functools.wraps(real)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        if _torchrun_worker_child():  # workers started with multiprocessing.Process
            raise _nested_launch(sys._getframe(1))
        if "backend" in kwargs:
            backend = kwargs.pop("backend")
        if _backend_override:
            backend = _backend_override
        recording = _recordable(backend) and os.environ.get(env.FLIGHT_RECORDER) != "1"
        if recording and flight_recorder_redundant(_inner_kind, os.environ):
            # Read once, when the first group is made: PyTorch would keep a second record
            # of every collective ddpdoctor records (2.13 and 2.15 keep 2,000 by default).
            os.environ[FR_BUFFER_SIZE] = "0"
        if not recording:
            # What ddpdoctor does not record itself, PyTorch's flight recorder does; the
            # watchdog dumps it into the log folder on a hang (read back by ``diff``).
            os.environ.setdefault(FR_BUFFER_SIZE, "2000")
            _recorder.flight_recorder = True
        if _recorder.group_ready:  # made again after destroy_process_group: a new round
            _recorder.next_round()
        rank = kwargs.get("rank", -1)
        if rank is None or rank < 0:
            rank = int(os.environ.get("RANK", "-1"))
        if rank >= 0:  # known before the rendezvous: a rank stuck in it is visible
            _recorder.start(rank, int(kwargs.get("world_size", -1) or -1), None)
        _recorder.init_started(str(backend) if backend is not None else None)
        try:
            result = real(PLUGIN if recording else backend, *args, **kwargs)
        except BaseException:
            _recorder.init_done(False)
            raise
        pg = internals.default_group()
        name = _inner_kind if recording else str(dist.get_backend())
        _recorder.start(dist.get_rank(), dist.get_world_size(), name)
        _recorder.init_done(True)
        if recording:
            _finish_group(pg)
        else:
            why = "--flight-recorder" if os.environ.get(env.FLIGHT_RECORDER) == "1" else \
                "ddpdoctor records gloo groups; --cpu runs the script on gloo"
            _recorder.warn(f"backend {name!r}: collectives are kept by PyTorch's flight "
                           f"recorder, dumped on a hang ({why})")
            if dist.get_rank() == 0:
                sys.stderr.write(f"ddpdoctor: backend {name!r}: collectives are kept by "
                                 f"PyTorch's flight recorder and dumped on a hang ({why})\n")
        return result

    init_process_group._ddpdoctor = True  # type: ignore[attr-defined]
    return init_process_group


def _wrap_new_group(real: Callable) -> Callable:
    if getattr(real, "_ddpdoctor", False):
        return real

    @functools.wraps(real)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        if len(args) >= 3:
            args = list(args)  # type: ignore[assignment]  # args[2] is replaced below
            backend = args[2]
        else:
            backend = kwargs.get("backend")
        default = internals.default_group()
        from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup

        recorded = isinstance(default, RecordingProcessGroup)
        if recorded and backend is None:  # the default group's backend, not the last group's
            global _inner_kind
            _inner_kind = "nccl" if default.getBackendName() in _NCCL_NAMES else "gloo"
        if recorded and (backend is None or _recordable(backend)):
            if isinstance(args, list):
                args[2] = PLUGIN
            else:
                kwargs["backend"] = PLUGIN
        elif backend is not None:
            # An NCCL group beside recorded gloo ones: only the flight recorder keeps its
            # collectives (its size was read with the first group), dumped on a hang.
            _recorder.flight_recorder = True
        pg = real(*args, **kwargs)
        if pg is not None and pg is not dist.GroupMember.NON_GROUP_MEMBER:
            _finish_group(pg)
        return pg

    new_group._ddpdoctor = True  # type: ignore[attr-defined]
    return new_group


# -- DDP --------------------------------------------------------------------------------------
def _patch_broadcast_coalesced() -> None:
    """DDP's buffer broadcasts (every forward) and parameter sync (construction) on a recording
    group are recorded by the group's issuer, one record per broadcast, and run without
    entering Python once per broadcast (``_Issuer.broadcast_coalesced``); on any other group,
    as they are."""
    import torch.distributed as dist

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup

    found = internals.broadcast_coalesced()
    if found is None or getattr(found[0], "_ddpdoctor", False):
        return  # none: each broadcast reaches the recording group from C++, recorded there
    real, assign = found

    def _broadcast_coalesced(process_group: Any, tensors: Any, buffer_size: int,
                             src: int = 0) -> None:
        if type(process_group) is RecordingProcessGroup:
            return process_group._issuer.broadcast_coalesced(real, process_group, tensors,
                                                             buffer_size, src, assign)
        return real(process_group, tensors, buffer_size, src)

    _broadcast_coalesced._ddpdoctor = True  # type: ignore[attr-defined]
    patches.replace(dist, internals.BROADCAST_COALESCED, _broadcast_coalesced)


def _patch_ddp() -> None:
    ddp, join_hook = internals.ddp_classes()
    if getattr(ddp, "_ddpdoctor", False):
        return
    real_init = ddp.__init__
    real_pre = getattr(ddp, internals.DDP_PRE_FORWARD)
    real_main_hook = getattr(join_hook, internals.JOIN_MAIN_HOOK)

    @functools.wraps(real_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        try:
            _recorder.ddp_constructed(_ddp_flags(self, sys._getframe(1)))
        except Exception as exc:  # flags are enrichment; never fail the model
            _recorder.warn(f"could not read DDP flags: {exc}")

    @functools.wraps(real_pre)
    def _pre_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        max_steps.check(_recorder)  # --max-steps: stop before iteration N+1 issues anything
        _recorder.next_iteration()
        return real_pre(self, *args, **kwargs)

    @functools.wraps(real_main_hook)
    def main_hook(self: Any) -> None:
        max_steps.check(_recorder)
        _recorder.next_iteration()
        real_main_hook(self)

    patches.replace(ddp, "__init__", __init__)
    patches.replace(ddp, internals.DDP_PRE_FORWARD, _pre_forward)
    patches.replace(join_hook, internals.JOIN_MAIN_HOOK, main_hook)
    patches.replace(ddp, "_ddpdoctor", True)


def _patch_ddp_buckets() -> None:
    """DDP's gradient buckets recorded once per backward (``ddp_buckets``): its forward's end
    arms the record; what changes how the Reducer issues its buckets ends it for the model."""
    ddp, _ = internals.ddp_classes()
    if os.environ.get(env.BUCKETS_EACH) == "1" or not internals.per_backward_buckets():
        return
    real_post = getattr(ddp, internals.DDP_POST_FORWARD)
    if getattr(real_post, "_ddpdoctor", False):
        return
    from ddpdoctor.runtime import ddp_buckets

    @functools.wraps(real_post)
    def _post_forward(self: Any, output: Any) -> Any:
        output = real_post(self, output)
        ddp_buckets.after_forward(self)
        return output

    _post_forward._ddpdoctor = True  # type: ignore[attr-defined]
    patches.replace(ddp, internals.DDP_POST_FORWARD, _post_forward)
    for name in internals.DDP_BUCKET_CHANGERS:
        patches.replace(ddp, name, _exact_first(getattr(ddp, name), ddp_buckets.exact))


def _exact_first(real: Callable, exact: Callable[[Any], None]) -> Callable:
    @functools.wraps(real)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        exact(self)
        return real(self, *args, **kwargs)

    return method


def _ddp_flags(model: Any, frame: Any) -> dict:
    module = model.module
    params = [p for p in module.parameters() if p.requires_grad]
    site = None
    while frame is not None:
        if not user_code.is_internal(frame.f_code.co_filename):
            site = {"file": frame.f_code.co_filename, "line": frame.f_lineno,
                    "function": frame.f_code.co_name}
            break
        frame = frame.f_back
    return {"module": type(module).__name__, "broadcast_buffers": bool(model.broadcast_buffers),
            "find_unused_parameters": bool(model.find_unused_parameters),
            "bucket_cap_mb": model.bucket_bytes_cap / (1024 * 1024),
            "static_graph": bool(model.static_graph),
            "gradient_as_bucket_view": bool(model.gradient_as_bucket_view),
            "parameters": len(params),
            "buffers": sum(1 for _ in module.buffers()),
            "device_ids": [str(d) for d in (model.device_ids or [])],
            "group": getattr(model.process_group, "group_name", None),
            "site": site}


# -- mp.spawn ---------------------------------------------------------------------------------
def _patch_spawn() -> None:
    spawn = internals.spawn_module()
    if getattr(spawn, internals.SPAWN_WRAP) is not _spawn_wrap:
        global _real_spawn_wrap
        _real_spawn_wrap = patches.replace(spawn, internals.SPAWN_WRAP, _spawn_wrap)
    if _torchrun_worker():
        # mp.spawn calls start_processes from its own module's globals.
        for module in (spawn, importlib.import_module("torch.multiprocessing")):
            patches.replace(module, "start_processes",
                            _refuse_nested_launch(module.start_processes))


def _torchrun_worker() -> bool:
    """A rank that ``ddpdoctor run`` started through torchrun."""
    return os.environ.get(env.LAUNCHER) == "torchrun" and "RANK" in os.environ and \
        "TORCHELASTIC_RUN_ID" in os.environ


def _torchrun_worker_child() -> bool:
    """A process started by a torchrun rank with ``multiprocessing`` (it inherits the rank's
    environment): a worker of a script that starts its own, when it joins a process group.
    Not a rank torchrun itself started with multiprocessing (``--run-path``): its parent is
    torchrun's agent, the job's top process."""
    import multiprocessing

    return _torchrun_worker() and multiprocessing.parent_process() is not None and \
        os.environ.get(env.TOP_PID) != str(os.getppid())


class NestedLaunch(RuntimeError):
    """Raised where a torchrun rank starts workers of its own; printed by nobody (the
    launcher says what to do, once)."""


def _nested_launch(frame: Any) -> RuntimeError:
    """Report a script that starts its own workers, run under torchrun, found at ``frame``:
    every torchrun rank would start a whole job of its own, on the same ports (the job hangs
    or fails to bind). The error to raise there."""
    site = user_code.first_user_frame(frame)
    nested_launch.report(os.environ[env.LOGDIR], int(os.environ["RANK"]),
                         site.f_code.co_filename if site else None,
                         site.f_lineno if site else None)
    return NestedLaunch("ddpdoctor: this script starts its own workers; run it with "
                        "ddpdoctor run --launcher python")


def _refuse_nested_launch(real: Callable) -> Callable:
    def start_processes(*args: Any, **kwargs: Any) -> Any:
        raise _nested_launch(sys._getframe(1))

    start_processes.__wrapped__ = real  # type: ignore[attr-defined]
    return start_processes


_real_spawn_wrap: Callable | None = None


def _spawn_wrap(fn: Callable, i: int, args: tuple, error_file: str) -> None:
    """``torch.multiprocessing.spawn._wrap`` that records an exception of the worker."""

    def recorded(*a: Any) -> Any:
        from ddpdoctor.runtime.parent_death import die_with_parent

        die_with_parent()  # torch's _wrap just set SIGINT, which a blocked worker ignores
        try:
            return fn(*a)
        except Exception as exc:
            if _recorder is not None:
                _recorder.exception(exc)
            raise

    real = _real_spawn_wrap
    if real is None:  # recording is off in this process: torch's own _wrap is in place
        real = getattr(internals.spawn_module(), internals.SPAWN_WRAP)
    real(recorded, i, args, error_file)
    if _recorder is not None:
        _recorder.close()
