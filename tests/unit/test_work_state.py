"""How the writer tells a collective's state from its ``Work``, and how it lists issue times."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch

from ddpdoctor.runtime import writer
from ddpdoctor.runtime.pg_wrapper import quiet_failure_check
from ddpdoctor.runtime.writer import _work_state, issued_json
from ddpdoctor.trace import schema


class _Future:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def value(self) -> None:
        if self.error is not None:
            raise self.error


class _Work:
    """A Work that completed (``error``: how it failed) or is still running."""

    def __init__(self, completed: bool = True, error: Exception | None = None) -> None:
        self.completed, self.error = completed, error
        self.futures = 0

    def is_completed(self) -> bool:
        return self.completed

    def is_success(self) -> bool:
        return self.error is None

    def get_future(self) -> _Future:
        self.futures += 1
        return _Future(self.error)


class _SilentWork(_Work):
    """NCCL's Work: is_success() raises instead of answering."""

    def is_success(self) -> bool:
        raise NotImplementedError("WorkNCCL::isSuccess() is deprecated")


@pytest.fixture
def success_api() -> Iterator[None]:
    saved = writer._is_success_quiet
    writer.use_is_success(True)
    yield
    writer.use_is_success(saved)


def test_is_success_is_quiet_on_this_torch_and_stays_so(
        capfd: pytest.CaptureFixture[str]) -> None:
    assert quiet_failure_check()
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(None)
    work = torch._C._distributed_c10d._create_work_from_future(fut)
    assert work.is_success() is True
    out, err = capfd.readouterr()
    assert out == "" and err == "", err  # the warning was taken once, by the probe


def test_states_read_with_is_success(success_api: None) -> None:
    done, failed, running = _Work(), _Work(error=RuntimeError("peer closed")), _Work(False)
    assert writer._quiet_check()
    assert [_work_state(w, True) for w in (done, failed, running)] == [
        schema.COMPLETED, schema.FAILED, schema.PENDING]
    assert done.futures == failed.futures == 0  # no result turned into Python objects


def test_states_read_from_the_future_give_the_same_answers() -> None:
    done, failed, running = _Work(), _Work(error=RuntimeError("peer closed")), _Work(False)
    assert [_work_state(w, False) for w in (done, failed, running)] == [
        schema.COMPLETED, schema.FAILED, schema.PENDING]
    assert done.futures == 1 and failed.futures >= 1


def test_a_work_that_cannot_say_turns_is_success_off(success_api: None) -> None:
    assert _work_state(_SilentWork(error=RuntimeError("x")), True) == schema.FAILED
    assert _work_state(_SilentWork(), True) == schema.COMPLETED
    assert not writer._is_success_quiet  # asked once, then the futures are


def test_torch_set_to_repeat_warnings_turns_is_success_off(success_api: None) -> None:
    class Loud(_Work):  # is_success() would print the warning again: it must not be asked
        def is_success(self) -> bool:
            raise AssertionError("is_success() asked while torch repeats every warning")

    torch.set_warn_always(True)
    try:
        assert not writer._quiet_check()
        assert not quiet_failure_check()
        failed = Loud(error=RuntimeError("peer closed"))
        assert _work_state(failed, writer._quiet_check()) == schema.FAILED
        assert _work_state(Loud(), writer._quiet_check()) == schema.COMPLETED
    finally:
        torch.set_warn_always(False)
    assert writer._quiet_check()


def _general(unreported: list[float]) -> list:
    """What ``issued`` means: [first id, [time, ...]] per run of consecutive ids."""
    runs: list = []
    for i in range(0, len(unreported), 2):
        cid, t = int(unreported[i]), round(unreported[i + 1], 6)
        if runs and cid == runs[-1][0] + len(runs[-1][1]):
            runs[-1][1].append(t)
        else:
            runs.append([cid, [t]])
    return runs


@pytest.mark.parametrize("ids", [[7], [7, 8, 9, 10], [3, 4, 9, 10, 11, 20], [1, 3]])
def test_issue_times_list_each_run_of_ids(ids: list[int]) -> None:
    unreported: list[float] = []
    for cid in ids:
        unreported += [cid, 1790000000.0 + cid * 0.0003512]
    text = issued_json(unreported)
    assert json.loads(text) == _general(unreported)
    assert all(len(t.split(".")[1]) == 6 for t in text.replace("]", "").split(", ")
               if "." in t)
