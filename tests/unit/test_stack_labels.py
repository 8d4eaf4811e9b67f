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
