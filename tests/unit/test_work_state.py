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
from ddpdoctor.trace.records import issued_of


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
    """What ``issued`` means: [first id, [time, ...]] per run of consecutive ids (times in
    microseconds)."""
    runs: list = []
    for i in range(0, len(unreported), 2):
        cid, t = int(unreported[i]), round(unreported[i + 1] * 1e6)
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
    text = issued_json([int(c) for c in unreported[0::2]], unreported[1::2])
    runs = json.loads(text)
    # Each run: its first id, its first time to the microsecond, µs from it (format 9).
    assert all(len(run) == 3 and all(type(us) is int for us in run[2]) for run in runs)
    assert all(len(t.split(".")[1]) == 6 for t in text.replace("]", "").split(", ")
               if "." in t)
    decoded = [[first, [round(t * 1e6) for t in times]]
               for first, times in issued_of({schema.ISSUED: runs})]
    assert decoded == _general(unreported)


def test_the_writer_tracks_what_runs_until_its_work_completes(tmp_path) -> None:
    # The issuing thread stores only the Work, after the backend returned it; the writer
    # thread keeps the fields of what still runs. In between, and while the backend has not
    # returned (no Work yet), the collective is pending.
    w = writer.TraceWriter(str(tmp_path / "rank-0.jsonl"), schema.header(0, "r", 0), 0,
                           interval=3600)
    site = w.site("0", "all_reduce", "user", "all_reduce", (((4,), "torch.float32"),), "SUM",
                  None, None, ())
    ids = [w.write_at(site, seq, None, None, 3, 100.0 + seq) for seq in (1, 2, 3, 4)]
    running, failing = _Work(completed=False), _Work(error=RuntimeError("peer closed"))
    w.returned(ids[0], _Work())
    w.returned(ids[1], running)
    w.returned(ids[3], failing)  # ids[2]: the backend has not returned yet
    assert [(r.id, r.seq, r.t) for r in w.pending()] == [(2, 2, 102.0), (3, 3, 103.0)]
    w.flush()
    assert [(r.id, r.iteration, r.site) for r in w.pending()] == [(2, 3, site), (3, 3, site)]
    w.returned(ids[2], _Work(completed=False))
    running.completed = True
    assert [r.id for r in w.pending()] == [3]
    w.flush()
    w.works[ids[2]].completed = True  # listed: the look found it running
    w.flush()
    assert w.pending() == [] and w.works == {} and w.completed == 4
    w.close()
    records = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    done = [r for r in records if r["kind"] == schema.DONE]
    assert [(d["upto"], d["pending"]) for d in done] == [(4, [2, 3]), (4, [3]), (4, [])]
    # The first issue time, then microseconds from it (format 9).
    assert done[0][schema.ISSUED] == [[1, 101.0, [0, 1_000_000, 2_000_000, 3_000_000]]]
    assert [(r["id"], r["state"]) for r in records if r["kind"] == schema.STATE] == \
        [(4, schema.FAILED)]


def test_the_issuing_thread_releases_the_last_work_once_it_completed(
        tmp_path, success_api: None) -> None:
    """write_at releases the Work of the collective written before it when that completed
    without error (a synchronous collective's always has): nothing is kept of it, and the look
    counts it completed. One still running, or failed, goes to ``works`` for the look, which
    records the failure."""
    w = writer.TraceWriter(str(tmp_path / "rank-0.jsonl"), schema.header(0, "r", 0), 0,
                           interval=3600, thread=False)
    site = w.site("0", "all_reduce", "user", "all_reduce", (((4,), "torch.float32"),), "SUM",
                  None, None, ())
    first = w.write_at(site, 1, None, None, 0, 101.0)
    w.returned(first, _Work())
    second = w.write_at(site, 2, None, None, 0, 102.0)
    assert first not in w.works  # completed: nothing kept
    running = _Work(completed=False)
    w.returned(second, running)
    third = w.write_at(site, 3, None, None, 0, 103.0)
    assert w.works[second] is running
    failing = _Work(error=RuntimeError("peer closed"))
    w.returned(third, failing)
    w.write_at(site, 4, None, None, 0, 104.0)  # its backend has not returned yet
    assert w.works[third] is failing
    assert [r.id for r in w.pending()] == [second, 4]
    w.look()
    assert w.completed == 2 and [r.id for r in w.pending()] == [second, 4]
    w.close()
    records = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert [(r["id"], r["state"]) for r in records if r["kind"] == schema.STATE] == \
        [(third, schema.FAILED)]


def test_without_a_quiet_is_success_every_work_is_left_to_the_look(tmp_path) -> None:
    saved = writer._is_success_quiet
    writer.use_is_success(False)
    try:
        w = writer.TraceWriter(str(tmp_path / "rank-0.jsonl"), schema.header(0, "r", 0), 0,
                               interval=3600, thread=False)
        site = w.site("0", "barrier", "user", "barrier", (), None, None, None, ())
        first = w.write_at(site, 1, None, None, 0, 101.0)
        done = _Work()
        w.returned(first, done)
        w.write_at(site, 2, None, None, 0, 102.0)
        assert w.works[first] is done and done.futures == 0
        w.look()
        assert w.completed == 1 and first not in w.works
        w.close()
    finally:
        writer.use_is_success(saved)


def test_another_threads_collective_runs_until_its_work_returns_and_completes(
        tmp_path, success_api: None) -> None:
    """Only the hot thread's last collective is kept apart: one a second thread issues is
    ISSUING in ``works`` until its Work comes back, and pending until that completes, while
    the hot thread's own go on; what ends without a Work telling (DDP's callback, a coalesced
    broadcast) is settled by set_states, which keeps nothing for one already released."""
    import threading

    w = writer.TraceWriter(str(tmp_path / "rank-0.jsonl"), schema.header(0, "r", 0), 0,
                           interval=3600, thread=False)
    site = w.site("0", "all_reduce", "user", "all_reduce", (((4,), "torch.float32"),), "SUM",
                  None, None, ())
    first = w.write_at(site, 1, None, None, 0, 101.0)  # this thread becomes the hot one
    w.returned(first, _Work())
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(w.write_at(site, 2, None, None, 0,
                                                                       102.0)))
    thread.start()
    thread.join()
    assert w.works == {other[0]: writer.ISSUING}
    third = w.write_at(site, 3, None, None, 0, 103.0)
    running = _Work(completed=False)
    w.returned(third, running)
    assert [r.id for r in w.pending()] == [other[0], third]
    w.look()
    w.returned(other[0], _Work(completed=False))
    assert [r.id for r in w.pending()] == [other[0], third]
    w.works[other[0]].completed = running.completed = True
    w.look()
    assert w.pending() == [] and w.works == {} and w.completed == 3
    fourth = w.write_at(site, 4, None, None, 0, 104.0)
    w.write_at(site, 5, None, None, 0, 105.0)  # releases the fourth: ISSUING, kept
    w.set_states([fourth, first], schema.COMPLETED)  # first: long settled, nothing kept
    assert w.works == {fourth: schema.COMPLETED}
    w.set_states([5], schema.FAILED)  # the hot thread's last
    w.look()
    assert w.works == {} and w.completed == 5
    w.close()
    records = [json.loads(line) for line in (tmp_path / "rank-0.jsonl").read_text().splitlines()]
    assert [(r["id"], r["state"]) for r in records if r["kind"] == schema.STATE] == \
        [(5, schema.FAILED)]
