"""DDP's coalesced broadcasts (buffers in every forward, parameters at construction) are
recorded per broadcast by the recording group's issuer and run on the backend directly:
the records are the ones torch's own C++ would have made through the group, the collective
still runs whatever the recorder does, and an error of the backend reaches the caller. On a
real gloo group of one process; the e2e test ``test_recorder.py`` checks two ranks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from ddpdoctor.runtime import torch_internals as internals
from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup, coalesced_chunks
from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace.reader import read_rank

FOUND = internals.broadcast_coalesced()
pytestmark = pytest.mark.skipif(FOUND is None, reason="this torch has no _broadcast_coalesced")
REAL, ASSIGN = FOUND if FOUND is not None else (None, None)


def _tensors() -> list[torch.Tensor]:
    """Three dtypes, 0-dim tensors (BatchNorm's count), one larger than any chunk."""
    return [torch.ones(5), torch.tensor(3), torch.full((2, 3), 2.0, dtype=torch.float64),
            torch.arange(40.0), torch.tensor(7), torch.zeros(3), torch.ones(4, dtype=torch.float64)]


def _group(tmp_path: Path, recorder: Recorder | None = None, backend: Any = None
           ) -> tuple[RecordingProcessGroup, Recorder]:
    tmp_path.mkdir(exist_ok=True)
    recorder = recorder or Recorder(str(tmp_path), "run")
    recorder.start(0, 1, "gloo")
    gloo = backend or dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=30))
    return RecordingProcessGroup(gloo, None, 0, 1, "0", recorder), recorder


def _through_issuer(pg: Any, tensors: list, size: int, src: int = 0, real: Any = None) -> None:
    """What torch_hooks' patch of ``torch.distributed._broadcast_coalesced`` does."""
    pg._issuer.broadcast_coalesced(real or REAL, pg, tensors, size, src, ASSIGN)


def _broadcast(call: Callable[..., None], pg: Any, tensors: list, size: int) -> None:
    call(pg, tensors, size, 0)  # one line: either way, the same call site is recorded


def _records(path: Path) -> list[tuple]:
    return [(c.seq, c.op, c.shapes, c.dtypes, c.root, c.label, c.state,
             (c.stack[0].file, c.stack[0].line, c.stack[0].function))
            for c in read_rank(path).collectives]


def _count_entries(pg: Any) -> list[str]:
    """The ops that enter the group's Python from C++ (its methods call ``_issue``)."""
    entered: list[str] = []
    issue = pg._issue

    def counted(op: str, *args: Any) -> Any:
        entered.append(op)
        return issue(op, *args)

    pg._issue = counted
    return entered


@pytest.mark.parametrize("size", [24, 64, 1 << 20])
def test_the_issuer_records_what_torchs_own_broadcasts_through_the_group_record(
        tmp_path: Path, size: int) -> None:
    old_pg, old = _group(tmp_path / "old")
    entered = _count_entries(old_pg)
    _broadcast(REAL, old_pg, _tensors(), size)  # torch's C++: each broadcast enters Python
    old.close()
    new_pg, new = _group(tmp_path / "new")
    skipped = _count_entries(new_pg)
    _broadcast(_through_issuer, new_pg, _tensors(), size)
    new.close()
    expected = _records(tmp_path / "old" / "rank-0.jsonl")
    assert len(expected) == len(entered) >= 3 and set(entered) == {"broadcast"}
    assert _records(tmp_path / "new" / "rank-0.jsonl") == expected
    assert skipped == []  # no broadcast entered the group's Python from C++
    chunks = coalesced_chunks(_tensors(), size, ASSIGN)
    assert chunks is not None and [[list(s), str(d).removeprefix("torch.")]
                                   for s, d in chunks] == [[r[2][0], r[3][0]] for r in expected]


def test_the_broadcasts_run_and_complete(tmp_path: Path) -> None:
    pg, recorder = _group(tmp_path)
    tensors = _tensors()
    before = [t.clone() for t in tensors]
    _through_issuer(pg, tensors, 24)
    assert pg._direct is not None  # they ran on the group holding gloo alone
    recorder.close()
    assert all(torch.equal(a, b) for a, b in zip(tensors, before))  # a world of one: as sent
    assert {c.state for c in read_rank(tmp_path / "rank-0.jsonl").collectives} == {"completed"}


def test_sparse_tensors_or_a_backend_other_than_gloo_go_through_the_group(
        tmp_path: Path) -> None:
    sparse = [torch.ones(2), torch.ones(2).to_sparse()]
    assert coalesced_chunks(sparse, 64, ASSIGN) is None
    calls: list[Any] = []

    def real(group: Any, *args: Any) -> None:
        calls.append(group)

    pg, recorder = _group(tmp_path)
    _through_issuer(pg, sparse, 24, real=real)
    stand_in, stand_in_recorder = _group(tmp_path / "stand-in", backend=object())  # not gloo
    _through_issuer(stand_in, _tensors(), 24, real=real)
    pg._enabled = False  # nothing to record: the group holding gloo alone runs it
    _through_issuer(pg, _tensors(), 24, real=real)
    assert calls == [pg, stand_in, pg._direct]
    recorder.close()
    stand_in_recorder.close()


class _BrokenRecorder(Recorder):
    def learn(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise RuntimeError("recorder bug")


def test_a_recorder_error_stops_recording_and_the_broadcasts_still_run(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pg, recorder = _group(tmp_path, _BrokenRecorder(str(tmp_path), "run"))
    ran: list[Any] = []
    _through_issuer(pg, _tensors(), 24, real=lambda group, *args: ran.append(group))
    assert ran == [pg._direct] and not pg._enabled
    assert "recorder bug" in capsys.readouterr().err
    recorder.close()
    assert read_rank(tmp_path / "rank-0.jsonl").cut


def test_a_backend_error_reaches_the_caller_and_every_broadcast_is_failed(
        tmp_path: Path) -> None:
    def real(*args: Any) -> None:
        raise RuntimeError("Connection closed by peer")

    pg, recorder = _group(tmp_path)
    with pytest.raises(RuntimeError, match="Connection closed"):
        _through_issuer(pg, _tensors(), 24, real=real)
    recorder.close()
    states = [c.state for c in read_rank(tmp_path / "rank-0.jsonl").collectives]
    assert len(states) >= 3 and set(states) == {"failed"}


def test_remembered_chunkings_follow_the_buffers() -> None:
    # The chunking is remembered by what decides it: a buffer resized, or of another dtype,
    # gives its own chunks, and the same again gives the same object (no chunking redone).
    from ddpdoctor.runtime.pg_wrapper import chunks_of

    tensors = _tensors()
    first = chunks_of(tensors, 64, ASSIGN)
    assert first == coalesced_chunks(tensors, 64, ASSIGN)
    assert chunks_of(_tensors(), 64, ASSIGN) is first
    tensors[3].resize_(60)  # in place: the same tensor, more elements
    assert chunks_of(tensors, 64, ASSIGN) == coalesced_chunks(tensors, 64, ASSIGN) != first
    tensors[0] = torch.ones(5, dtype=torch.float64)
    assert chunks_of(tensors, 64, ASSIGN) == coalesced_chunks(tensors, 64, ASSIGN)
    assert chunks_of(tensors, 128, ASSIGN) == coalesced_chunks(tensors, 128, ASSIGN)
