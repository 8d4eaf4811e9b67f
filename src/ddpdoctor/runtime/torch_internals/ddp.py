"""DDP's private names: its forward and join hooks, its Reducer's group, its logging data, the
coalesced broadcast of its buffers, the autograd engine's callbacks it runs on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
