"""DDP's gradient buckets recorded once per backward instead of once per bucket.

DDP's Reducer issues one all-reduce per gradient bucket, from C++, during the backward.
Through the recording group each of them enters Python: pybind's entry and the record cost a
busy rank ~90 µs of CPU per bucket (bench/RESULTS.md, session 24). Once DDP has rebuilt its
buckets (the layout is then fixed, and DDP's logging data publishes it), this module gives the
Reducer the process group that holds the backend alone, and records the buckets with three
Python calls per backward instead:

* a hook on the gradient accumulator of the first bucket's first parameter, registered once:
  DDP issues its buckets in order, each once all its gradients are in, so the hook runs before
  any bucket of a backward goes out. After a forward that prepared DDP for a backward, it
  writes one line per bucket that the backward will issue (the same lines, call sites and
  numbering as the recording group wrote);
* it queues a callback for the end of the backward, which queues another: that one runs after
  DDP's own (which waits for every bucket), checks by the backend's own sequence number that
  the backward issued exactly the buckets written, and marks them completed.

Whatever it cannot follow exactly puts the model back on the recording group for good, where
each bucket is recorded as it enters: a comm hook, join, static graph, unused-parameter
detection, a compiled reducer, mixed precision, sparse gradients, parameters off the CPU. A
backward that issued other than what was written marks the trace lost (the analysis then says
what it cannot know) and does the same.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime.pg_wrapper import Described
from ddpdoctor.trace import schema

_getframe = sys._getframe
_NEVER = "never"  # the model stays on the recording group
MAX_WAIT = 20  # forwards after the rebuild to wait for DDP's logging data to show it
# DDP models by their state here: None (not yet decided), a count of forwards waited, _NEVER,
# or their _Plan. Weakly, and not on the model: a model pickled whole must not carry it.
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reducer_params(ddp: Any) -> list[Any]:
    """The parameters DDP gave its Reducer, in its order: those that require a gradient, module
    by module, each once, none that it ignores (DDP's ``_build_params_for_reducer``, without
    that method's side effects)."""
    seen: set[int] = set()
    out = []
    ignore = ddp.parameters_to_ignore
    for module_name, module in ddp.module.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            if param.requires_grad and f"{module_name}.{param_name}" not in ignore and \
                    id(param) not in seen:
                seen.add(id(param))
                out.append(param)
    return out


def layout_from_logging(data: dict, params: Sequence[Any]) -> tuple | None:
    """(bucket tensors, index of its first parameter) per gradient bucket, in the order the
    Reducer issues them, from DDP's logging data after the rebuild (each bucket's parameter
    indices, and its size in bytes); the tensors as the recording group saw them: one flat
    tensor of the bucket's dtype, ((shape, dtype),). None where the data is missing or
    disagrees with ``params`` anywhere."""
    indices, sizes = data.get("rebuilt_per_bucket_param_indices"), \
        data.get("rebuilt_bucket_sizes")
    if not isinstance(indices, str) or not isinstance(sizes, str) or not indices.strip():
        return None
    try:
        buckets = [[int(i) for i in part.split()] for part in indices.split(",")]
        nbytes = [int(s) for s in sizes.split(",")]
    except ValueError:
        return None
    if len(buckets) != len(nbytes):
        return None
    out = []
    for bucket, size in zip(buckets, nbytes):
        if not bucket or any(not 0 <= i < len(params) for i in bucket):
            return None
        dtype = params[bucket[0]].dtype
        if any(params[i].dtype != dtype for i in bucket):
            return None
        numel = sum(params[i].numel() for i in bucket)
        if numel * params[bucket[0]].element_size() != size:
            return None
        out.append((((torch.Size([numel]), dtype),), bucket[0]))
    return tuple(out)


class _Plan:
    """One DDP model whose Reducer runs on the plain group: its buckets and the backward in
    flight."""

    __slots__ = ("issuer", "layout", "nodes", "counter", "will_run", "queue", "armed",
                 "fired", "ids", "window", "at_arm", "revert", "handle", "__weakref__")

    def __init__(self, issuer: Any, layout: tuple, nodes: tuple,
                 counter: Callable[[], int]) -> None:
        self.issuer = issuer
        self.layout = layout  # ((shape, dtype),) per bucket, in issue order
        self.nodes = nodes  # the gradient accumulator of each bucket's first parameter
        self.counter = counter  # the backend's sequence number: collectives it was given
        self.will_run = internals.engine_will_execute()
        self.queue = internals.autograd_callback_queue()
        self.armed = False  # a forward prepared DDP for a backward
        # That backward's buckets were written (or recording was off); nothing to write
        # before the first such forward.
        self.fired = True
        # The backend's sequence number and the group's count of what it recorded, as the
        # last forward that prepared DDP for a backward ended (None: recording was off then).
        self.at_arm: tuple[int, int] | None = None
        self.ids: list[int] | None = None  # the lines of the backward in flight
        self.window: _Window | None = None
        self.revert = ""  # why the model goes back to the recording group, at its next forward
        self.handle: Any = None  # the hook's (hook_backwards)

    def hook_backwards(self) -> None:
        """Hook the gradient accumulator of the first bucket's first parameter, once for the
        model's life (:meth:`backward_starts`). Registering a hook on each forward's output
        instead cost a busy step ~37 µs of CPU (finding the output's node, torch's hook
        handle; bench/RESULTS.md, session 29). The hook holds the plan weakly: the plan goes
        with its model, whatever keeps the accumulator (DDP's Reducer, the parameter)."""
        plan = weakref.ref(self)

        def hook(grad_outputs: Any) -> None:
            this = plan()
            if this is not None and not this.fired:
                this.backward_starts(_getframe(1))  # the autograd engine's caller's frame
            return None

        self.handle = self.nodes[0].register_prehook(hook)

    def unhook(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def _recorded(self) -> int:
        issuer = self.issuer
        return issuer.seq + issuer.p2p_seq + issuer.extra

    def arm(self) -> None:
        """After a forward that prepared DDP for a backward: its buckets are written when it
        reaches the first one's first parameter."""
        issuer = self.issuer
        if self.armed and not self.fired and self.at_arm is not None and issuer.enabled:
            # The last forward's backward wrote nothing (it ran none, or none that reached
            # a bucket's parameters): the backend must have been given only what was recorded.
            counter, recorded = self.at_arm
            unseen = self.counter() - counter - (self._recorded() - recorded)
            if unseen:
                self.revert = "collectives the backend was given and ddpdoctor did not see"
                issuer.recorder.warn(
                    f"the backend was given {unseen} collective(s) that ddpdoctor did not "
                    "record since DDP's last forward: the trace is not exact from here",
                    lost=True)
                return
        self.armed, self.fired = True, False
        self.at_arm = (self.counter(), self._recorded()) if issuer.enabled else None

    def backward_starts(self, frame: Any) -> None:
        """The hook's work: the armed backward reached the first bucket's first parameter
        (before any bucket is issued); ``frame``: the Python frame that called the engine."""
        try:
            self._write(frame)
        except Exception as exc:  # never let recording break the user's backward
            self.issuer.stop(exc)
            self._abandon(f"recording failed: {exc}")

    def _abandon(self, reason: str) -> None:
        """Nothing of this backward is checked; the model goes back to the exact way."""
        _WINDOWS.pop(id(self.issuer), None)
        self.fired, self.ids, self.window = True, None, None
        self.revert = reason

    def _write(self, frame: Any) -> None:
        issuer = self.issuer
        recorder = issuer.recorder
        if not issuer.enabled or recorder.writer is None:
            self.fired = True  # nothing is recorded: nothing to check
            return
        # Buckets go out in order, each once all its gradients are in: none after the first
        # whose first parameter gets no gradient in this backward (the first bucket's does:
        # the hook runs on its accumulator).
        will_run = self.will_run
        n = 1
        for node in self.nodes[1:]:
            if not will_run(node):
                break
            n += 1
        self.fired = True
        window = _WINDOWS.get(id(issuer))
        if window is None or window.issuer is not issuer:
            # Counted from the end of this model's forward (what ran since must add up
            # too), with no call into the backend here (~13 µs of a busy step's CPU).
            counter, recorded = self.at_arm or (self.counter(), self._recorded())
            window = _WINDOWS[id(issuer)] = _Window(issuer, counter, recorded)
        window.open += 1
        self.window = window
        ids = []
        for (shape, dtype), in self.layout[:n]:
            cid = issuer.issue("all_reduce", None, (), Described(shape, dtype), "SUM", None,
                               None, False, (), frame)
            if cid is None:  # recording failed, and stopped with its warning
                self._abandon("recording failed")
                return
            ids.append(cid)
        self.ids = ids  # one per bucket: the writer is there (checked above)
        self.queue(self._graph_done)

    def _graph_done(self) -> None:
        """The backward's graph ran; DDP's own callback, queued as its last bucket went out,
        runs next: check after it."""
        self.queue(self._after_ddp)

    def _after_ddp(self) -> None:
        ids, self.ids = self.ids, None
        window, self.window = self.window, None
        if ids is None or window is None:
            return
        issuer = self.issuer
        window.open -= 1
        if window.open <= 0:
            _WINDOWS.pop(id(issuer), None)
        if window.unseen is None:  # the first of the window's backwards to end: all did
            try:
                window.unseen = self.counter() - window.counter - \
                    (self._recorded() - window.recorded)
            except Exception:
                window.unseen = -1
        if window.unseen:
            self.revert = "a backward that issued other collectives than those recorded"
            if not window.warned:
                window.warned = True
                issuer.recorder.warn(
                    "the backend was given other collectives than ddpdoctor recorded while "
                    f"DDP's backward ran ({window.unseen:+d}): the trace is not exact from here",
                    lost=True)
            return
        if len(ids) < len(self.layout):
            # Fewer buckets than the model has went out (a parameter got no gradient): they
            # are in flight with nothing here to tell when they complete; DDP refuses the
            # next forward. Each bucket is recorded as it enters from here on.
            self.revert = "a backward that left gradient buckets out"
            return
        writer = issuer.recorder.writer
        if writer is not None:  # DDP's callback waited for every bucket: all completed
            writer.set_states(ids, schema.COMPLETED)


class _Window:
    """The backwards of one group's models in flight together (one backward through several
    models): the backend's sequence number and the group's count of what it recorded as the
    first of them began, how many have not ended, and what the backend was given beyond what
    was recorded (checked when the first ends: DDP's callbacks, which wait for the buckets,
    have then all run)."""

    __slots__ = ("issuer", "counter", "recorded", "open", "unseen", "warned")

    def __init__(self, issuer: Any, counter: int, recorded: int) -> None:
        self.issuer, self.counter, self.recorded = issuer, counter, recorded
        self.open = 0
        self.unseen: int | None = None
        self.warned = False


_WINDOWS: dict[int, _Window] = {}  # by id(issuer) (an _Issuer takes no weak reference)


def after_forward(ddp: Any) -> None:
    """Called at the end of every DDP forward (``_post_forward``)."""
    plan = _PLANS.get(ddp)
    if plan is _NEVER:
        return
    try:
        if type(plan) is not _Plan:
            plan = _PLANS[ddp] = _plan_for(ddp, plan or 0)
            if type(plan) is not _Plan:
                return
        if plan.revert or plan.ids is not None or ddp.static_graph or \
                getattr(ddp, "_use_python_reducer", False):
            # (ids: the last backward never reached its end: it raised, or ran no callback.)
            if plan.ids is not None:
                _WINDOWS.pop(id(plan.issuer), None)
            exact(ddp)
            return
        if torch.is_grad_enabled() and ddp.require_backward_grad_sync:
            plan.arm()
            if plan.revert:
                exact(ddp)
    except Exception as exc:  # never fail the user's forward; record it the exact way
        sys.stderr.write(f"ddpdoctor: DDP's buckets recorded one by one: {exc}\n")
        exact(ddp)


def exact(ddp: Any) -> None:
    """Each of this model's buckets recorded as it enters the recording group, from now on:
    its Reducer back on the model's own process group (the recording group)."""
    plan = _PLANS.get(ddp)
    _PLANS[ddp] = _NEVER
    if type(plan) is _Plan:
        plan.fired = True
        try:
            plan.unhook()
        except Exception:  # a hook left in place finds the plan disarmed: it does nothing
            pass
        try:
            internals.move_reducer(ddp, ddp.process_group)
        except Exception as exc:  # the buckets then go on unseen: say so in the trace
            plan.issuer.recorder.warn(f"DDP's buckets could not be recorded from here: {exc}",
                                      lost=True)


def _plan_for(ddp: Any, waited: int) -> _Plan | str | int | None:
    """The model's _Plan, now that DDP has rebuilt its buckets (its Reducer moved to the plain
    group); None or a count of forwards while that is not yet known; _NEVER when this model's
    buckets are recorded as they enter."""
    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup

    pg = ddp.process_group
    if type(pg) is not RecordingProcessGroup or pg._issuer.plain is None or \
            ddp.find_unused_parameters or ddp.static_graph or \
            getattr(ddp, "_use_python_reducer", False) or \
            getattr(ddp, "_delay_all_reduce_all_params", False) or \
            getattr(ddp, "mixed_precision", None) is not None:
        return _NEVER
    if not getattr(ddp, "_has_rebuilt_buckets", False):
        return None
    params = reducer_params(ddp)
    if any(p.device.type != "cpu" or p.layout is not torch.strided for p in params) or any(
            getattr(m, "sparse", False) for m in ddp.module.modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))):
        return _NEVER
    layout = layout_from_logging(internals.ddp_logging_data(ddp), params)
    if layout is None:  # DDP's logger fills it in at a later forward
        return waited + 1 if waited < MAX_WAIT else _NEVER
    counter = internals.sequence_counter(pg._inner)
    counter()
    nodes = tuple(internals.grad_accumulator(params[first]) for _, first in layout)
    plan = _Plan(pg._issuer, tuple(tensors for tensors, _ in layout), nodes, counter)
    plan.hook_backwards()
    internals.move_reducer(ddp, pg._issuer.plain())
    return plan
