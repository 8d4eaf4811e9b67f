"""The torch behaviours the recorder relies on, checked against the installed torch.

If one of these fails on a new torch release, the recorder's labels or hooks need updating
(and ``torch_internals.VERIFIED`` widened only then). ``scripts/torch-matrix`` runs this file on
every release of the verified range.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.distributed as dist

from ddpdoctor.runtime import torch_internals
from ddpdoctor.trace import ddp_sites


def _module_file(suffix: str) -> str:
    return os.path.join(os.path.dirname(torch.__file__), *suffix.split("/"))


@pytest.mark.parametrize("rule", ddp_sites.RULES, ids=lambda r: f"{r[1]}->{r[3]}")
def test_every_label_rule_names_a_function_that_exists(rule: tuple) -> None:
    suffix, function, text, _label, _prio = rule
    path = _module_file(suffix)
    source = open(path).read()
    if function != "*":
        assert f"def {function}(" in source, f"{function} not in {suffix}"
    if text is not None:
        body = source.split(f"def {function}(", 1)[1].split("\n    def ", 1)[0]
        assert text in body


@pytest.mark.parametrize("frame", [ddp_sites.SPAWN_WRAP, ddp_sites.BACKWARD,
                                   *ddp_sites.INIT_FUNCTIONS], ids=lambda f: f[1])
def test_every_frame_attach_reads_names_a_function_that_exists(frame: tuple) -> None:
    suffix, function = frame
    assert f"def {function}(" in open(_module_file(suffix)).read(), f"{function} not in {suffix}"


def test_torchruns_agent_modules_exist() -> None:
    import importlib.util

    for name in ddp_sites.AGENT_MODULES:
        assert importlib.util.find_spec(name) is not None, name


def test_installed_torch_is_verified_and_has_what_the_recorder_needs() -> None:
    assert torch_internals.supported(torch.__version__)
    assert torch_internals.contract_problems() == []
    assert torch_internals.supported("2.6.0") and torch_internals.supported("2.15.0+cu128")
    assert not torch_internals.supported("2.5.1") and not torch_internals.supported("3.0.0")


def test_ddps_coalesced_broadcast_is_a_torch_distributed_function_ddp_calls_by_name() -> None:
    # torch_hooks replaces torch.distributed._broadcast_coalesced; DDP must look it up there
    # at each call (its buffer broadcast, its parameter sync at construction).
    found = torch_internals.broadcast_coalesced()
    assert found is not None
    from torch.nn.parallel import distributed as ddp_module

    source = inspect.getsource(ddp_module)
    assert source.count("dist._broadcast_coalesced(") >= 1
    assert "_broadcast_coalesced" not in vars(ddp_module)  # not imported by name


def test_ddps_buckets_can_be_recorded_once_per_backward() -> None:
    # runtime/ddp_buckets.py: DDP's _post_forward and the methods that change how its Reducer
    # issues buckets, the Reducer's process group update, gloo's sequence number, the autograd
    # engine's node query and end-of-backward callbacks (test_ddp_buckets.py runs them).
    assert torch_internals.per_backward_buckets()


def test_c10d_returns_a_python_process_group_from_a_backend_creator() -> None:
    # _new_process_group_helper keeps a ProcessGroup subclass returned by a plugin's creator.
    source = inspect.getsource(dist.distributed_c10d._new_process_group_helper)
    assert ("issubclass(type(backend_class), ProcessGroup)" in source  # torch <= 2.14
            or "isinstance(backend_class, ProcessGroup)" in source)  # torch 2.15


def test_python_process_group_methods_the_recorder_overrides_exist() -> None:
    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup

    for name in ("allreduce", "broadcast", "barrier", "allgather", "reduce", "reduce_scatter",
                 "alltoall", "gather", "scatter", "send", "recv"):
        assert hasattr(dist.ProcessGroup, name)
        assert name in RecordingProcessGroup.__dict__
    # Names that newer releases give the single-tensor ops (torch 2.9+); older ones reach
    # _allgather_base, _reduce_scatter_base and alltoall_base, which the wrapper also has.
    for name in ("all_to_all_single", "all_gather_single", "reduce_scatter_single",
                 "_allgather_base", "_reduce_scatter_base", "alltoall_base"):
        assert name in RecordingProcessGroup.__dict__
    for inner in ("allreduce", "broadcast", "barrier", "allgather", "_allgather_base",
                  "reduce", "reduce_scatter", "_reduce_scatter_base", "alltoall",
                  "alltoall_base", "gather", "scatter", "send", "recv", "recv_anysource"):
        assert hasattr(dist.ProcessGroupGloo, inner)


def test_ddp_methods_the_recorder_wraps_exist() -> None:
    from torch.nn.parallel import distributed as ddp_mod

    ddp = ddp_mod.DistributedDataParallel
    assert callable(ddp._pre_forward)
    assert callable(ddp_mod._DDPJoinHook.main_hook)
    for attr in ("broadcast_buffers", "find_unused_parameters", "bucket_bytes_cap",
                 "static_graph", "gradient_as_bucket_view"):
        assert attr in inspect.getsource(ddp.__init__)
    import importlib

    spawn = importlib.import_module("torch.multiprocessing.spawn")
    assert list(inspect.signature(spawn._wrap).parameters) == ["fn", "i", "args", "error_file"]


def test_elastic_function_workers_wait_for_a_return_value_where_max_steps_hands_it() -> None:
    # runtime/max_steps.py: a rank torchrun runs as a function (--run-path) puts its return
    # value in the queue of elastic's _wrap frame before it leaves.
    from torch.distributed.elastic.multiprocessing import api

    params = inspect.signature(api._wrap).parameters
    assert {"local_rank", "ret_vals", "queue_finished_reading_event"} <= set(params)
    assert api._wrap.__code__.co_filename.replace(os.sep, "/").endswith(
        "distributed/elastic/multiprocessing/api.py")


def test_coalesced_ops_gloo_binds_in_cpp_only_reach_gloo_through_the_wrapper(
        tmp_path) -> None:
    # FSDP2 and DTensor issue allgather_into_tensor_coalesced / reduce_scatter_tensor_coalesced,
    # which ProcessGroupGloo has no Python method for: the wrapper reaches them through a
    # process group holding gloo alone (once, it raised AttributeError in the user's job).
    from datetime import timedelta

    from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
    from ddpdoctor.runtime.recorder import Recorder

    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    assert not hasattr(gloo, "allgather_into_tensor_coalesced")  # else this test is moot
    recorder = Recorder(str(tmp_path), "run")
    recorder.start(0, 1, "gloo")
    pg = RecordingProcessGroup(gloo, None, 0, 1, "0", recorder)
    gathered = [torch.zeros(3), torch.zeros(2)]
    pg.allgather_into_tensor_coalesced(gathered, [torch.full((3,), 2.0), torch.ones(2)],
                                       dist.distributed_c10d.AllgatherOptions()).wait()
    reduced = [torch.zeros(2)]
    pg.reduce_scatter_tensor_coalesced(reduced, [torch.full((2,), 5.0)],
                                       dist.ReduceScatterOptions()).wait()
    recorder.close()
    assert gathered[0].tolist() == [2.0] * 3 and gathered[1].tolist() == [1.0] * 2
    assert reduced[0].tolist() == [5.0, 5.0]
    text = (tmp_path / "rank-0.jsonl").read_text()
    assert '"op": "all_gather_into_tensor_coalesced"' in text
    assert '"op": "reduce_scatter_tensor_coalesced"' in text


def test_reduce_op_names_are_read_right_whether_or_not_the_hash_shortcut_applies() -> None:
    # pg_wrapper reads the op by hash(opts.reduceOp), cached only where the hash is the
    # RedOpType value (it is on 2.6 to 2.15): every op must come out under its own name.
    from ddpdoctor.runtime import pg_wrapper

    names = ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
    for _ in range(2):  # the first round fills the cache, the second reads it
        for name in names:
            opts = dist.AllreduceOptions()
            opts.reduceOp = getattr(dist.ReduceOp, name)
            assert pg_wrapper._reduce_op(opts) == name
    assert set(pg_wrapper._REDUCE_OP_NAMES.values()) <= set(names)
    assert pg_wrapper._reduce_op(None) is None  # an op called without options
    # Every reduce op this torch has is one a trace may name (others are read as damage).
    from ddpdoctor.trace import ops

    assert set(dist.ReduceOp.RedOpType.__members__) <= ops.REDUCE_OPS


def test_an_op_whose_hash_is_not_its_value_is_never_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.runtime import pg_wrapper

    class Kind:
        name, value = "MAX", 4

    class Op:
        op = Kind()

        def __hash__(self) -> int:
            return 0  # SUM's value: a cached entry under it would turn SUM into MAX

    class Opts:
        reduceOp = Op()

    monkeypatch.setattr(pg_wrapper, "_REDUCE_OP_NAMES", {})
    assert pg_wrapper._reduce_op(Opts()) == "MAX"
    assert pg_wrapper._REDUCE_OP_NAMES == {}


def test_a_flight_recorder_dump_exists_and_sequence_numbers_need_setting_before_2_15() -> None:
    """The watchdog dumps every flight-recorder ring torch has (2.6 has NCCL's only, under
    ``_dump_nccl_trace``; gloo's generic ring came later as ``_dump_fr_trace``), and calls
    ``_set_sequence_number_for_group`` only where it is not a deprecated no-op."""
    from datetime import timedelta

    c10d = torch._C._distributed_c10d
    assert any(hasattr(c10d, name) for name in torch_internals.FLIGHT_RECORDER_DUMPS)
    dump = torch_internals.flight_recorder_dump()
    assert isinstance(dump.get("entries", []), list)
    pg = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timeout=timedelta(seconds=5))
    torch_internals.start_sequence_numbers(pg)
    assert pg._get_sequence_number_for_group() == 0
    # Before 2.15 the setter is needed, and from 2.15 on torch still has it (a no-op that warns).
    assert callable(pg._set_sequence_number_for_group)


def test_the_declared_torch_range_is_the_verified_one() -> None:
    import re
    from pathlib import Path

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    low, high = re.search(r'"torch>=(\d+\.\d+),<(\d+\.\d+)"', pyproject).groups()  # type: ignore[union-attr]
    (lo_major, lo_minor), (hi_major, hi_minor) = torch_internals.VERIFIED
    assert low == f"{lo_major}.{lo_minor}"
    assert high == f"{hi_major}.{hi_minor + 1}"
