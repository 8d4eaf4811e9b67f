"""Labels of collectives that C++ issues with no Python frame above them (DDP's Reducer on the
autograd engine's device thread when gradients live on a GPU)."""

from __future__ import annotations

import os
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
