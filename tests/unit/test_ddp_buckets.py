"""DDP's gradient buckets recorded once per backward (runtime/ddp_buckets.py): the lines are
the ones the recording group writes bucket by bucket, a backward that issues none (the gradient
of the inputs) writes none, and what the record cannot follow puts the model back on the
recording group, the trace marked lost where collectives went unseen. On a real gloo group of
one process and a real DDP model; the e2e test ``test_backward_buckets.py`` runs two ranks."""

from __future__ import annotations

import dataclasses
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
        ddp_buckets.after_forward(ddp, out)
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
            ddp_buckets.after_forward(second, b)
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
    ddp, _, recorder = _ddp(tmp_path)
    for _ in range(STEPS):
        _forward(ddp, recorder, True, torch.randn(3, 16)).sum().backward()
    assert type(ddp_buckets._PLANS.get(ddp)) is ddp_buckets._Plan

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(recorder, "record", broken)
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


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    extra: dict


class _Opaque:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_output_nodes_finds_every_tensor_or_says_it_cannot() -> None:
    w = torch.ones(2, requires_grad=True)
    a, b, c = w * 2, w + 1, w.sum()
    assert ddp_buckets.output_nodes(a) == [a.grad_fn]
    assert ddp_buckets.output_nodes(torch.ones(2)) == []
    found = ddp_buckets.output_nodes({"x": (a, [b, None, 3]), "y": "text"})
    assert found is not None and {id(n) for n in found} == {id(a.grad_fn), id(b.grad_fn)}
    found = ddp_buckets.output_nodes(_Out(c, {"same": c}))
    assert found is not None and [id(n) for n in found] == [id(c.grad_fn)]
    assert ddp_buckets.output_nodes([a, _Opaque(b)]) is None


class _P:
    def __init__(self, numel: int, dtype: torch.dtype = torch.float32) -> None:
        self.dtype, self._numel = dtype, numel

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()


def test_layout_from_logging_checks_every_bucket_against_the_parameters() -> None:
    params = [_P(10), _P(20), _P(5, torch.float64), _P(7)]
    data = {"rebuilt_per_bucket_param_indices": "3 1, 0, 2",
            "rebuilt_bucket_sizes": "108, 40, 40"}
    assert ddp_buckets.layout_from_logging(data, params) == (
        (((torch.Size([27]), torch.float32),), 3),
        (((torch.Size([10]), torch.float32),), 0),
        (((torch.Size([5]), torch.float64),), 2))
    for bad in ({"rebuilt_bucket_sizes": "108, 40, 40"},  # not rebuilt yet
                {**data, "rebuilt_bucket_sizes": "108, 41, 40"},  # bytes disagree
                {**data, "rebuilt_bucket_sizes": "108, 40"},  # bucket counts disagree
                {**data, "rebuilt_per_bucket_param_indices": "3 1, 0, 9"},  # no such param
                {**data, "rebuilt_per_bucket_param_indices": "3 2, 0, 1",
                 "rebuilt_bucket_sizes": "68, 40, 80"},  # two dtypes in one bucket
                {**data, "rebuilt_per_bucket_param_indices": "3 x, 0, 2"}):
        assert ddp_buckets.layout_from_logging(bad, params) is None, bad
