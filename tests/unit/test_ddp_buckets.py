"""DDP's gradient buckets recorded once per backward (runtime/ddp_buckets.py): the lines are
the ones the recording group writes bucket by bucket, a backward that issues none (the gradient
of the inputs) writes none, and what the record cannot follow puts the model back on the
recording group, the trace marked lost where collectives went unseen. On a real gloo group of
one process and a real DDP model; the e2e test ``test_backward_buckets.py`` runs two ranks."""

from __future__ import annotations

import contextlib
import gc
import weakref
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpdoctor.runtime import ddp_buckets, user_code
from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace.reader import read_rank

pytestmark = pytest.mark.skipif(not internals.per_backward_buckets(),
                                reason="this torch cannot record DDP's buckets per backward")

STEPS = 6  # the plan starts at the third forward (DDP's logging data shows the rebuild then)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 4))


def _ddp(tmp_path: Path) -> tuple[DDP, RecordingProcessGroup, Recorder]:
    tmp_path.mkdir(exist_ok=True)
    recorder = Recorder(str(tmp_path), "run")
    recorder.set_internal_dirs(list(user_code.internal_prefixes()))  # torch's frames: not user's
    recorder.start(0, 1, "gloo")
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    pg = RecordingProcessGroup(gloo, None, 0, 1, "0", recorder)
    internals.attach_backend(pg, gloo, dist.ProcessGroup.BackendType.GLOO, ("cpu",))
    return DDP(_model(), process_group=pg, bucket_cap_mb=0.01), pg, recorder


def _forward(ddp: DDP, recorder: Recorder, per_backward: bool, x: torch.Tensor) -> Any:
    """What torch_hooks' patches of DDP's _pre_forward and _post_forward add to a forward."""
    recorder.next_iteration()
    out = ddp(x)
    if per_backward:
        ddp_buckets.after_forward(ddp)
    return out


def _train(tmp_path: Path, per_backward: bool, steps: int = STEPS,
           input_grad: bool = False) -> tuple[list[tuple], DDP, Recorder]:
    ddp, _, recorder = _ddp(tmp_path)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(3, 16, generator=gen, requires_grad=input_grad)
        out = _forward(ddp, recorder, per_backward, x)
        if input_grad:  # a backward through the output that reaches no parameter
            torch.autograd.grad(out.sum(), x, retain_graph=True)
        out.pow(2).sum().backward()  # one line: the buckets' call site either way
    recorder.close()
    return _records(tmp_path), ddp, recorder


def _records(tmp_path: Path) -> list[tuple]:
    trace = read_rank(next(tmp_path.glob("rank-*.jsonl")))
    return [(c.seq, c.op, c.label, c.shapes, c.dtypes, c.reduce_op, c.bucket, c.iteration,
             c.state, (c.stack[0].function, c.stack[0].line) if c.stack else None)
            for c in trace.collectives]


def test_per_backward_lines_are_the_ones_written_bucket_by_bucket(tmp_path: Path) -> None:
    each, _, _ = _train(tmp_path / "each", per_backward=False)
    once, ddp, _ = _train(tmp_path / "once", per_backward=True)
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan  # the Reducer moved
    assert once == each
    buckets = [r for r in once if r[2] == "ddp.bucket"]
    assert {r[7] for r in buckets} == set(range(1, STEPS + 1))
    assert len([r for r in buckets if r[7] == STEPS]) > 1  # several buckets a backward
    assert all(r[8] == "completed" for r in once)


def test_a_backward_of_the_inputs_alone_writes_no_bucket(tmp_path: Path) -> None:
    # torch.autograd.grad(out, x) runs the output's node and no parameter's accumulator:
    # DDP issues no bucket, and the model's own backward after it is recorded.
    each, _, _ = _train(tmp_path / "each", per_backward=False, input_grad=True)
    once, ddp, _ = _train(tmp_path / "once", per_backward=True, input_grad=True)
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan
    assert once == each
    assert {r[7] for r in once if r[2] == "ddp.bucket"} == set(range(1, STEPS + 1))


def _ensemble(tmp_path: Path, per_backward: bool) -> list[tuple]:
    """Two models on one group, one backward through both each step: their buckets go out
    interleaved, each model's counted against the group's one sequence number."""
    first, pg, recorder = _ddp(tmp_path)
    second = DDP(_model(), process_group=pg, bucket_cap_mb=0.01)
    for _ in range(STEPS):
        x = torch.randn(3, 16)
        a = _forward(first, recorder, per_backward, x)
        b = second(x)
        if per_backward:
            ddp_buckets.after_forward(second)
        (a * b).sum().backward()
    assert not per_backward or all(type(ddp_buckets._PLANS.get(m)) is ddp_buckets._Plan
                                   for m in (first, second))
    recorder.close()
    return _records(tmp_path)


def test_two_models_in_one_backward_are_counted_together(tmp_path: Path) -> None:
    once = _ensemble(tmp_path / "once", per_backward=True)
    assert once == _ensemble(tmp_path / "each", per_backward=False)
    assert all(r[8] == "completed" for r in once)
    assert not read_rank(next((tmp_path / "once").glob("rank-*.jsonl"))).lost


def test_collectives_the_record_did_not_see_mark_the_trace_lost(tmp_path: Path) -> None:
    ddp, pg, recorder = _ddp(tmp_path)
    for _ in range(STEPS):
        _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan
    _forward(ddp, recorder, True, torch.randn(3, 16))  # no backward: nothing written
    pg._issuer.plain().allreduce([torch.ones(2)]).wait()  # the backend, behind the record
    _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert ddp_buckets._PLANS.get(ddp) == ddp_buckets._NEVER
    recorder.close()
    trace = read_rank(next(tmp_path.glob("rank-*.jsonl")))
    assert "did not record" in trace.lost
    # From there on each bucket is recorded as it enters the recording group.
    last = [c for c in trace.collectives if c.iteration == STEPS + 2]
    assert last and all(c.label == "ddp.bucket" and c.state == "completed" for c in last)


def test_a_record_that_fails_never_fails_the_backward(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ddp, pg, recorder = _ddp(tmp_path)
    for _ in range(STEPS):
        _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk gone")

    assert pg._issuer.trace is recorder.writer  # the group holds the writer's hot path
    monkeypatch.setattr(pg._issuer, "write_at", broken)
    ddp.zero_grad()
    _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert all(p.grad is not None for p in ddp.parameters())  # the backward ran through
    _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert ddp_buckets._PLANS.get(ddp) == ddp_buckets._NEVER
    recorder.close()
    assert "recording stopped" in read_rank(next(tmp_path.glob("rank-*.jsonl"))).lost


def test_exact_puts_the_model_back_on_the_recording_group(tmp_path: Path) -> None:
    ddp, _, recorder = _ddp(tmp_path)
    for _ in range(STEPS):
        _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    ddp_buckets.exact(ddp)  # as before a comm hook, join or another process group
    entered: list[str] = []
    issue = ddp.process_group._issuer.issue

    def counting(op: str, *args: Any) -> Any:
        entered.append(op)
        return issue(op, *args)

    ddp.process_group._issue = counting
    _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert entered and set(entered) == {"all_reduce"}  # every bucket entered the group
    assert ddp_buckets._PLANS.get(ddp) == ddp_buckets._NEVER
    recorder.close()


class _Opaque:
    """A forward's output that holds its tensor where no search would find it."""

    def __init__(self, t: torch.Tensor) -> None:
        self._t = t

    def loss(self) -> torch.Tensor:
        return self._t.pow(2).sum()


class _OpaqueOut(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, x: torch.Tensor) -> _Opaque:
        return _Opaque(self.net(x))


def _accumulating(tmp_path: Path, per_backward: bool, opaque: bool = False) -> tuple[list, DDP]:
    """Gradient accumulation: each step a backward under no_sync (DDP issues no bucket), then a
    synced one; with ``opaque`` the model's output hides its tensor."""
    ddp, pg, recorder = _ddp(tmp_path)
    if opaque:
        torch.manual_seed(0)
        ddp = DDP(_OpaqueOut(), process_group=pg, bucket_cap_mb=0.01)
    gen = torch.Generator().manual_seed(1)

    def loss(out: Any) -> torch.Tensor:
        return out.loss() if opaque else out.pow(2).sum()

    for _ in range(STEPS):
        with ddp.no_sync():
            loss(_forward(ddp, recorder, per_backward, torch.randn(3, 16, generator=gen))) \
                .backward()
        loss(_forward(ddp, recorder, per_backward, torch.randn(3, 16, generator=gen))).backward()
    recorder.close()
    return _records(tmp_path), ddp


@pytest.mark.parametrize("opaque", [False, True])
def test_backwards_under_no_sync_write_no_bucket(tmp_path: Path, opaque: bool) -> None:
    # The hook on the first bucket's first parameter runs in every backward; only one after a
    # forward that prepared DDP for it writes lines. An output whose tensors cannot be
    # searched no longer matters: nothing is hooked on it.
    each, _ = _accumulating(tmp_path / "each", per_backward=False, opaque=opaque)
    once, ddp = _accumulating(tmp_path / "once", per_backward=True, opaque=opaque)
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan
    assert once == each
    assert {r[7] for r in once if r[2] == "ddp.bucket"} == set(range(2, 2 * STEPS + 1, 2))
    assert all(r[8] == "completed" for r in once)
    assert not read_rank(next((tmp_path / "once").glob("rank-*.jsonl"))).lost


def test_the_hook_goes_with_the_plan(tmp_path: Path) -> None:
    ddp, _, recorder = _ddp(tmp_path)
    for _ in range(STEPS):
        _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    plan = ddp_buckets._PLANS.get(ddp)
    assert type(plan) is ddp_buckets._Plan and plan.handle is not None
    ddp_buckets.exact(ddp)  # back on the recording group: the hook is removed
    assert plan.handle is None and plan.fired
    recorder.close()
    # A model let go of takes its plan with it (the hook holds the plan weakly).
    other, _, second = _ddp(tmp_path / "other")
    for _ in range(STEPS):
        _forward(other, second, True, torch.randn(3, 16)).sum().backward()
    gone = weakref.ref(ddp_buckets._PLANS.get(other))
    del other
    gc.collect()
    assert gone() is None
    second.close()


def _synced_or_not(tmp_path: Path, per_backward: bool, syncs: list[bool]) -> tuple[list, DDP]:
    ddp, _, recorder = _ddp(tmp_path)
    gen = torch.Generator().manual_seed(1)
    for i, sync in enumerate(syncs):
        with contextlib.nullcontext() if sync else ddp.no_sync():
            # The first three forwards as DDP builds and rebuilds its buckets and its logging
            # data shows the rebuild: no plan yet.
            _forward(ddp, recorder, per_backward and i >= 3,
                     torch.randn(3, 16, generator=gen)).sum().backward()
    recorder.close()
    return _records(tmp_path), ddp


def test_a_plan_made_in_a_forward_under_no_sync_writes_nothing_for_its_backward(
        tmp_path: Path) -> None:
    # The fourth forward makes the plan, under no_sync: DDP issues no bucket in its backward,
    # and the hook, already in place, must write none.
    syncs = [True, True, True, False, True, False, True]
    each, _ = _synced_or_not(tmp_path / "each", False, syncs)
    once, ddp = _synced_or_not(tmp_path / "once", True, syncs)
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan
    assert once == each
    assert {r[7] for r in once if r[2] == "ddp.bucket"} == {1, 2, 3, 5, 7}
    assert not read_rank(next((tmp_path / "once").glob("rank-*.jsonl"))).lost


def test_a_monitored_barrier_between_forward_and_backward_is_counted(tmp_path: Path) -> None:
    # gloo's monitored barrier moves the backend's sequence number by two; the group records
    # one call: the difference is accounted for, not taken for a collective unseen.
    ddp, pg, recorder = _ddp(tmp_path)
    for _ in range(STEPS):
        out = _forward(ddp, recorder, True, torch.randn(3, 16))
        pg.monitored_barrier(timedelta(seconds=30))  # as dist.monitored_barrier calls it
        out.sum().backward()
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan
    recorder.close()
    trace = read_rank(next(tmp_path.glob("rank-*.jsonl")))
    assert not trace.lost
    assert sum(c.op == "monitored_barrier" for c in trace.collectives) == STEPS


def test_the_hook_runs_before_the_backward_issues_any_bucket(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # When the hook writes the lines, the backend has been given nothing since the forward
    # beyond what was recorded: no bucket of this backward has gone out yet.
    ddp, _, recorder = _ddp(tmp_path)
    gaps: list[int] = []
    write = ddp_buckets._Plan._write

    def checked(plan: Any, frame: Any) -> None:
        counter, recorded = plan.at_arm
        gaps.append(plan.counter() - counter - (plan._recorded() - recorded))
        write(plan, frame)

    monkeypatch.setattr(ddp_buckets._Plan, "_write", checked)
    for _ in range(STEPS):
        _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    recorder.close()
    assert len(gaps) == STEPS - 2 and set(gaps) == {0}  # from the third forward's backward
    layout = ddp_buckets._PLANS.get(ddp).layout
    assert len(layout) > 1  # several buckets: the first of them not issued yet either
