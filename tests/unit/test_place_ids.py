"""The numbers the recorder keys call sites by (``StackLabeler.place_id``): one per call path,
the same as :meth:`StackLabeler.places` tells apart, found again without building the key."""

from __future__ import annotations

import sys
import threading

import pytest

from ddpdoctor.runtime import labels
from ddpdoctor.runtime.labels import StackLabeler

TORCH_DIR = "/site-packages/torch"
API = "def all_reduce():\n    return probe(frame())\n"


def _world(labeler: StackLabeler, user_source: str) -> dict:
    """``user_source`` run as /job/train.py, calling an ``all_reduce`` that lives in torch's
    folder and hands its own frame to ``probe`` (``ids`` and ``keys`` collect what the
    labeler says of it)."""
    ids: list[int] = []
    keys: list[tuple] = []

    def probe(frame) -> None:  # type: ignore[no-untyped-def]
        ids.append(labeler.place_id(frame))
        keys.append(labeler.places(frame)[0])

    scope: dict = {"probe": probe, "frame": lambda: sys._getframe(1), "ids": ids, "keys": keys}
    exec(compile(API, f"{TORCH_DIR}/distributed/distributed_c10d.py", "exec"), scope)
    exec(compile(user_source, "/job/train.py", "exec"), scope)
    return scope


def _one_id_per_key(ids: list[int], keys: list[tuple]) -> None:
    by_key: dict[tuple, set[int]] = {}
    for i, key in zip(ids, keys):
        by_key.setdefault(key, set()).add(i)
    assert all(len(found) == 1 for found in by_key.values()), by_key
    assert len({i for found in by_key.values() for i in found}) == len(by_key)


def test_a_call_path_has_one_number_and_another_path_another() -> None:
    labeler = StackLabeler(internal_dirs=[TORCH_DIR])
    scope = _world(labeler, (
        "def step():\n    all_reduce()\n"
        "def evaluate():\n    all_reduce()\n    all_reduce()\n"
        "def epoch():\n    step()\n    step()\n"
        "for _ in range(3):\n    epoch()\n    evaluate()\n    step()\n"))
    ids, keys = scope["ids"], scope["keys"]
    # per round: step from epoch's two lines, evaluate's two lines, step from the loop
    assert len(set(ids)) == 5 and ids[:5] == ids[5:10] == ids[10:]
    _one_id_per_key(ids, keys)


def test_the_same_offset_in_two_functions_is_two_places() -> None:
    # Two functions of identical bytecode call at the same instruction offset: the tree
    # tells them apart by their code objects.
    labeler = StackLabeler(internal_dirs=[TORCH_DIR])
    scope = _world(labeler, (
        "def a():\n    all_reduce()\ndef b():\n    all_reduce()\n"
        "def loop():\n    for _ in range(3):\n        a()\n        b()\nloop()\n"))
    ids, keys = scope["ids"], scope["keys"]
    assert ids[0] != ids[1] and ids[0::2] == [ids[0]] * 3 and ids[1::2] == [ids[1]] * 3
    _one_id_per_key(ids, keys)


def test_a_shallow_stack_that_ends_before_the_depth_is_found_again() -> None:
    # On a thread of its own the call path ends (no frame beyond) before STACK_DEPTH.
    labeler = StackLabeler(internal_dirs=[TORCH_DIR])
    scope = _world(labeler, "def work():\n    for _ in range(3):\n        all_reduce()\n")
    worker = threading.Thread(target=scope["work"])
    worker.start()
    worker.join(10)
    ids, keys = scope["ids"], scope["keys"]
    assert len(keys[0]) // 2 < 1 + labels.STACK_DEPTH  # the walk reached the top
    assert ids == [ids[0]] * 3
    _one_id_per_key(ids, keys)


def test_numbers_are_never_given_again_when_the_tree_is_cleared(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A program that never repeats a call path: the tree is emptied when full; a path seen
    # again gets a new number, and no number ever names two paths.
    monkeypatch.setattr(labels, "MAX_PLACES", 12)
    labeler = StackLabeler(internal_dirs=[TORCH_DIR])
    source = "".join(f"def f{i}():\n    all_reduce()\n" for i in range(6)) + (
        "for _ in range(2):\n" + "".join(f"    f{i}()\n" for i in range(6)))
    scope = _world(labeler, source)
    ids, keys = scope["ids"], scope["keys"]
    assert labeler._tree_size <= 12
    named: dict[int, tuple] = {}
    for i, key in zip(ids, keys):
        assert named.setdefault(i, key) == key  # a number never names two paths
    assert len(set(ids)) > len(set(keys))  # cleared: some paths were numbered again



def test_a_thread_syncing_nothing_for_a_framework_reads_none() -> None:
    """on_behalf.current() runs for every collective; its per-thread default is a class
    attribute (no exception raised inside getattr): every thread starts with None, and one
    thread's mark is not another's."""
    from ddpdoctor.runtime import on_behalf

    seen: list[object] = []
    assert on_behalf.current() is None and not on_behalf.marked_threads
    with on_behalf.syncing(("lightning.epoch_sync", "val_loss", ())):
        worker = threading.Thread(target=lambda: seen.append(on_behalf.current()))
        worker.start()
        worker.join(10)
        assert on_behalf.current() == ("lightning.epoch_sync", "val_loss", ())
    assert seen == [None] and on_behalf.current() is None and not on_behalf.marked_threads
