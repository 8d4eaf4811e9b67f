"""A pass over a DataLoader under --epoch-steps (and --max-steps): how many batches it gives
and when it counts as an ended epoch, which decides the third epoch's stop and the report's
"before any epoch ended" note. The whole runs: tests/e2e/test_ci_smoke.py, test_launchers.py."""

from __future__ import annotations

import itertools

import pytest

from ddpdoctor.runtime import epoch_steps, max_steps


class _Iterator:
    """A loader's iterator: ``length`` batches, a length as DataLoader's iterators have."""

    def __init__(self, length: int) -> None:
        self._items = iter(range(length))
        self.length = length

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> int:
        return next(self._items)

    def __len__(self) -> int:
        return self.length


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(max_steps, "epoch_ends", 0)


def test_a_pass_gives_at_most_its_cap_and_says_so() -> None:
    loader = epoch_steps._Loader(0)
    one = epoch_steps._Pass(_Iterator(20), 3, 20, loader)
    assert len(one) == 3 and list(one) == [0, 1, 2]
    assert max_steps.epoch_ends == 1 and loader.ended == 1
    shorter = epoch_steps._Pass(_Iterator(2), 3, 2, loader)  # a loader shorter than the cap
    assert list(shorter) == [0, 1] and loader.ended == 2


def test_a_peek_at_one_batch_is_no_epoch_and_a_loop_stopping_at_len_is_one() -> None:
    loader = epoch_steps._Loader(0)
    peek = epoch_steps._Pass(_Iterator(20), 3, 20, loader)
    next(peek)  # next(iter(loader)) at an epoch's start, as pytorch/examples' trainers do
    assert loader.ended == 0 and max_steps.epoch_ends == 0
    by_len = epoch_steps._Pass(_Iterator(20), 3, 20, loader)
    assert list(itertools.islice(by_len, len(by_len))) == [0, 1, 2]  # never asks for more
    assert loader.ended == 1


def test_under_max_steps_alone_nothing_is_cut_and_a_whole_pass_is_an_epoch() -> None:
    loader = epoch_steps._Loader(1)
    whole = epoch_steps._Pass(_Iterator(5), None, 5, loader)
    assert len(whole) == 5 and list(itertools.islice(whole, 5)) == [0, 1, 2, 3, 4]
    assert max_steps.epoch_ends == 1  # Lightning stops at len(): still an ended epoch
    part = epoch_steps._Pass(_Iterator(5), None, 5, loader)
    assert list(itertools.islice(part, 2)) == [0, 1] and max_steps.epoch_ends == 1
