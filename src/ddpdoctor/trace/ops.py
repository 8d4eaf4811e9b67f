"""Every operation a process group runs, in one table: the recording group's methods
(``runtime/pg_wrapper.py``), the flight-recorder reader's names (``trace/flight_recorder.py``)
and the analysis's classes of op (reducing, rooted, point to point, uneven sizes) all read it.

:data:`NOT_RECORDED` lists the ``ProcessGroup`` methods deliberately left to torch, each with
its reason; ``tests/unit/test_op_coverage.py`` enumerates the installed torch's API and fails
on any entry point that is in neither. Standard library only (imported inside every rank).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One operation: ``name`` as traces and reports write it; ``methods``, the names torch
    calls on a process group for it (the recording group defines each); ``backend``, the
    backend's method the recording group forwards to; ``fr_names``, the flight recorder's
    names besides ``name``; where the tensors and the options are among the call's
    arguments (``tensors``, ``opts``; None where the method is written by hand); and what
    the op is: ``reduces`` (a reduce op), ``rooted`` (a src/dst rank), ``p2p`` (between two
    ranks), ``uneven`` (sizes may differ per rank: split sizes, an any-source receive),
    ``splits`` (each rank's amounts to and from every other rank are recorded, ``sends`` and
    ``recvs``: they must agree pairwise); ``since``: the torch release that added it, where
    that is newer than 2.6."""

    name: str
    methods: tuple[str, ...]
    backend: str
    tensors: int | None = None
    opts: int | None = None
    fr_names: tuple[str, ...] = ()
    reduces: bool = False
    rooted: bool = False
    p2p: bool = False
    uneven: bool = False
    splits: bool = False
    since: tuple[int, int] = (2, 6)


OPS: tuple[Op, ...] = (
    # Written by hand in the recording group (a hot path, or arguments of their own).
    Op("all_reduce", ("allreduce",), "allreduce", fr_names=("allreduce",), reduces=True),
    Op("broadcast", ("broadcast",), "broadcast", rooted=True),
    Op("barrier", ("barrier",), "barrier"),
    # Not a ProcessGroup method: torch.distributed calls it on the group object from Python.
    Op("monitored_barrier", ("monitored_barrier",), "monitored_barrier"),
    Op("send", ("send",), "send", p2p=True),
    Op("recv", ("recv",), "recv", p2p=True),
    Op("recv_anysource", ("recv_anysource",), "recv_anysource", fr_names=("recvAnysource",),
       p2p=True, uneven=True),
    # Forwarded as they come: tensors and options by position.
    Op("all_reduce_coalesced", ("allreduce_coalesced",), "allreduce_coalesced", 0, 1,
       fr_names=("allreduce_coalesced",), reduces=True),
    Op("all_gather", ("allgather",), "allgather", 1, fr_names=("allgather",)),
    Op("all_gather_coalesced", ("allgather_coalesced",), "allgather_coalesced", 1),
    Op("all_gather_into_tensor", ("all_gather_single", "_allgather_base"), "_allgather_base", 1,
       fr_names=("_allgather_base",)),
    Op("all_gather_into_tensor_coalesced",
       ("all_gather_single_coalesced", "allgather_into_tensor_coalesced"),
       "allgather_into_tensor_coalesced", 1, fr_names=("allgather_into_tensor_coalesced",)),
    Op("reduce", ("reduce",), "reduce", 0, 1, reduces=True, rooted=True),
    Op("reduce_scatter", ("reduce_scatter",), "reduce_scatter", 1, 2, reduces=True),
    Op("reduce_scatter_tensor", ("reduce_scatter_single", "_reduce_scatter_base"),
       "_reduce_scatter_base", 1, 2, fr_names=("_reduce_scatter_base",), reduces=True),
    Op("reduce_scatter_tensor_coalesced",
       ("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced"),
       "reduce_scatter_tensor_coalesced", 1, 2, reduces=True),
    Op("all_to_all", ("alltoall",), "alltoall", 1, fr_names=("alltoall",), uneven=True,
       splits=True),
    Op("all_to_all_single", ("all_to_all_single", "alltoall_base"), "alltoall_base", 1,
       fr_names=("alltoall_base",), uneven=True, splits=True),
    Op("gather", ("gather",), "gather", 1, 2, rooted=True, splits=True),
    # torch 2.15: one input tensor gathered into one output tensor on the root.
    Op("gather_into_tensor", ("gather_single", "gather_into_tensor"), "gather_single", 1, 2,
       fr_names=("gather_single",), rooted=True, since=(2, 15)),
    Op("scatter", ("scatter",), "scatter", 0, 2, rooted=True, splits=True),
)

BY_NAME = {op.name: op for op in OPS}
# Flight-recorder op names (after "nccl:" / "gloo:") -> ours.
FR_NAMES = {fr: op.name for op in OPS for fr in (op.name, *op.fr_names)}
REDUCING = frozenset(op.name for op in OPS if op.reduces)
# c10d's reduce ops (ReduceOp.RedOpType), as a trace names them: anything else is damage.
REDUCE_OPS = frozenset({"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR",
                        "PREMUL_SUM", "UNUSED"})
ROOTED = frozenset(op.name for op in OPS if op.rooted)
P2P = frozenset(op.name for op in OPS if op.p2p)
UNEVEN = frozenset(op.name for op in OPS if op.uneven)
SPLITS = frozenset(op.name for op in OPS if op.splits)
# Groups larger than this record no split sizes: a line would carry two lists of this length.
MAX_SPLIT_RANKS = 1024

# ProcessGroup methods the recording group leaves to torch, and why. Every other public
# method of torch's ProcessGroup must be recorded (one of OPS' methods).
NOT_RECORDED: dict[str, str] = {
    "_start_coalescing": "a bracket around coalesced ops, forwarded: the ops inside are recorded",
    "_end_coalescing": "the end of that bracket, forwarded",
    "abort": "ends the group's communicators (teardown), no collective",
    "shutdown": "ends the group (teardown), no collective",
    "set_timeout": "a setting, no collective",
    "split_group": "makes a new group from this one (NCCL's communicator split); its "
                   "collectives go unrecorded: not yet wrapped",
    "merge_remote_group": "joins a group with another (a store exchange); not yet wrapped",
    "get_group_store": "returns the group's store",
    "bound_device_id": "a property",
    "group_desc": "a property",
    "group_name": "a property",
    "name": "the backend's name",
    "rank": "this rank's number in the group",
    "size": "the group's size",
    "boxed": "a handle for torch.compile's custom ops, no collective",
    "unbox": "the reverse of boxed",
    "use_pg_for_symm_mem_rendezvous": "a setting for symmetric memory, no collective",
    "get_backend": "returns the backend object (torch 2.15): calls made on it bypass the "
                   "group, and go unrecorded",
    "get_reconfigure_handle": "a handle for fault-tolerant reconfiguration, no collective",
    "reconfigure": "re-forms the group's peers (fault tolerance, torch 2.15): not yet recorded",
    "new_window": "sets up a one-sided communication window (torch 2.15); one-sided puts and "
                  "gets do not pair up across ranks: not yet recorded",
    "register_pre_hook": "torch's own hook before each collective", "register_post_hook":
    "torch's own hook after each collective", "register_abort_hook": "torch's own hook on abort",
    "unregister_pre_hook": "removes such a hook", "unregister_post_hook": "removes such a hook",
    "unregister_abort_hook": "removes such a hook", "supports_abort_hooks": "a query",
    "supports_completion_hooks": "a query", "supports_reconfigure": "a query",
    "supports_window": "a query",
    "BackendType": "an enum",
    "CUSTOM": "an enum value", "GLOO": "an enum value", "MPI": "an enum value",
    "NCCL": "an enum value", "UCC": "an enum value", "UNDEFINED": "an enum value",
    "XCCL": "an enum value",
}

# torch.distributed's functions (distributed_c10d.__all__) that issue operations: what each
# reaches the group with. They are recorded there, whoever calls them.
ISSUING: dict[str, tuple[str, ...]] = {
    "all_reduce": ("all_reduce",), "all_reduce_coalesced": ("all_reduce_coalesced",),
    "broadcast": ("broadcast",), "barrier": ("barrier", "all_reduce"),
    "monitored_barrier": ("monitored_barrier",),
    "all_gather": ("all_gather", "all_gather_into_tensor"),
    "all_gather_coalesced": ("all_gather_coalesced",),
    "all_gather_into_tensor": ("all_gather_into_tensor",),
    "all_gather_single": ("all_gather_into_tensor",),
    "all_gather_object": ("all_gather", "all_gather_into_tensor"),
    "broadcast_object_list": ("broadcast",), "gather": ("gather",),
    "gather_single": ("gather_into_tensor",), "gather_into_tensor": ("gather_into_tensor",),
    "gather_object": ("all_gather", "gather"), "scatter": ("scatter",),
    "scatter_object_list": ("scatter", "broadcast"), "reduce": ("reduce",),
    "reduce_scatter": ("reduce_scatter",), "reduce_scatter_tensor": ("reduce_scatter_tensor",),
    "reduce_scatter_single": ("reduce_scatter_tensor",),
    "all_to_all": ("all_to_all",), "all_to_all_single": ("all_to_all_single",),
    "send": ("send",), "recv": ("recv", "recv_anysource"), "isend": ("send",),
    "irecv": ("recv", "recv_anysource"), "batch_isend_irecv": ("send", "recv"),
    "send_object_list": ("send",), "recv_object_list": ("recv", "recv_anysource"),
}
# The others, and why they issue nothing to record (or are recorded another way).
NOT_ISSUING: dict[str, str] = {
    "init_process_group": "makes the default group (wrapped: its group records)",
    "new_group": "makes a group (wrapped: its group records)",
    "new_subgroups": "makes groups through new_group (they record)",
    "new_subgroups_by_enumeration": "makes groups through new_group (they record)",
    "destroy_process_group": "ends groups (teardown)",
    "split_group": "makes a group by splitting NCCL's communicator: not yet wrapped, its "
                   "collectives go unrecorded",
    "shrink_group": "makes a smaller group without some ranks: not yet wrapped, its "
                    "collectives go unrecorded",
    "record_comm": "names collectives for the profiler (a context manager)",
    "get_backend": "a query", "get_backend_config": "a query", "get_debug_level": "a query",
    "get_default_backend_for_device": "a query", "get_global_rank": "a query",
    "get_group_rank": "a query", "get_node_local_rank": "a query", "get_pg_count": "a query",
    "get_process_group_ranks": "a query", "get_rank": "a query", "get_world_size": "a query",
    "is_backend_available": "a query", "is_gloo_available": "a query",
    "is_initialized": "a query", "is_mpi_available": "a query", "is_nccl_available": "a query",
    "is_torchelastic_launched": "a query", "is_ucc_available": "a query",
    "is_xccl_available": "a query", "supports_complex": "a query",
    "reduce_op": "a deprecated enum",
    "group": "the class that holds the default group (group.WORLD)",
    "get_backend_impl": "returns the backend object (torch 2.15): calls made on it bypass the "
                        "group, and go unrecorded",
    "set_timeout": "a setting",
}
