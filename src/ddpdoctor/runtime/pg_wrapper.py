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

import math
import operator
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.runtime import on_behalf, writer
from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace import ops, schema

_getframe = sys._getframe
_now = time.time
_behalf = on_behalf._local  # on_behalf.current(), read inline on the hot path
_marked = on_behalf.marked_threads
_failure_check_chosen = False  # the first group chooses how the writer asks a Work
_Tensor = torch.Tensor
_STRIDED = torch.strided


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


def quiet_failure_check() -> bool:
    """Whether ``Work.is_success()`` can tell the writer a failed collective from a completed
    one without printing anything. Torch warns from C++, once per process, that the method is
    deprecated: the first call is made here, on a Work of a finished future, with stderr on
    /dev/null; a second call, with stderr caught, must print nothing (a torch that warns
    every time, or through Python's warnings, is not used). Other threads' writes to stderr
    in those microseconds would be lost: it runs once, when the first group is made."""
    make = internals.work_from_future()
    if make is None or torch.is_warn_always_enabled():
        return False
    future: Any = torch.futures.Future()
    future.set_result(None)
    work = make(future)
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, 2)
                work.is_success()
                os.dup2(write_end, 2)
                answers = work.is_success() is True
            finally:
                os.dup2(saved, 2)
                os.close(null)
        os.close(write_end)
        write_end = -1
        printed = os.read(read_end, 65536)  # every write end is closed: no wait
    except Exception:
        return False
    finally:
        for fd in (saved, read_end, write_end):
            if fd >= 0:
                os.close(fd)
    return answers and not printed and not caught


def group_of(backend: Any, rank: int, size: int) -> Any:
    """A process group whose only backend is ``backend`` (for the devices it serves)."""
    kinds = dist.ProcessGroup.BackendType
    name = backend.name()
    kind = {"gloo": kinds.GLOO, "nccl": kinds.NCCL}.get(name, kinds.CUSTOM)
    group = dist.ProcessGroup(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
    internals.attach_backend(group, backend, kind, ("cuda",) if name == "nccl" else ("cpu", "cuda"))
    return group


def _row(t: Any) -> int:
    """Elements per row (along dim 0) of tensor ``t``."""
    return math.prod(t.shape[1:]) if t.dim() else 1


def _split_elements(splits: Any, t: Any, size: int) -> tuple[int, ...]:
    """Elements per rank of ``t`` split along dim 0 by ``splits`` (rows; empty: even)."""
    row = _row(t)
    if splits:
        return tuple(int(n) * row for n in splits)
    rows = t.shape[0] if t.dim() else 1
    return (rows // size * row,) * size


def _all_to_all_single_meta(args: tuple, size: int, root: int | None) -> tuple:
    out, inp = args[0], args[1]
    meta: tuple = (("sends", _split_elements(args[3], inp, size)),
                   ("recvs", _split_elements(args[2], out, size)))
    if _row(inp) == _row(out):
        meta += (("row", _row(inp)),)
    return meta


def _all_to_all_meta(args: tuple, size: int, root: int | None) -> tuple:
    return (("sends", tuple(t.numel() for t in args[1])),
            ("recvs", tuple(t.numel() for t in args[0])))


def _gather_meta(args: tuple, size: int, root: int | None) -> tuple:
    outputs, inputs = args[0], args[1]
    meta: tuple = (("sends", tuple(inputs[0].numel() if j == root else 0
                                   for j in range(size))),)
    if outputs and outputs[0]:  # the root's gather list
        meta += (("recvs", tuple(t.numel() for t in outputs[0])),)
    return meta


def _scatter_meta(args: tuple, size: int, root: int | None) -> tuple:
    outputs, inputs = args[0], args[1]
    meta: tuple = ()
    if inputs and inputs[0]:  # the root's scatter list
        meta = (("sends", tuple(t.numel() for t in inputs[0])),)
    return meta + (("recvs", tuple(outputs[0].numel() if j == root else 0
                                   for j in range(size))),)


# What each op of ops.SPLITS sends to and expects from every rank of the group.
_META: dict[str, Callable[[tuple, int, int | None], tuple]] = {
    "all_to_all_single": _all_to_all_single_meta, "all_to_all": _all_to_all_meta,
    "gather": _gather_meta, "scatter": _scatter_meta,
}


def _tag_meta(tag: Any) -> tuple:
    """The ``tag`` field of a point-to-point op; nothing for the default tag 0."""
    return (("tag", tag),) if type(tag) is int and tag else ()


def _forwarded(op: str, method: str, tensors: int, opts: int | None = None,
               reduce: bool = False, root: bool = False) -> Callable[..., Any]:
    """A method that records ``op`` and forwards its arguments to the backend's ``method``:
    the tensors are argument ``tensors``; the options (argument ``opts``) give the reduce op
    and the root when ``reduce`` / ``root``; an op of ops.SPLITS records its amounts."""
    describe = _META.get(op)

    def forward(self: RecordingProcessGroup, *args: Any) -> Any:
        options = args[opts] if opts is not None and len(args) > opts else None
        root_rank = getattr(options, "rootRank", None) if root else None
        meta: tuple = ()
        size = self._issuer.size
        if describe is not None and size <= ops.MAX_SPLIT_RANKS:
            try:
                meta = describe(args, size, root_rank)
            except (AttributeError, IndexError, TypeError, ValueError):
                meta = ()  # arguments torch itself will refuse: recorded without
        return self._issue(op, method, args, args[tensors],
                           _reduce_op(options) if reduce else None, root_rank, None, False,
                           meta)

    forward.__name__ = forward.__qualname__ = op
    return forward


def coalesced_chunks(tensors: Sequence[Any], buffer_size: int,
                     assign: Callable[..., Any]) -> tuple | None:
    """((shape, dtype), ...): the tensor of each broadcast torch's ``broadcast_coalesced``
    issues for ``tensors``: those of one dtype and device in chunks of at most
    ``buffer_size`` bytes as ``assign`` (its ``_compute_bucket_assignment_by_size``) makes
    them, each flattened into one 1-D tensor. None where a tensor is not dense (sparse ones
    go another way)."""
    if any(t.layout is not _STRIDED for t in tensors):
        return None
    chunks, _ = assign(list(tensors), [buffer_size])
    return tuple((torch.Size([sum(tensors[i].numel() for i in chunk)]), tensors[chunk[0]].dtype)
                 for chunk in chunks)


_numel = torch.Tensor.numel
_chunk_kind = operator.attrgetter("dtype", "device", "layout")
MAX_CHUNKINGS = 64  # chunkings remembered, at most (one per DDP model's buffers, usually)
_CHUNKINGS: dict[tuple, tuple | None] = {}


def chunks_of(tensors: Sequence[Any], buffer_size: int,
              assign: Callable[..., Any]) -> tuple | None:
    """:func:`coalesced_chunks`, remembered by all that decides it: ``buffer_size`` and each
    tensor's element count, dtype, device and layout. DDP broadcasts the same buffers in
    every forward: two C-level maps over them then replace torch's chunking call and the
    Python that sizes each chunk (bench/RESULTS.md, session 29)."""
    key = (buffer_size, tuple(map(_numel, tensors)), tuple(map(_chunk_kind, tensors)))
    try:
        return _CHUNKINGS[key]
    except KeyError:
        if len(_CHUNKINGS) >= MAX_CHUNKINGS:
            _CHUNKINGS.clear()
        chunks = _CHUNKINGS[key] = coalesced_chunks(tensors, buffer_size, assign)
        return chunks


class _Issuer:
    """One recording group's numbering and hot path, in a plain object: an attribute of an
    instance of a pybind11 class's Python subclass costs about three times a plain object's
    to read, and every collective reads a dozen. What the hot path calls on the recorder,
    its labeler and its writer is held here too (:meth:`_hold`), read from one object."""

    __slots__ = ("recorder", "name", "size", "seq", "p2p_seq", "extra", "enabled", "calls",
                 "bind", "plain", "trace", "write_at", "returned", "place_id", "sites")

    def __init__(self, recorder: Recorder, name: str, size: int,
                 bind: Callable[[str], Callable[..., Any]],
                 plain: Callable[[], Any] | None = None) -> None:
        self.recorder = recorder
        self.name = name
        self.size = size
        self.seq = 0
        self.p2p_seq = 0
        # What the backend's own sequence number counts beyond the calls recorded (gloo's
        # monitored barrier counts two): ddp_buckets checks the two counts against each other.
        self.extra = 0
        self.enabled = True
        self.calls: dict[str, Callable[..., Any]] = {}  # the backend's methods, bound
        self.bind = bind
        # The process group holding the wrapped backend alone (see broadcast_coalesced);
        # None: torch's coalesced broadcast runs through this group, one entry per chunk.
        self.plain = plain
        self.trace: writer.TraceWriter | None = None  # the writer whose hot path is held
        self.place_id = recorder.labeler.place_id  # the labeler is reset, never replaced
        self.sites = recorder.sites  # cleared, never replaced

    def _hold(self, trace: writer.TraceWriter) -> None:
        """Hold the hot path of ``trace``, the recorder's writer now (a new trace: a rank's
        first collective, or the first of a new round)."""
        self.write_at, self.returned = trace.write_at, trace.returned
        self.trace = trace

    def stop(self, exc: Exception) -> None:
        """Recording failed: switch it off for this group, with one warning (the trace's
        ``lost`` marker); the user's collectives go on unrecorded."""
        self.enabled = False
        message = f"recording stopped for group {self.name}: {type(exc).__name__}: {exc}"
        sys.stderr.write(f"ddpdoctor: {message}\n")
        try:
            self.recorder.warn(message, lost=True)
        except Exception:  # the writer itself is broken: its cut marker says so
            pass

    def broadcast_coalesced(self, real: Callable[..., None], group: Any, tensors: Any,
                            buffer_size: int, src: int,
                            assign: Callable[..., Any]) -> None:
        """torch's ``_broadcast_coalesced`` on this group (``real``): DDP's buffer broadcast
        in every forward, its parameter sync at construction. Called as it is, its C++
        issues one broadcast per chunk of ``tensors``, each entering this group's Python
        (pybind's entry costs a DDP step ~35 µs of CPU per collective, bench/RESULTS.md).
        Each chunk's broadcast is recorded here instead, from the chunking torch applies,
        before the call, which then runs on the process group holding the backend alone;
        the records complete when it returns (it waits for its broadcasts)."""
        recorder = self.recorder
        writer = recorder.writer
        if self.plain is None:
            return real(group, tensors, buffer_size, src)
        if not self.enabled or writer is None:  # nothing to record
            return real(self.plain(), tensors, buffer_size, src)
        try:
            chunks = chunks_of(tensors, buffer_size, assign)
        except Exception:  # arguments torch itself will refuse
            chunks = None
        if chunks is None:  # each broadcast recorded as it enters this group
            return real(group, tensors, buffer_size, src)
        try:
            caller = _getframe(2)  # frame 1: the patched torch.distributed function
        except ValueError:
            caller = None
        ids: list[int] = []
        for shape, dtype in chunks:
            cid = self.issue("broadcast", None, (), Described(shape, dtype), None, src, None,
                             False, (), caller)
            if cid is not None:
                ids.append(cid)
        try:
            real(self.plain(), tensors, buffer_size, src)
        except BaseException:
            writer.set_states(ids, schema.FAILED)
            raise
        writer.set_states(ids, schema.COMPLETED)

    def issue(self, op: str, method: str | None, args: tuple, tensors: Any, reduce_op: Any,
              root: int | None, peer: int | None, p2p: bool, meta: tuple = (),
              frame: Any = None) -> Any:
        """Record ``op``, then run ``method`` of the wrapped backend with ``args`` and return
        its Work (``method`` None: record only, and return the collective's id, None when
        not recorded). ``meta``: ((field, value), ...) recorded beyond the tensors (split
        sizes, a tag); ``frame``: the frame of the user's call (None: this method's caller's
        caller, the group's method being the caller).

        The hot path: every collective of the job passes here, on the calling thread, and in
        a busy rank that thread pays for each line of bytecode it runs, cold after each wait
        (bench/RESULTS.md, session 42; bench/hot_path_code.py counts them): one function,
        arguments by position, whatever is rare a call (a new site: Recorder.learn)."""
        cid = None
        recorder = self.recorder
        trace = recorder.writer
        if self.enabled and trace is not None:
            try:
                if trace is not self.trace:
                    self._hold(trace)
                # Collectives and point-to-point ops are numbered apart: p2p ops pair up
                # between two ranks, not across the group.
                if p2p:
                    self.p2p_seq = p2p_seq = self.p2p_seq + 1
                    seq = None
                else:
                    self.seq = seq = self.seq + 1
                    p2p_seq = None
                # One tensor is the common case (DDP's buckets, dist.all_reduce).
                if type(tensors) is list and len(tensors) == 1 and \
                        isinstance(t := tensors[0], _Tensor):
                    shapes: tuple = ((t.shape, t.dtype),)
                else:
                    shapes = _tensors(tensors)
                # The caller of allreduce() etc. (frame 1 is that method); None when C++
                # called it with no Python frame above (DDP's Reducer on the autograd
                # engine's CUDA device thread). _getframe(2) makes a frame object for that
                # frame alone; _getframe(1).f_back made one for frame 1 as well.
                if frame is None:
                    try:
                        frame = _getframe(2)
                    except ValueError:
                        pass
                # The site, by the static fields and the places of the caller's frames
                # (StackLabeler.place_id): one lookup once a call path is known. A caller
                # frame of None: the site follows the main thread (describe), not cached.
                behalf = _behalf.call if _marked else None  # on_behalf.current(), inline
                key = None if frame is None else (
                    self.name, op, reduce_op, root, peer, shapes, self.place_id(frame), meta,
                    behalf)
                try:
                    site, bucketed = self.sites[key]
                except KeyError:
                    site, bucketed = recorder.learn(key, self.name, op, shapes, reduce_op, root,
                                                    peer, frame, meta, behalf)
                bucket = None
                if bucketed:
                    bucket = recorder.bucket_index
                    recorder.bucket_index = bucket + 1
                recorder.last_issue = t_issue = _now()
                cid = self.write_at(site, seq, p2p_seq, bucket, recorder.iteration, t_issue)
            except Exception as exc:  # never let recording break the user's collective
                cid = None
                self.stop(exc)
        if method is None:
            return cid
        try:
            call = self.calls.get(method)
            if call is None:
                call = self.calls[method] = self.bind(method)
            work = call(*args)
        except BaseException:
            if cid is not None:
                trace.set_states((cid,), schema.FAILED)  # type: ignore[union-attr]
            raise
        if cid is not None:  # the writer was there when the collective was recorded
            self.returned(cid, work)
        return work


class Described:
    """A tensor as :meth:`_Issuer.issue` records it, for a collective recorded without its
    tensor at hand (a chunk of a coalesced broadcast, a DDP bucket of a planned backward)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Any, dtype: Any) -> None:
        self.shape, self.dtype = shape, dtype


_MONITORED = " monitored_barrier"  # the key of a monitored barrier's call (no backend method)


def _backend_count(backend: Any) -> int | None:
    """The backend's own sequence number (collectives it was given), None where it has none."""
    try:
        return int(internals.sequence_counter(backend)())
    except Exception:
        return None


class RecordingProcessGroup(dist.ProcessGroup):
    """Records every operation of one group and forwards it to the wrapped backend."""

    def __init__(self, inner: Any, store: Any, rank: int, size: int, name: str,
                 recorder: Recorder) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
        self._inner = inner
        self._recorder = recorder
        self._direct: Any = None  # see _alone
        try:
            gloo = inner.name() == "gloo"
        except Exception:  # a stand-in backend (tests)
            gloo = False
        # NCCL's coalesced broadcast returns before its broadcasts complete: through this
        # group, where each chunk's Work tells.
        self._issuer = _Issuer(recorder, name, size, self._bound, self._alone if gloo else None)
        self._issue = self._issuer.issue
        global _failure_check_chosen
        if not _failure_check_chosen:
            _failure_check_chosen = True
            writer.use_is_success(quiet_failure_check())

    # The group's name in the trace, and whether it records (a benchmark switches it off).
    _name = property(lambda self: self._issuer.name,
                     lambda self, name: setattr(self._issuer, "name", name))
    _enabled = property(lambda self: self._issuer.enabled,
                        lambda self, on: setattr(self._issuer, "enabled", on))

    def _bound(self, method: str) -> Callable[..., Any]:
        """The wrapped backend's ``method``, bound (looked up once per method). Gloo and NCCL
        implement the coalesced all-gather and reduce-scatter (FSDP2's, DTensor's) in C++ only,
        with no Python binding: they are reached through a process group that holds the
        wrapped backend alone, whose binding dispatches to it (never through this group, which
        would re-enter here)."""
        try:
            return getattr(self._inner, method)
        except AttributeError:
            return getattr(self._alone(), method)

    def _alone(self) -> Any:
        """A process group holding the wrapped backend alone (made once)."""
        if self._direct is None:
            self._direct = group_of(self._inner, self.rank(), self.size())
        return self._direct

    # -- identity ---------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return self._inner.name()

    # -- collectives (names as torch calls them; some have two) --------------------------
    def allreduce(self, *args: Any) -> Any:
        try:  # the reduce op's name by its hash (see _REDUCE_OP_NAMES), without a call
            reduce_op = _REDUCE_OP_NAMES[hash(args[1].reduceOp)]
        except (IndexError, AttributeError, KeyError, TypeError):
            reduce_op = _reduce_op(args[1] if len(args) > 1 else None)
        return self._issue("all_reduce", "allreduce", args, args[0], reduce_op, None, None,
                           False)

    def broadcast(self, *args: Any) -> Any:
        root = getattr(args[1], "rootRank", None) if len(args) > 1 else None
        if len(args) > 1 and isinstance(args[1], int):
            root = args[1]
        return self._issue("broadcast", "broadcast", args, args[0], None, root, None, False)

    def barrier(self, opts: Any = None) -> Any:
        return self._issue("barrier", "barrier", () if opts is None else (opts,), None, None,
                           None, None, False)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """``dist.monitored_barrier`` calls this on the group from Python (the C++ base would
        reach the backend without passing here). Synchronous: done when it returns."""
        inner, issuer = self._inner, self._issuer

        def run() -> str:
            before = _backend_count(inner)
            recorded = issuer.seq + issuer.p2p_seq  # this barrier's own record included
            if timeout is None:
                inner.monitored_barrier(wait_all_ranks=wait_all_ranks)
            else:
                inner.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
            after = _backend_count(inner)
            if before is not None and after is not None:
                # Beyond this barrier's one, less what other threads recorded meanwhile.
                issuer.extra += after - before - 1 - (issuer.seq + issuer.p2p_seq - recorded)
            return schema.COMPLETED  # the writer's state for a call that has no Work

        self._issuer.calls[_MONITORED] = run
        self._issue("monitored_barrier", _MONITORED, (), None, None, None, None, False)

    # -- point to point ---------------------------------------------------------------------
    # (tensors, peer, tag); recv_anysource: (tensors, tag).
    def send(self, *args: Any) -> Any:
        return self._issue("send", "send", args, args[0], None, None, args[1], True,
                           _tag_meta(args[2]) if len(args) > 2 else ())

    def recv(self, *args: Any) -> Any:
        return self._issue("recv", "recv", args, args[0], None, None, args[1], True,
                           _tag_meta(args[2]) if len(args) > 2 else ())

    def recv_anysource(self, *args: Any) -> Any:
        return self._issue("recv_anysource", "recv_anysource", args, args[0], None, None, None,
                           True, _tag_meta(args[1]) if len(args) > 1 else ())

    # -- coalescing brackets: forwarded, not recorded ----------------------------------------
    def _start_coalescing(self, *args: Any) -> Any:
        return self._inner._start_coalescing(*args)

    def _end_coalescing(self, *args: Any) -> Any:
        return self._inner._end_coalescing(*args)


# The rest follow one pattern: the table's ops whose tensors and options are arguments by
# position, forwarded as they come, under every name torch calls them by.
for _op in ops.OPS:
    if _op.tensors is not None:
        _method = _forwarded(_op.name, _op.backend, _op.tensors, _op.opts, reduce=_op.reduces,
                             root=_op.rooted)
        for _name in _op.methods:
            setattr(RecordingProcessGroup, _name, _method)

