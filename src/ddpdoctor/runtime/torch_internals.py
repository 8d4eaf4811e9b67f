"""Every torch-internal name ddpdoctor reaches, in one module, with the check that this torch
has them (:func:`contract_problems`).

A new torch release is this file and ``tests/unit/test_torch_contract.py``: c10d's private
maps and helpers, the backend-registration methods of ``ProcessGroup``, the flight-recorder
dump functions, DDP's forward and join hooks, its Reducer's group and logging data, a
backend's own sequence number, ``mp.spawn``'s and the elastic agent's internals, Dynamo's skip
list, and what the launcher's own process takes from torch (torchrun's parser, the store
client). Modules elsewhere patch or call what this one hands them and name no private torch
attribute themselves (``tests/unit/test_layers.py`` flags any underscored attribute that the
package does not define, wherever else it appears). Two tables of torch's names are data
the trace readers use too, and stay with them: the ``ProcessGroup`` methods the recording
group overrides (torch's own virtual-method names, with each op in ``trace/ops.py``) and the
torch functions whose frames label a DDP collective (``trace/ddp_sites.py``); the contract
test checks both with the rest.

torch is imported inside the functions, never at import: this module is imported in every
Python process of the job, most of which never import torch (light standard-library modules
only at import).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any

VERIFIED = ((2, 6), (2, 15))  # oldest and newest minor release the test suite passed on

# From this release on every group's sequence numbers start at 0 by themselves and
# _set_sequence_number_for_group() only prints that it is deprecated, on every rank.
SEQUENCE_NUMBERS_START_AT_ZERO = (2, 14)

AGENT_MODULE = "torch.distributed.elastic.multiprocessing.api"  # torchrun's worker handling
SPAWN_MODULE = "torch.multiprocessing.spawn"
TORCHRUN_MODULE = "torch.distributed.run"
# torchrun as its console script runs it: ``python -m`` of the module would run it as
# ``__main__``, whose logger is then no torch logger, and its lines would lose torch's prefix
# ("W1129 04:31:01.693000 13573 .../run.py:874] ").
TORCHRUN_ENTRY = (f"import sys; sys.argv[0] = 'torchrun'; from {TORCHRUN_MODULE} import main; "
                  f"sys.exit(main())")
DYNAMO_MODULE = "torch._dynamo"  # imported once torch.compile is about to be used
# The flight recorders a process may have: ProcessGroupNCCL's own (every release) and the
# generic one gloo writes to (from 2.7): not one ring under two names; entries of one job
# may be in either, and a rank's dump is both rings' entries.
FLIGHT_RECORDER_DUMPS = ("_dump_nccl_trace", "_dump_fr_trace")
GLOO_FLIGHT_RECORDER = (2, 7)  # the first release whose gloo groups write flight-recorder entries
_CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as ``2.13.0+cpu``."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def supported(version: str) -> bool:
    """Whether this torch release is in the verified range (:data:`VERIFIED`)."""
    found = minor(version)
    return found is not None and VERIFIED[0] <= found <= VERIFIED[1]


# -- c10d ------------------------------------------------------------------------------------
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


# -- DDP -------------------------------------------------------------------------------------
DDP_PRE_FORWARD = "_pre_forward"  # runs at the start of every DDP forward
JOIN_MAIN_HOOK = "main_hook"  # runs once per shadow iteration of a joined rank


BROADCAST_COALESCED = "_broadcast_coalesced"  # torch.distributed's; DDP's buffer broadcast
BUCKET_ASSIGNMENT = "_compute_bucket_assignment_by_size"  # the chunking it applies


def broadcast_coalesced() -> tuple[Callable[..., None], Callable[..., Any]] | None:
    """torch.distributed's ``_broadcast_coalesced`` (C++: the tensors in chunks of at most
    ``buffer_size`` bytes, one broadcast per chunk; DDP broadcasts its buffers with it in every
    forward and its parameters at construction) and ``_compute_bucket_assignment_by_size``,
    the chunking it applies; None where this torch lacks either."""
    import torch.distributed as dist

    real = getattr(dist, BROADCAST_COALESCED, None)
    assign = getattr(dist, BUCKET_ASSIGNMENT, None)
    return (real, assign) if real is not None and assign is not None else None


DDP_POST_FORWARD = "_post_forward"  # runs at the end of every DDP forward, with its output
REDUCER_GROUP = "_update_process_group"  # moves a DDP model's Reducer to another group
# DDP's methods after which its Reducer's buckets are no longer plain all-reduces on its own
# group: a comm hook, the join protocol's shadow buckets, another process group.
DDP_BUCKET_CHANGERS = ("register_comm_hook", "_register_builtin_comm_hook", "join_hook",
                       REDUCER_GROUP)
BACKEND_SEQUENCE = "_get_sequence_number_for_group"  # a backend's count of collectives
DDP_LOGGING_DATA = "_get_ddp_logging_data"  # DDP's logger's record (its bucket layout)


def sequence_counter(backend: Any) -> Callable[[], int]:
    """What counts the collectives ``backend`` was given (its own sequence number)."""
    return getattr(backend, BACKEND_SEQUENCE)


def ddp_logging_data(ddp: Any) -> Any:
    """What DDP's logger recorded of model ``ddp`` (its bucket sizes, once it rebuilt them)."""
    return getattr(ddp, DDP_LOGGING_DATA)()


def move_reducer(ddp: Any, group: Any) -> None:
    """Point model ``ddp``'s Reducer at ``group`` for its gradient buckets."""
    getattr(ddp.reducer, REDUCER_GROUP)(group)


def per_backward_buckets() -> bool:
    """Whether this torch has what recording DDP's buckets once per backward needs
    (``ddp_buckets``); without it each bucket is recorded as it enters the recording group."""
    import torch
    import torch.distributed as dist
    from torch.autograd import Variable

    ddp, _ = ddp_classes()
    return all(hasattr(ddp, name) for name in (DDP_POST_FORWARD, *DDP_BUCKET_CHANGERS)) and \
        hasattr(dist.Reducer, REDUCER_GROUP) and hasattr(ddp, DDP_LOGGING_DATA) and \
        hasattr(dist.ProcessGroupGloo, BACKEND_SEQUENCE) and \
        hasattr(torch._C, "_will_engine_execute_node") and \
        hasattr(Variable._execution_engine, "queue_callback")


def engine_will_execute() -> Callable[[Any], bool]:
    """The autograd engine's answer to whether the backward now running will run a node
    (callable only during a backward)."""
    import torch

    return torch._C._will_engine_execute_node


def autograd_callback_queue() -> Callable[[Callable[[], None]], None]:
    """What queues a callback to run when the backward now running ends, after those queued
    before it (callbacks queued by a callback run too, after the rest)."""
    from torch.autograd import Variable

    return Variable._execution_engine.queue_callback


def grad_accumulator(param: Any) -> Any:
    """The autograd node that accumulates ``param``'s gradient (the one DDP's Reducer hooks)."""
    return param.view_as(param).grad_fn.next_functions[0][0]


def ddp_classes() -> tuple[Any, Any]:
    """``DistributedDataParallel`` and its join hook class (``_DDPJoinHook``)."""
    from torch.nn.parallel import distributed as ddp_mod

    return ddp_mod.DistributedDataParallel, ddp_mod._DDPJoinHook


# -- launchers -------------------------------------------------------------------------------
AGENT_POLL = "_poll"  # SubprocessContext's: sees each worker's Popen.returncode
SPAWN_WRAP = "_wrap"  # mp.spawn's worker entry: (fn, i, args, error_file)


def agent_process_context() -> type | None:
    """torchrun's ``SubprocessContext`` (whose :data:`AGENT_POLL` sees workers end)."""
    return getattr(importlib.import_module(AGENT_MODULE), "SubprocessContext", None)


def agent_return_channel(frame: FrameType | None) -> tuple[Any, Any, Any] | None:
    """Where torchrun's agent waits for the return value of a rank it runs as a function
    (``--run-path``): (the return queues, the local rank, the event set once the value was
    read), taken from the agent's worker entry found at or above ``frame``; None outside one."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.replace(os.sep, "/").endswith(
                "distributed/elastic/multiprocessing/api.py"):
            found = frame.f_locals
            return (found.get("ret_vals"), found.get("local_rank"),
                    found.get("queue_finished_reading_event"))
        frame = frame.f_back
    return None


def spawn_module() -> ModuleType:
    """``torch.multiprocessing.spawn`` (``ProcessContext``, :data:`SPAWN_WRAP`)."""
    return importlib.import_module(SPAWN_MODULE)


# -- compiler --------------------------------------------------------------------------------
def hide_from_compiler(package: str) -> None:
    """Have Dynamo skip every frame of ``package``, as it skips torch's own."""
    from torch._dynamo import trace_rules

    trace_rules.add(package)


# -- the launcher's own process -------------------------------------------------------------
def import_quietly(module: str) -> ModuleType:
    """``module`` of torch, imported into ddpdoctor's own process with torch's C++ warnings
    off: the store client of a job of several nodes must not print a C++ stack when the node
    that holds the store ends first. torch reads the level once, when it is first imported;
    the variable is put back at once, so the job's environment stays the user's."""
    previous = os.environ.get(_CPP_LOG_LEVEL)
    os.environ[_CPP_LOG_LEVEL] = "ERROR"
    try:
        return importlib.import_module(module)
    finally:
        if previous is None:
            del os.environ[_CPP_LOG_LEVEL]
        else:
            os.environ[_CPP_LOG_LEVEL] = previous


def torchrun_parser() -> Any:
    """A fresh ``argparse`` parser of torchrun's options, as torchrun builds it."""
    return import_quietly(TORCHRUN_MODULE).get_args_parser()


def torchrun_parser_sources() -> list[str]:
    """The files torchrun's parser is made from, found without importing torch (empty where
    torch is not installed): what a cached description of it depends on."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = list(spec.submodule_search_locations)[0]
    files = [os.path.join(root, "distributed", name) for name in ("run.py", "argparse_util.py")]
    return files if all(os.path.exists(f) for f in files) else []


# torchrun's own argparse actions (torch.distributed.argparse_util): ``env`` takes its default
# from PET_<DEST>, ``check_env`` is a flag whose default is PET_<DEST> (0 or 1).
TORCHRUN_ENV_ACTIONS = ("env", "check_env")
TORCHRUN_ENV_PREFIX = "PET_"


def torchrun_env_action(action: Any) -> str | None:
    """Which of :data:`TORCHRUN_ENV_ACTIONS` ``action`` is (None: another kind)."""
    cls = type(action)
    if cls.__module__ == "torch.distributed.argparse_util" and \
            cls.__name__ in TORCHRUN_ENV_ACTIONS:
        return cls.__name__
    return None


def parser_options(parser: Any) -> dict[str, Any]:
    """An ``argparse`` parser's actions by option string (argparse keeps no public map)."""
    return parser._option_string_actions


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


# -- the check -------------------------------------------------------------------------------
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
