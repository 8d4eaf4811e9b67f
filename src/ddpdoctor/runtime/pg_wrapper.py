"""The recording process group: a ``torch.distributed.ProcessGroup`` subclass around gloo.

C++ callers (DDP's Reducer, ``_broadcast_coalesced``, ``_verify_params_across_processes``)
and Python callers (``torch.distributed.*``, join, object collectives) all reach the methods
below through pybind's trampoline, so every collective of the group is seen here. Each method
records what it is about to run, forwards to the real backend object *directly* (forwarding
through the C++ base dispatcher re-enters Python and hangs) and attaches the returned
``Work`` so the writer can tell pending from completed. A recording error never stops the
collective: recording is switched off with one warning and the call goes through.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace import schema


def _tensors(value: Any) -> tuple:
    """((shape, dtype), ...) of a tensor, a list of tensors or a list of lists of tensors."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        if len(value) == 1:  # the common case: one tensor (DDP's buckets, dist.all_reduce)
            t = value[0]
            if isinstance(t, torch.Tensor):
                return ((t.shape, t.dtype),)
        try:  # a flat list of tensors
            return tuple([(t.shape, t.dtype) for t in value])
        except AttributeError:
            out: list = []
            for item in value:
                out.extend(_tensors(item))
            return tuple(out)
    return ((value.shape, value.dtype),)


# Reduce op names by the hash of their ``ReduceOp``, which is its ``RedOpType`` value in the
# torch versions checked (reading ``.op.value`` makes two pybind objects: 0.6 µs a call). An
# entry is added only where hash and value agree, so a torch whose ReduceOp hashes otherwise
# takes the slow path every time instead of mislabelling.
_REDUCE_OP_NAMES: dict[int, str] = {}


def _reduce_op(opts: Any) -> Any:
    """The name of the reduce op in ``opts`` ("SUM"): a str, cheap to hash and compare where
    pybind's enum is not (its hash and == are calls into C++)."""
    try:
        op = opts.reduceOp
        name = _REDUCE_OP_NAMES.get(hash(op))
        if name is not None:
            return name
        kind = op.op
    except AttributeError:
        op = getattr(opts, "reduceOp", opts)
        op = getattr(op, "op", op)
        return getattr(op, "name", op)
    name = kind.name
    if hash(op) == kind.value:
        _REDUCE_OP_NAMES[kind.value] = name
    return name


def group_of(backend: Any, rank: int, size: int) -> Any:
    """A process group whose only backend is ``backend`` (for the devices it serves)."""
    kinds = dist.ProcessGroup.BackendType
    name = backend.name()
    kind = {"gloo": kinds.GLOO, "nccl": kinds.NCCL}.get(name, kinds.CUSTOM)
    group = dist.ProcessGroup(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
    for device in (("cuda",) if name == "nccl" else ("cpu", "cuda")):
        group._register_backend(torch.device(device), kind, backend)
    group._set_default_backend(kind)
    return group


def _forwarded(op: str, method: str, tensors: int, opts: int | None = None,
               reduce: bool = False, root: bool = False) -> Callable[..., Any]:
    """A method that records ``op`` and forwards its arguments to the backend's ``method``:
    the tensors are argument ``tensors``; the options (argument ``opts``) give the reduce op
    and the root when ``reduce`` / ``root``."""
    def forward(self: RecordingProcessGroup, *args: Any) -> Any:
        options = args[opts] if opts is not None and len(args) > opts else None
        return self._issue(op, method, args, args[tensors],
                           _reduce_op(options) if reduce else None,
                           root=getattr(options, "rootRank", None) if root else None)

    forward.__name__ = forward.__qualname__ = op
    return forward


class RecordingProcessGroup(dist.ProcessGroup):
    """Records every operation of one group and forwards it to the wrapped backend."""

    def __init__(self, inner: Any, store: Any, rank: int, size: int, name: str,
                 recorder: Recorder) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
        self._inner = inner
        self._recorder = recorder
        self._name = name
        self._seq = 0
        self._p2p_seq = 0
        self._enabled = True
        self._direct: Any = None  # see _bound
        self._calls: dict[str, Callable[..., Any]] = {}

    # -- recording --------------------------------------------------------------------------
    def _issue(self, op: str, method: str, args: tuple, tensors: Any = None,
               reduce_op: Any = None, root: int | None = None, peer: int | None = None,
               p2p: bool = False) -> Any:
        """Record ``op``, then run ``method`` of the wrapped backend with ``args``."""
        cid = None
        if self._enabled and self._recorder.writer is not None:
            try:
                # Collectives and point-to-point ops are numbered apart: p2p ops pair up
                # between two ranks, not across the group.
                if p2p:
                    self._p2p_seq += 1
                    seq, p2p_seq = None, self._p2p_seq
                else:
                    self._seq += 1
                    seq, p2p_seq = self._seq, None
                # The caller of allreduce() etc.; None when C++ called it with no Python
                # frame above (DDP's Reducer on the autograd engine's CUDA device thread).
                caller = sys._getframe(1).f_back
                cid = self._recorder.record(self._name, seq, p2p_seq, op, _tensors(tensors),
                                            reduce_op, root, peer, caller)
            except Exception as exc:  # never let recording break the user's collective
                self._enabled = False
                message = (f"recording stopped for group {self._name}: "
                           f"{type(exc).__name__}: {exc}")
                sys.stderr.write(f"ddpdoctor: {message}\n")
                try:
                    self._recorder.warn(message, lost=True)
                except Exception:  # the writer itself is broken: its cut marker says so
                    pass
        try:
            call = self._calls.get(method)
            if call is None:
                call = self._calls[method] = self._bound(method)
            work = call(*args)
        except BaseException:
            if cid is not None:
                self._recorder.writer.works[cid] = schema.FAILED  # type: ignore[union-attr]
            raise
        if cid is not None:  # the writer was there when the collective was recorded
            self._recorder.writer.works[cid] = work  # type: ignore[union-attr]
        return work

    def _bound(self, method: str) -> Callable[..., Any]:
        """The wrapped backend's ``method``, bound (looked up once per method). Gloo and NCCL
        implement the coalesced all-gather and reduce-scatter (FSDP2's, DTensor's) in C++ only,
        with no Python binding: they are reached through a process group that holds the
        wrapped backend alone, whose binding dispatches to it (never through this group, which
        would re-enter here)."""
        try:
            return getattr(self._inner, method)
        except AttributeError:
            if self._direct is None:
                self._direct = group_of(self._inner, self.rank(), self.size())
            return getattr(self._direct, method)

    # -- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return self._inner.name()

    # -- collectives (names as torch calls them; some have two) --------------------------
    def allreduce(self, *args: Any) -> Any:
        opts = args[1] if len(args) > 1 else None
        return self._issue("all_reduce", "allreduce", args, args[0], _reduce_op(opts))

    def broadcast(self, *args: Any) -> Any:
        root = getattr(args[1], "rootRank", None) if len(args) > 1 else None
        if len(args) > 1 and isinstance(args[1], int):
            root = args[1]
        return self._issue("broadcast", "broadcast", args, args[0], root=root)

    def barrier(self, opts: Any = None) -> Any:
        return self._issue("barrier", "barrier", () if opts is None else (opts,))

    # The rest follow one pattern (_forwarded); the stubs type each backend method precisely,
    # and every method here forwards *args as is.
    allreduce_coalesced = _forwarded("all_reduce_coalesced", "allreduce_coalesced", 0, 1,
                                     reduce=True)
    allgather = _forwarded("all_gather", "allgather", 1)
    allgather_coalesced = _forwarded("all_gather_coalesced", "allgather_coalesced", 1)
    all_gather_single = _allgather_base = _forwarded(
        "all_gather_into_tensor", "_allgather_base", 1)
    all_gather_single_coalesced = allgather_into_tensor_coalesced = _forwarded(
        "all_gather_into_tensor_coalesced", "allgather_into_tensor_coalesced", 1)
    reduce = _forwarded("reduce", "reduce", 0, 1, reduce=True, root=True)
    reduce_scatter = _forwarded("reduce_scatter", "reduce_scatter", 1, 2, reduce=True)
    reduce_scatter_single = _reduce_scatter_base = _forwarded(
        "reduce_scatter_tensor", "_reduce_scatter_base", 1, 2, reduce=True)
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced = _forwarded(
        "reduce_scatter_tensor_coalesced", "reduce_scatter_tensor_coalesced", 1, 2, reduce=True)
    alltoall = _forwarded("all_to_all", "alltoall", 1)
    all_to_all_single = alltoall_base = _forwarded(
        "all_to_all_single", "alltoall_base", 1)
    gather = _forwarded("gather", "gather", 1, 2, root=True)
    scatter = _forwarded("scatter", "scatter", 0, 2, root=True)

    # -- point to point ---------------------------------------------------------------------
    def send(self, *args: Any) -> Any:
        return self._issue("send", "send", args, args[0], peer=args[1], p2p=True)

    def recv(self, *args: Any) -> Any:
        return self._issue("recv", "recv", args, args[0], peer=args[1], p2p=True)

    def recv_anysource(self, *args: Any) -> Any:
        return self._issue("recv_anysource", "recv_anysource", args, args[0], p2p=True)

    # -- coalescing brackets: forwarded, not recorded ----------------------------------------
    def _start_coalescing(self, *args: Any) -> Any:
        return self._inner._start_coalescing(*args)

    def _end_coalescing(self, *args: Any) -> Any:
        return self._inner._end_coalescing(*args)

