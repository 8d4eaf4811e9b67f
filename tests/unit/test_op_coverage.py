"""Nothing a rank calls escapes the record by accident: every method of the installed torch's
ProcessGroup and every function of torch.distributed's c10d API is either recorded or listed
in ``trace/ops.py`` as deliberately not, with its reason. A new torch release that adds an
entry point fails here until it is placed."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
from ddpdoctor.trace import ops

RECORDED = {m for op in ops.OPS for m in op.methods}


def _installed() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def test_every_process_group_method_is_recorded_or_listed_with_a_reason() -> None:
    names = {n for n in dir(dist.ProcessGroup) if not n.startswith("__")}
    internal = {n for n in names if n.startswith("_") and n not in RECORDED
                and n not in ops.NOT_RECORDED}
    # Underscored methods are torch's plumbing unless they carry tensors: those are listed.
    plumbing = {n for n in internal if not any(w in n for w in (
        "gather", "reduce", "scatter", "broadcast", "barrier", "send", "recv", "alltoall"))}
    unplaced = sorted((names - RECORDED - set(ops.NOT_RECORDED)) - plumbing)
    assert not unplaced, f"ProcessGroup methods neither recorded nor listed: {unplaced}"


def test_every_recorded_method_is_defined_by_the_recording_group() -> None:
    for op in ops.OPS:
        for method in op.methods:
            assert method in vars(RecordingProcessGroup), (op.name, method)
        # One of its names at least is torch's (older releases lack some aliases).
        if op.name != "monitored_barrier" and op.since <= _installed():
            assert any(hasattr(dist.ProcessGroup, m) for m in op.methods), op


def test_every_c10d_function_issues_recorded_ops_or_is_listed_with_a_reason() -> None:
    public = {n for n in distributed_c10d.__all__
              if n[:1].islower() and callable(getattr(distributed_c10d, n, None))}
    unplaced = sorted(public - set(ops.ISSUING) - set(ops.NOT_ISSUING))
    assert not unplaced, f"torch.distributed functions neither recorded nor listed: {unplaced}"
    for name, issued in ops.ISSUING.items():
        assert set(issued) <= set(ops.BY_NAME), (name, issued)


def test_every_reason_is_a_sentence_and_nothing_is_listed_twice() -> None:
    for table in (ops.NOT_RECORDED, ops.NOT_ISSUING):
        assert all(isinstance(v, str) and len(v) >= 5 for v in table.values())
    assert not set(ops.NOT_RECORDED) & RECORDED
    assert not set(ops.NOT_ISSUING) & set(ops.ISSUING)


def test_the_analysis_and_the_flight_recorder_read_the_same_table() -> None:
    from ddpdoctor.analysis import signature, terms
    from ddpdoctor.trace import flight_recorder

    assert terms.REDUCING_OPS is ops.REDUCING and signature.FREE_SHAPE_OPS is ops.UNEVEN
    assert "ops.FR_NAMES" in inspect.getsource(flight_recorder)


def test_the_trace_format_documents_every_op_and_every_unrecorded_entry_point() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "trace-format.md").read_text()
    names = [op.name for op in ops.OPS] + list(ops.NOT_RECORDED) + list(ops.NOT_ISSUING)
    missing = [n for n in names if f"`{n}`" not in doc]
    assert not missing, f"not in docs/trace-format.md: {missing}"
