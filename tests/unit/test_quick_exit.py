"""torchrun's agent, as ``ddpdoctor run`` starts it on one node, ends as Python's exit would end
it (threads joined, ``atexit`` run, output flushed, the same status) without the interpreter's
teardown; an exception out of torchrun's ``main`` takes Python's usual path. torchrun's
``main`` is a stand-in here (``sys.modules``), so no torch is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpdoctor.launch.command import build_command
from ddpdoctor.launch.options import RunOptions
from ddpdoctor.runtime.torch_internals import TORCHRUN_ENTRY, TORCHRUN_ENTRY_QUICK_EXIT

# A module-level object whose finalizer prints: Python's teardown runs it, os._exit does not.
_STAGE = """
import atexit, sys, threading, time, types

class Teardown:
    def __del__(self):
        sys.stdout.write("teardown ran\\n")
        sys.stdout.flush()

kept = Teardown()
atexit.register(lambda: print("atexit ran"))

def late():
    time.sleep(0.3)
    print("thread finished")

def main():
    threading.Thread(target=late).start()
    print("main ran")  # buffered: stdout is a pipe
    return MAIN_RESULT

torchrun = types.ModuleType("torch.distributed.run")
torchrun.main = main
sys.modules["torch.distributed.run"] = torchrun
"""


def _agent(entry: str, body: str, block_ddpdoctor: bool = False) -> subprocess.CompletedProcess:
    prelude = "import sys\nsys.modules['ddpdoctor.runtime.quick_exit'] = None\n" \
        if block_ddpdoctor else ""
    code = prelude + _STAGE.replace("return MAIN_RESULT", body) + f"\nexec({entry!r})\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


def test_plain_entry_tears_the_interpreter_down() -> None:
    """The control: the stage's finalizer does run at a usual exit."""
    out = _agent(TORCHRUN_ENTRY, "return None")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["main ran", "thread finished", "atexit ran",
                                       "teardown ran"]


@pytest.mark.parametrize(("body", "status"), [
    ("return None", 0), ("return 3", 3), ("raise SystemExit(0)", 0), ("raise SystemExit(4)", 4),
])
def test_quick_entry_exits_as_python_would_without_teardown(body: str, status: int) -> None:
    out = _agent(TORCHRUN_ENTRY_QUICK_EXIT, body)
    assert out.returncode == status, out.stderr
    assert out.stdout.splitlines() == ["main ran", "thread finished", "atexit ran"]


def test_quick_entry_prints_an_exit_message() -> None:
    out = _agent(TORCHRUN_ENTRY_QUICK_EXIT, "raise SystemExit('torchrun: bad rendezvous')")
    assert out.returncode == 1
    assert out.stderr.strip() == "torchrun: bad rendezvous"
    assert "teardown ran" not in out.stdout


def test_an_exception_takes_pythons_usual_path() -> None:
    """A worker failed (torchrun's ChildFailedError): traceback, status 1, full teardown."""
    out = _agent(TORCHRUN_ENTRY_QUICK_EXIT, "raise RuntimeError('worker 1 failed')")
    assert out.returncode == 1
    assert "RuntimeError: worker 1 failed" in out.stderr and "Traceback" in out.stderr
    assert out.stdout.splitlines()[-2:] == ["atexit ran", "teardown ran"]


def test_without_ddpdoctor_importable_the_entry_exits_as_usual() -> None:
    out = _agent(TORCHRUN_ENTRY_QUICK_EXIT, "return 5", block_ddpdoctor=True)
    assert out.returncode == 5, out.stderr
    assert out.stdout.splitlines()[-1] == "teardown ran"


@pytest.mark.parametrize(("nnodes", "quick"), [(None, True), ("1", True), ("2", False),
                                               ("1:4", False)])
def test_only_a_single_node_agent_skips_its_teardown(nnodes: str | None, quick: bool) -> None:
    """On several nodes one agent hosts the rendezvous store its peers may still use."""
    torchrun_args = ["--nnodes", nnodes, "--rdzv-endpoint", "localhost:29400"] if nnodes else []
    opts = RunOptions(script="train.py", torchrun_args=torchrun_args)
    entry = build_command(opts)[2]
    assert entry == (TORCHRUN_ENTRY_QUICK_EXIT if quick else TORCHRUN_ENTRY)
