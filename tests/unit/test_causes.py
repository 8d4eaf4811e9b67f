"""Every known cause is recognised on a hand-built run of its story; the catalogue is sound."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis.finding import Finding
from ddpdoctor.analysis.rules import RULES
from ddpdoctor.knowledge import catalog
from ddpdoctor.trace.model import Run

from . import scenarios
from .factories import TraceBuilder, make_run, ranks


@pytest.mark.parametrize("scenario, verdict, kind, cause, ranks", [
    (scenarios.seed000_nograd, "diverged", "callsite_divergence",
     "rank_conditional_ddp_forward", [0, 1]),
    (scenarios.eval_at_end_only, "diverged", "missing_collective",
     "rank_conditional_ddp_forward", [0, 1]),
    (scenarios.seed001_case2, "diverged", "missing_collective", "uneven_inputs", [0, 1]),
    (scenarios.seed001_case3, "diverged", "missing_collective", "uneven_inputs", [0, 1]),
    (scenarios.seed001_case4, "diverged", "op_mismatch", "collective_inside_join", [0, 1]),
    (scenarios.seed001_case5, "diverged", "op_mismatch", "uneven_inputs", [0, 1]),
    (scenarios.uneven_loop_without_ddp, "diverged", "missing_collective", "uneven_inputs",
     [0, 1]),
    (scenarios.logging_reduce_on_rank0, "diverged", "op_mismatch",
     "rank_conditional_collective", [0, 1]),
    (scenarios.logging_reduce_no_buffers, "diverged", "op_mismatch",
     "rank_conditional_collective", [0, 1]),
    (scenarios.checkpoint_barrier_on_rank0, "diverged", "missing_collective",
     "rank_conditional_collective", [0, 1]),
    (scenarios.nan_skip, "diverged", "op_mismatch", "data_dependent_skip", [0, 1]),
    (scenarios.micro_batch_skip, "diverged", "shape_mismatch", "data_dependent_skip", [0, 1]),
    (scenarios.seed003_crash, "crashed", "rank_crashed", "rank_crashed", [0, 1]),
    (scenarios.group_inversion, "diverged", "wait_cycle", "group_order_inversion", [0, 1]),
    (scenarios.rank_dependent_shape, "diverged", "shape_mismatch", "rank_dependent_shape",
     [0, 1]),
    (scenarios.rank_dependent_dtype, "diverged", "dtype_mismatch", "rank_dependent_dtype",
     [0, 1]),
    (scenarios.broadcast_root_mismatch, "diverged", "root_mismatch", "broadcast_root_mismatch",
     [0, 1]),
    (scenarios.reduce_op_mismatch, "diverged", "reduce_op_mismatch",
     "rank_dependent_reduce_op", [0, 1]),
    (scenarios.model_mismatch, "diverged", "shape_mismatch", "ddp_model_mismatch", [0, 1]),
])
def test_cause_is_recognised(scenario, verdict, kind, cause, ranks) -> None:
    report = diagnose(scenario())
    root = report.root
    assert (report.verdict, root.kind, root.cause) == (verdict, kind, cause), root.summary
    assert sorted(root.ranks) == ranks
    assert root.advice == catalog.get(cause).fix


@pytest.mark.parametrize("scenario", [
    lambda: scenarios.seed001_join_healthy(False),
    lambda: scenarios.seed001_join_healthy(True),
])
def test_join_cases_1_and_6_are_clean(scenario) -> None:
    report = diagnose(scenario())
    assert report.verdict == "clean" and report.findings == []


def test_seed000_names_both_lines_and_the_broadcast_buffers_flag() -> None:
    root = diagnose(scenarios.seed000_nograd()).root
    assert root.ranks[0].site.function == "evaluate" and root.ranks[1].site.function == "main"
    assert any("evaluate()" in e for e in root.evidence)
    assert any("broadcast_buffers=True" in e for e in root.evidence)
    assert "model.module(x)" in root.advice


def test_a_model_without_buffers_is_not_said_to_broadcast_them() -> None:
    root = diagnose(scenarios.extra_step_without_buffers()).root
    assert root.cause == "rank_conditional_ddp_forward", root.summary
    assert root.ranks[0].label == "ddp.rebuild_buckets"
    assert any("demo_basic()" in e for e in root.evidence)
    assert not any("broadcast_buffers" in e for e in root.evidence)


def test_uneven_inputs_evidence_counts_iterations() -> None:
    root = diagnose(scenarios.seed001_case5()).root
    assert root.ranks[0].op == "barrier" and root.ranks[1].label == "ddp.bucket"
    assert root.evidence == ["DDP iterations per rank: rank 0: 5, rank 1: 6"]


def test_collective_inside_join_names_the_user_line_and_the_join_step() -> None:
    root = diagnose(scenarios.seed001_case4()).root
    assert root.ranks[1].label == "user" and root.ranks[1].site.line == 22
    assert root.ranks[0].label == "join.num_nonjoined"
    assert "join" in root.evidence[0] and "barrier" in root.evidence[0]


def test_follow_on_findings_share_the_root_cause() -> None:
    report = diagnose(scenarios.seed001_case2())
    assert [f.kind for f in report.findings] == ["missing_collective", "rank_exited_early",
                                                 "rank_crashed"]
    assert {f.cause for f in report.findings} == {"uneven_inputs"}


def test_crash_summary_says_where_the_others_were_left() -> None:
    root = diagnose(scenarios.seed003_crash()).root
    assert root.ranks[1].site.line == 8 and root.ranks[1].state == "exception"
    assert root.ranks[0].label == "ddp.bucket" and root.ranks[0].site.line == 21
    assert "rank 0 was left waiting in DDP gradient bucket 0 of iteration 3" in root.summary


def test_catalogue_has_every_rule_cause_and_complete_entries() -> None:
    causes = catalog.causes()
    for cause_id, _rule in RULES:
        assert cause_id in causes
    for required in ("rank_conditional_ddp_forward", "uneven_inputs", "collective_inside_join",
                     "rank_conditional_collective", "rank_crashed", "group_order_inversion",
                     "rank_dependent_shape", "broadcast_root_mismatch", "gloo_teardown_abort",
                     # named by analysis/endings.py, not by a rule
                     "rank_stuck_in_user_code", "rank_never_initialised"):
        assert required in causes
    for cause in causes.values():
        assert cause.title and len(cause.explanation) > 80 and len(cause.fix) > 40


def test_catalogue_is_read_with_a_safe_loader_once(monkeypatch) -> None:
    loaders = []
    real = yaml.load
    monkeypatch.setattr(yaml, "load", lambda text, Loader: loaders.append(Loader) or
                        real(text, Loader=Loader))
    catalog.causes.cache_clear()
    try:
        for _ in range(3):
            assert catalog.get("uneven_inputs") is not None
        assert len(loaders) == 1 and loaders[0] in (getattr(yaml, "CSafeLoader", None),
                                                     yaml.SafeLoader), loaders
    finally:
        catalog.causes.cache_clear()


# -- the source settles what the trace cannot ---------------------------------------------------
TRAIN_SCRIPT = '''\
import torch.distributed as dist


def main(model, loader, rank):
    for epoch in range(3):
        for x in loader:
            loss = model(x).sum()
            loss.backward()
        if rank == 0:
            save(model)
            dist.barrier()
    dist.all_reduce(total)
'''


def _builders(tmp_path: Path, script: str) -> list[TraceBuilder]:
    """Two ranks' trace builders whose frames are in ``script`` (written as train.py)."""
    path = tmp_path / "train.py"
    path.write_text(script)
    return [TraceBuilder(r, 2, file=str(path)) for r in range(2)]


def _script_run(tmp_path, rank0_line: int, rank0_op: str):
    bs = _builders(tmp_path, TRAIN_SCRIPT)
    for b in bs:
        b.ddp_init(line=4)
        for _ in range(4):
            b.forward(line=7).backward(line=8)
    bs[0].user(rank0_op, line=rank0_line).pend_last()
    bs[1].forward(line=7).pend_last()
    return make_run(*bs, stopped_for_hang=True)


def test_barrier_under_rank_test_is_rank_conditional_not_uneven(tmp_path) -> None:
    root = diagnose(_script_run(tmp_path, 11, "barrier")).root
    assert root.kind == "op_mismatch" and root.cause == "rank_conditional_collective"
    assert "train.py:9 `if rank == 0:`" in root.evidence[0]


def test_collective_after_the_loop_with_more_iterations_elsewhere_is_uneven(tmp_path) -> None:
    root = diagnose(_script_run(tmp_path, 12, "all_reduce")).root
    assert root.kind == "op_mismatch" and root.cause == "uneven_inputs"


def _rank0_runs_more(tmp_path, script: str, both: Callable[[TraceBuilder], object],
                     more: Callable[[TraceBuilder], object]) -> Finding:
    """The root finding of 2 ranks that ran ``both`` after building DDP, then rank 0 alone
    ``more`` (its last collective pending) while rank 1 finished; ``script``: train.py."""
    path = tmp_path / "train.py"
    path.write_text(script)
    bs = [TraceBuilder(r, 2, file=str(path)) for r in range(2)]
    for b in bs:
        b.ddp_init(line=1)
        both(b)
    more(bs[0])
    bs[0].pend_last()
    bs[1].finish()
    return diagnose(make_run(*bs)).root


def test_ddp_forward_called_under_rank_test_is_named(tmp_path) -> None:
    def evaluate(b: TraceBuilder) -> None:
        b.forward(line=9, function="evaluate", grad=False)
        for c in b.trace.collectives[-2:]:  # called from main() line 5
            c.stack.append(b.site(5, "main"))

    root = _rank0_runs_more(tmp_path, "def main():\n    for x in data:\n        model(x)\n"
                            "    if rank == 0:\n        evaluate(model)\n\n\n"
                            "def evaluate(model):\n    model(x)\n",
                            lambda b: b.train(2), evaluate)
    assert root.cause == "rank_conditional_ddp_forward"
    assert any("train.py:4 `if rank == 0:`" in e for e in root.evidence)


def test_an_extra_training_step_on_one_rank_is_said_to_be_one(tmp_path) -> None:
    """pytorch/examples' multigpu_torchrun.py with one more batch on rank 0 (its
    ``_run_batch`` called again under ``if ... gpu_id == 0``): a model without buffers, so the
    first unmatched collective is the extra step's gradient bucket, not an evaluation's
    broadcast, and the fix must not stop at ``model.module(x)``."""
    def batch(b: TraceBuilder, caller_line: int) -> None:
        b.forward(buffers=False, rebuild=False, line=9, function="run_batch")
        b.backward(line=9, function="run_batch")
        b.trace.collectives[-1].stack.append(b.site(caller_line, "run_epoch"))

    root = _rank0_runs_more(tmp_path, "def run_epoch():\n    for x in data:\n"
                            "        run_batch(x)\n    if rank == 0:\n        run_batch(x)\n\n\n"
                            "def run_batch(x):\n    model(x).backward()\n",
                            lambda b: [batch(b, 3) for _ in range(3)], lambda b: batch(b, 5))
    assert root.cause == "rank_conditional_ddp_forward", root.summary
    assert root.ranks[0].label == "ddp.bucket"
    assert any("train.py:4 `if rank == 0:`" in e for e in root.evidence)
    assert any("gradient bucket" in e and "training step" in e for e in root.evidence)
    assert "with model.join():" in root.advice


def test_an_evaluation_forward_is_not_said_to_be_a_training_step() -> None:
    root = diagnose(scenarios.seed000_nograd()).root
    assert root.cause == "rank_conditional_ddp_forward"
    assert not any("training step" in e for e in root.evidence)


def test_catalogue_examples_exist() -> None:
    root = Path(__file__).resolve().parents[2]
    for cause in catalog.causes().values():
        if cause.example:
            assert (root / cause.example).is_file(), cause.example


@pytest.mark.parametrize("message", [
    "Distributed package doesn't have NCCL built in",  # pytorch/examples ddp/example.py
    "module 'torch._C' has no attribute '_cuda_setDevice'",  # torch.cuda.set_device
    "No CUDA GPUs are available",
    "torch.cuda.Stream requires CUDA support",
])
def test_a_script_that_needs_a_gpu_on_a_machine_without_one_is_told_to_use_cpu(
        message: str) -> None:
    bs = [TraceBuilder(r, 2) for r in range(2)]
    for b in bs:
        b.raise_("RuntimeError", message, line=12)
    root = diagnose(make_run(*bs)).root
    assert root.kind == "rank_crashed" and root.cause == "no_gpu"
    assert "--cpu" in " ".join(root.evidence)


def test_a_cuda_failure_under_cpu_mode_is_a_limit_of_cpu_mode_not_advice_to_use_it() -> None:
    # pytorch/examples' tensor_parallel_example.py under --cpu: its "cuda" device mesh fails in
    # backward; telling the user to run with --cpu (they did) would be wrong.
    bs = [TraceBuilder(r, 2) for r in range(2)]
    for b in bs:
        b.trace.process = {**(b.trace.process or {}), "cpu_mode": True}
        b.raise_("AssertionError", "Torch not compiled with CUDA enabled", line=120)
    root = diagnose(make_run(*bs)).root
    assert root.kind == "rank_crashed" and root.cause == "cpu_mode_unmapped"
    evidence = " ".join(root.evidence)
    assert "line 120" in evidence or ":120" in evidence
    assert "ran with --cpu" in evidence and "`ddpdoctor run --cpu`" not in evidence


def test_two_ranks_on_one_gpu_is_named_with_nccls_own_line() -> None:
    """What NCCL 2.28 raised on the device machine: both ranks of a 2-rank job on cuda:0."""
    message = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, invalid "
               "usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.28.9\n"
               "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
               "Last error:\nDuplicate GPU detected : rank 0 and rank 1 both on CUDA device 60")
    bs = [TraceBuilder(r, 2) for r in range(2)]
    for b in bs:
        b.raise_("DistBackendError", message, line=7)
    root = diagnose(make_run(*bs)).root
    assert root.kind == "rank_crashed" and root.cause == "shared_gpu"
    assert root.evidence == ["NCCL refused ranks 0, 1: Duplicate GPU detected : rank 0 and "
                             "rank 1 both on CUDA device 60"]
    assert "set_device" in root.advice


def test_ranks_that_each_called_a_collective_of_their_own_are_each_named() -> None:
    # Rank 0 all-reduces at one line while rank 1 waits in a barrier at another: the evidence
    # names each rank's own call (it once said both ranks called rank 0's all_reduce).
    bs = [TraceBuilder(r, 2) for r in range(2)]
    for b in bs:
        b.user("all_reduce", line=5)
    bs[0].user("all_reduce", line=10).pend_last()
    bs[1].user("barrier", line=12).pend_last()
    root = diagnose(make_run(*bs, stopped_for_hang=True)).root
    assert (root.kind, root.cause) == ("op_mismatch", "rank_conditional_collective")
    assert root.evidence == ["rank 0 called all_reduce at train.py:10 in main(); "
                             "rank 1 called barrier at train.py:12 in main()"], root.evidence


TRAINER_SCRIPT = '''\
def run_batch(model, x):
    loss = model(x).sum()
    return loss


def train(model, loader, rank):
    for epoch in range(3):
        for x in loader:
            run_batch(model, x).backward()
        if rank == 0:
            run_batch(model, x)
'''


def _trainer_step(b: TraceBuilder, caller: int, grad: bool = True) -> None:
    """A DDP forward through ``run_batch`` called from ``train`` line ``caller`` (and, with
    ``grad``, its backward at line 9)."""
    start = len(b.trace.collectives)
    b.forward(line=2, function="run_batch", grad=grad)
    for c in b.trace.collectives[start:]:
        c.stack.append(b.site(caller, "train"))
    if grad:
        b.backward(line=9, function="train")


def _trained(tmp_path: Path) -> list[TraceBuilder]:
    """Two ranks of TRAINER_SCRIPT after DDP's construction and three training steps."""
    bs = _builders(tmp_path, TRAINER_SCRIPT)
    for b in bs:
        b.ddp_init(line=7)
        for _ in range(3):
            _trainer_step(b, 9)
    return bs


def test_a_ddp_forward_through_a_helper_shared_by_training_and_evaluation(tmp_path) -> None:
    # minGPT's Trainer (pytorch/examples) runs training and evaluation through one
    # _run_batch(): with evaluation on rank 0 alone, both ranks' DDP forwards come from the
    # same line, and only the caller tells rank 0's evaluation from rank 1's training.
    bs = _trained(tmp_path)
    _trainer_step(bs[0], 11, grad=False)  # rank 0 evaluates (no_grad: no buckets)
    for _ in range(2):
        _trainer_step(bs[0], 9)
        _trainer_step(bs[1], 9)
    bs[0].forward(line=2, function="run_batch").pend_last()  # one broadcast more: it waits
    bs[1].finish()
    report = diagnose(make_run(*bs, stopped_for_hang=True))
    root = report.root
    assert (report.verdict, root.kind, root.cause) == \
        ("diverged", "callsite_divergence", "rank_conditional_ddp_forward"), root.summary
    assert root.seq == 16  # DDP init (4), 3 steps (11, the bucket rebuild included), then eval
    assert "from different callers" in root.summary
    assert "called from train.py:11 in train()" in root.summary
    assert "called from train.py:9 in train()" in root.summary
    assert any("train.py:10 `if rank == 0:`" in e for e in root.evidence), root.evidence


def test_the_same_helper_called_from_one_place_on_every_rank_is_clean(tmp_path) -> None:
    bs = [b.finish() for b in _trained(tmp_path)]
    report = diagnose(make_run(*bs))
    assert report.verdict == "clean" and report.findings == []


CHECKPOINT_SCRIPT = '''\
import torch.distributed as dist


def demo_checkpoint(model, x, rank):
    loss = model(x).sum()
    if rank == 0:
        dist.all_reduce(loss.detach())
    loss.backward()
'''


def test_a_rank_test_collective_meeting_a_gradient_bucket_is_rank_conditional(tmp_path) -> None:
    """Rank 0's all_reduce of a scalar (under ``if rank == 0:``) meets rank 1's gradient
    bucket: a shape mismatch whose cause is the rank test, not a DDP forward run only on some
    ranks (rank 0 is in the same function; its forward issued nothing, having no buffers)."""
    bs = _builders(tmp_path, CHECKPOINT_SCRIPT)
    for b in bs:
        b.ddp_init(line=5)
        b.forward(line=5, function="demo_checkpoint", buffers=False)
    bs[0].user("all_reduce", shapes=[[]], line=7, function="demo_checkpoint").pend_last()
    bs[1].backward(line=8, function="demo_checkpoint", state="pending")
    root = diagnose(make_run(*bs, stopped_for_hang=True)).root
    assert root.kind == "shape_mismatch" and root.cause == "rank_conditional_collective", root
    assert "train.py:6 `if rank == 0:`" in root.evidence[0]


def _teardown_run(rank1_error: str) -> Run:
    """Rank 0 stops issuing after 3 iterations (outside collectives, no CPU, a thread died)
    and ends by SIGTERM; rank 1 waits in iteration 4's bucket and fails with ``rank1_error``."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].trace.activity = {"kind": "activity", "t": 2000.0, "cpu_rate": 0.0,
                            "frames": [{"file": "/job/train.py", "line": 17,
                                        "function": "<module>"}]}
    bs[0].trace.thread_errors.append({"kind": "thread_exception", "thread": "prefetch",
                                      "type": "ValueError", "message": "corrupt record",
                                      "frames": [{"file": "/job/data.py", "line": 8,
                                                  "function": "producer"}]})
    bs[1].step().fail_last().raise_("RuntimeError", rank1_error, line=18, internal=True)
    return make_run(*bs, exit_codes={0: -15, 1: 1})


def test_a_rank_sigtermed_after_its_peer_timed_out_is_the_rank_waited_for() -> None:
    report = diagnose(_teardown_run(scenarios.TIMEOUT))
    root = report.root
    assert root.kind == "missing_collective" and root.cause == "rank_blocked_outside_collectives"
    text = " ".join(root.evidence)
    assert "train.py:17 in <module>(), using no CPU" in text
    assert 'thread "prefetch" died: ValueError: corrupt record at data.py:8' in text
    assert all(f.follow_on for f in report.findings if f.kind == "rank_crashed")


def test_a_rank_sigtermed_before_its_peer_lost_the_connection_is_still_the_crash() -> None:
    """'Connection closed by peer' means the SIGTERMed rank went first: it stays the root."""
    root = diagnose(_teardown_run(scenarios.CONN_CLOSED)).root
    assert root.kind == "rank_crashed" and 0 in root.ranks and not root.follow_on
    assert "SIGTERM" in root.summary


def test_a_timeout_outside_any_collective_stays_the_root_beside_a_torn_down_rank() -> None:
    """Rank 0 times out connecting to rank 1 (gloo's mesh, after a torchrun restart) and
    torchrun SIGTERMs rank 1, which never got that far: rank 0's failure is the root, and
    not every finding is a follow-on."""
    bs = ranks(2)
    bs[0].raise_("RuntimeError", "Gloo connectFullMesh failed with timed out connecting",
                 line=10, internal=True)
    report = diagnose(make_run(*bs, exit_codes={0: 1, 1: -15}))
    root = report.root
    assert root.kind == "rank_crashed" and not root.follow_on and 0 in root.ranks, root


def test_a_rank_inside_an_unrecorded_distributed_call_gets_no_cause() -> None:
    """Rank 0's stack at the hang is inside a torch.distributed call with nothing recorded as
    pending (a call the record misses): 'iterations 3 vs 4' is then no uneven-inputs story."""
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[1].step().pend_last()
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    bs[0].trace.hang = {"kind": "hang", "t": 2000.0, "pending": [], "threads": [
        {"thread": "MainThread", "main": True, "frames": [
            {"file": "/job/train.py", "line": 20, "function": "main"},
            {"file": "/job/train.py", "line": 9, "function": "save_best"},
            {"file": c10d, "line": 4800, "function": "new_thing"},
            {"file": c10d, "line": 4900, "function": "_wait"}]}]}
    report = diagnose(make_run(*bs, stopped_for_hang=True))
    root = report.root
    assert root.kind == "missing_collective" and root.cause is None, (root.kind, root.cause)
    assert "torch.distributed.distributed_c10d.new_thing()" in root.evidence[0]
    assert any("inside torch.distributed.distributed_c10d.new_thing()" in n
               for n in report.notes)


def test_a_wait_cycle_in_one_group_is_not_a_group_order_inversion() -> None:
    """group_order_inversion's premise is two groups; a cycle of sends and receives inside one
    group is p2p_peer_mismatch (issue 54: a one-group p2p ring was called an inversion)."""
    from ddpdoctor.analysis import premises
    from ddpdoctor.analysis.finding import Finding, FindingKind, RankDetail, Severity
    from ddpdoctor.analysis.rules import _group_order_inversion, _p2p_peer_mismatch

    def cycle(*waits: tuple[str, str]) -> Finding:
        return Finding(FindingKind.WAIT_CYCLE, Severity.ERROR, waits[0][1], None, "deadlock",
                       {r: RankDetail(rank=r, op=op, group=g) for r, (op, g) in enumerate(waits)})

    def given(cause: str, rule, f: Finding) -> bool:
        # These premises read the finding alone: no context needed.
        return rule(f, None) is not None and \
            not premises.denied(catalog.get(cause).premises, f, None)  # type: ignore[arg-type]

    inversion = ("group_order_inversion", _group_order_inversion)
    p2p = ("p2p_peer_mismatch", _p2p_peer_mismatch)
    one_group_p2p = cycle(("recv", "0"), ("recv", "0"))
    assert not given(*inversion, one_group_p2p) and given(*p2p, one_group_p2p)
    two_groups = cycle(("all_reduce", "1"), ("all_reduce", "2"))
    assert given(*inversion, two_groups) and not given(*p2p, two_groups)
    one_group_collectives = cycle(("all_reduce", "0"), ("broadcast", "0"))
    assert not given(*inversion, one_group_collectives)
    assert not given(*p2p, one_group_collectives)


def test_a_dtype_only_difference_is_never_told_to_pad_and_a_shape_one_never_to_cast() -> None:
    """Each of the two causes on the facts that deny the other's premise: a float32-vs-float64
    metric gets the dtype cause (not "pad to a common size"), and a shape difference the shape
    cause; the dtype evidence names each rank's dtype."""
    dtype = diagnose(scenarios.rank_dependent_dtype()).root
    assert dtype.cause == "rank_dependent_dtype"
    assert dtype.evidence == ["rank 0 passed float64; rank 1 passed float32 tensors of the same "
                              "shape"]
    assert "Pad" not in dtype.advice and "dtype" in dtype.advice
    shape = diagnose(scenarios.rank_dependent_shape()).root
    assert shape.cause == "rank_dependent_shape" and "dtype" not in shape.advice


def test_a_skip_is_data_dependent_only_where_the_skipping_rank_ran_the_line_before() -> None:
    """The premise that tells a data-dependent skip from an `if rank == 0:` block: the rank
    that did not issue the collective had issued it from the same line before. A reduce that
    rank 1 never issued is rank-conditional; the same pair where rank 1 had issued it is a
    skip, never described as an `if rank == 0:` block."""
    never = diagnose(scenarios.logging_reduce_on_rank0()).root
    assert never.cause == "rank_conditional_collective"
    skipped = diagnose(scenarios.micro_batch_skip()).root
    assert skipped.cause == "data_dependent_skip"
    assert skipped.evidence == ["rank 1 had issued all_reduce at train.py:30 in main() before, "
                                "so no rank test keeps it from it; here rank 0 issued it and "
                                "rank 1 did not"]
    assert "rank == 0" not in catalog.get("data_dependent_skip").title
