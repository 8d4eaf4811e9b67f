"""What a rank prints of an exception: ddpdoctor's frames left out, a lost-peer error folded to
one line with its traceback in the log folder; and what the live view names as the library
call a rank is in (a ddpdoctor wrapper named by what it wraps)."""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path

import pytest

from ddpdoctor.runtime import user_code, user_traceback
from ddpdoctor.runtime.watchdog import Watchdog
from ddpdoctor.trace import schema

# A function compiled as if it were a file of ddpdoctor's: a wrapper between the user's code
# and what it calls, as runtime/pg_wrapper.py is between the user and gloo.
_WRAPPER = os.path.join(user_code.OWN[0], "runtime", "fake_wrapper.py")
_namespace: dict = {}
exec(compile("def wrapper(f):\n    return f()\n", _WRAPPER, "exec"), _namespace)


def _raise_through_wrapper(exc: BaseException) -> BaseException:
    def inner() -> None:
        raise exc

    try:
        _namespace["wrapper"](inner)
    except BaseException as caught:  # noqa: BLE001 - the exception under test
        return caught
    raise AssertionError("not raised")


def test_ddpdoctors_frames_are_left_out_of_the_traceback_and_its_causes() -> None:
    try:
        try:
            _namespace["wrapper"](lambda: 1 / 0)
        except ZeroDivisionError as first:
            raise RuntimeError("while handling") from first
    except RuntimeError as exc:
        error = exc
    before = "".join(traceback.format_exception(error))
    assert before.count(_WRAPPER) == 1  # the check below can fail
    user_traceback.clean(error)
    after = "".join(traceback.format_exception(error))
    assert _WRAPPER not in after
    assert "1 / 0" in after and "ZeroDivisionError" in after and "while handling" in after
    assert after.count(__file__) == before.count(__file__)  # the user's frames all stay


def test_a_lost_peer_is_one_line_and_its_traceback_goes_to_the_log_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exc = _raise_through_wrapper(RuntimeError(
        "[/__w/pytorch/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:37510. This is typically caused by a remote worker crashing."))
    assert user_traceback.lost_peer(exc)
    user_traceback.clean(exc)
    assert user_traceback.fold(exc, str(tmp_path), 3)
    line = capsys.readouterr().err
    assert line.count("\n") == 1
    assert line.startswith("ddpdoctor: rank 3 ended on RuntimeError: Connection closed by "
                           "peer [127.0.0.1]:37510 at test_user_traceback.py:")
    saved = (tmp_path / schema.traceback_file(3)).read_text()
    assert "Traceback (most recent call last)" in saved and "pair.cc:553" in saved
    assert _WRAPPER not in saved
    assert oct((tmp_path / schema.traceback_file(3)).stat().st_mode & 0o777) == "0o600"


def test_an_error_of_the_users_own_is_no_lost_peer() -> None:
    assert not user_traceback.lost_peer(ValueError("non-finite gradient"))
    assert not user_traceback.lost_peer(RuntimeError("shape mismatch: [4] vs [5]"))


def test_an_unwritable_folder_prints_the_traceback_whole(tmp_path: Path) -> None:
    exc = _raise_through_wrapper(RuntimeError("Connection reset by peer"))
    assert not user_traceback.fold(exc, str(tmp_path / "missing"), 0)


def test_the_library_call_of_a_rank_is_named_by_what_a_wrapper_wraps() -> None:
    seen: list[str | None] = []

    def torch_like() -> None:  # stands for the wrapped library function
        seen.append(Watchdog.library_call(sys._getframe()))

    torch_like.__code__ = torch_like.__code__.replace(
        co_filename=os.path.join(sysconfig.get_paths()["stdlib"], "queue.py"))
    _namespace["wrapper"](torch_like)  # the user's line calls ddpdoctor's wrapper
    assert seen == ["queue.torch_like()"]


def test_an_mp_spawn_workers_traceback_text_loses_ddpdoctors_frames_too() -> None:
    """mp.spawn's parent raises ProcessRaisedException with the worker's traceback as text."""
    own = os.path.join(user_code.OWN[0], "runtime", "torch_hooks.py")
    text = ("\n\n-- Process 1 terminated with the following error:\n"
            "Traceback (most recent call last):\n"
            '  File "/venv/torch/multiprocessing/spawn.py", line 90, in _wrap\n'
            "    fn(i, *args)\n"
            f'  File "{own}", line 478, in recorded\n'
            "    return fn(*a)\n"
            "           ^^^^^^\n"
            '  File "/home/me/train.py", line 12, in worker\n'
            "    raise ValueError('bad batch')\n"
            "ValueError: bad batch\n")

    class ProcessRaisedException(Exception):  # torch's shape: message, index, pid
        def __init__(self, msg: str, index: int, pid: int) -> None:
            super().__init__(msg)
            self.msg = msg

    exc = ProcessRaisedException(text, 1, 42)
    user_traceback.clean(exc)
    assert own not in str(exc) and own not in exc.msg
    assert "return fn(*a)" not in str(exc) and "^^^^^^" not in str(exc)
    assert 'File "/home/me/train.py", line 12, in worker' in str(exc)
    assert "spawn.py" in str(exc) and str(exc).endswith("ValueError: bad batch\n")
