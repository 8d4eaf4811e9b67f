"""Labels of collectives that C++ issues with no Python frame above them (DDP's Reducer on the
autograd engine's device thread when gradients live on a GPU)."""

from __future__ import annotations

import os
import sys
import threading

from ddpdoctor.runtime.labels import StackLabeler
from ddpdoctor.trace.ddp_sites import BUCKET


def test_no_caller_frame_on_a_side_thread_takes_the_main_threads_site() -> None:
    # the standard library plays torch's part: the frames of Event.wait() are not user code
    labeler = StackLabeler(internal_dirs=[os.path.dirname(threading.__file__)])
    seen: list[tuple] = []
    released = threading.Event()

    def reducer_thread() -> None:
        seen.append(labeler.describe(None))
        released.set()

    def training_step() -> None:  # the main thread, blocked as in loss.backward()
        worker = threading.Thread(target=reducer_thread)
        worker.start()
        released.wait(10)
        worker.join(10)

    training_step()
    label, api, stack = seen[0]
    assert label == BUCKET and api is None
    # innermost user frame first: the main thread waiting in training_step()
    assert stack[0][0] == __file__ and stack[0][2] == "training_step"


def test_no_caller_frame_on_the_main_thread_is_a_bucket_without_a_site() -> None:
    assert StackLabeler(internal_dirs=[]).describe(None) == (BUCKET, None, ())


def test_stacks_are_cached_by_instruction_and_keep_their_own_lines() -> None:
    # The stack cache is keyed by where each frame is (code object, instruction), so that
    # f_lineno is computed once per place: the same place gives the same tuple, another
    # line of the same function its own line number.
    labeler = StackLabeler(internal_dirs=[])
    source = "\n".join(f"x{i} = {i}" for i in range(500)) + (
        "\nfor _ in range(2):\n    first = describe(frame())\nsecond = describe(frame())\n")
    scope = {"describe": labeler.describe, "frame": lambda: sys._getframe(1)}
    exec(compile(source, "/job/train.py", "exec"), scope)
    first, second = scope["first"], scope["second"]
    assert first[2][0] == ("/job/train.py", 502, "<module>")
    assert second[2][0] == ("/job/train.py", 503, "<module>")
    again = labeler.describe(sys._getframe())
    assert again[2][0][1] + 1 == labeler.describe(sys._getframe())[2][0][1]  # the next line
    loop = [labeler.describe(sys._getframe())[2] for _ in range(3)]
    assert loop[0] is loop[1] is loop[2]  # one place, one cached tuple


def test_one_user_line_reached_through_different_torch_functions_keeps_each_label() -> None:
    # Labels are cached by the places of the internal frames *and* of the user's frames: the
    # same user instruction that calls all_reduce, then broadcast, is labelled for each.
    torch_dir = "/site-packages/torch"
    labeler = StackLabeler(internal_dirs=[torch_dir])
    api_source = ("def all_reduce():\n    return describe(frame())\n"
                  "def broadcast():\n    return describe(frame())\n")
    scope = {"describe": labeler.describe, "frame": lambda: sys._getframe(1)}
    exec(compile(api_source, f"{torch_dir}/distributed/distributed_c10d.py", "exec"), scope)
    user_source = "seen = [fn() for fn in (all_reduce, broadcast, all_reduce)]\n"
    exec(compile(user_source, "/job/train.py", "exec"), scope)
    apis = [api for _, api, _ in scope["seen"]]
    assert apis == ["all_reduce", "broadcast", "all_reduce"]
    stacks = [stack for _, _, stack in scope["seen"]]
    assert stacks[0][0][0] == "/job/train.py" and stacks[0] == stacks[1] == stacks[2]


def test_a_collective_a_library_issued_for_the_users_call_is_named_in_its_words() -> None:
    """Accelerate's gather, thirty frames below the user's line in Lightning's loops or six in
    Accelerate's: what the user called is named, not the c10d function it reached."""
    from ddpdoctor.analysis.terms import describe
    from ddpdoctor.trace.model import Collective, Site

    lib = "/venv/lib/python3.11/site-packages"
    accelerate = Collective(rank=0, id=1, group="0", seq=1, op="all_gather", api="all_gather",
                            stack=[Site(f"{lib}/accelerate/utils/operations.py", 351,
                                        "_gpu_gather_one"),
                                   Site(f"{lib}/accelerate/accelerator.py", 2610,
                                        "gather_for_metrics"),
                                   Site("/job/train.py", 88, "evaluate")])
    assert describe(accelerate) == "Accelerate: gather_for_metrics() (its all_gather)"
    own = Collective(rank=0, id=2, group="0", seq=2, op="all_reduce", api="all_reduce",
                     stack=[Site("/job/train.py", 40, "training_step"),
                            Site(f"{lib}/pytorch_lightning/loops/loop.py", 9, "run")])
    assert describe(own) == "user all_reduce()"
