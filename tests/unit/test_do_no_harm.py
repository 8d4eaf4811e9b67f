"""The recorder never breaks the user's collective, and nothing read is unpickled or evaluated."""

from __future__ import annotations

import ast
import gc
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddpdoctor.runtime.pg_wrapper import RecordingProcessGroup
from ddpdoctor.runtime.recorder import Recorder
from ddpdoctor.trace.reader import read_rank

SRC = Path(__file__).resolve().parents[2] / "src" / "ddpdoctor"


class _Backend:
    def __init__(self) -> None:
        self.calls = 0

    def allreduce(self, *args: object) -> str:
        self.calls += 1
        return "work"


class _BrokenRecorder(Recorder):
    def learn(self, *args: object, **kwargs: object) -> None:  # type: ignore[override]
        raise RuntimeError("recorder bug")


def test_a_recorder_error_disables_recording_and_the_collective_still_runs(
        tmp_path: Path, capsys) -> None:
    recorder = _BrokenRecorder(str(tmp_path), "run")
    recorder.start(0, 1, "gloo")
    backend = _Backend()
    pg = RecordingProcessGroup(backend, None, 0, 1, "0", recorder)
    opts = dist.AllreduceOptions()
    assert pg.allreduce([torch.ones(2)], opts) == "work"
    assert pg.allreduce([torch.ones(2)], opts) == "work"
    assert backend.calls == 2
    err = capsys.readouterr().err
    assert err.count("recording stopped") == 1 and "recorder bug" in err
    recorder.close()
    trace = read_rank(tmp_path / "rank-0.jsonl")  # what follows is missing: a cut trace
    assert trace.cut and "recorder bug" in trace.lost


def test_a_backend_error_reaches_the_user_and_is_recorded_as_failed(tmp_path: Path) -> None:
    class Failing(_Backend):
        def allreduce(self, *args: object) -> str:
            raise RuntimeError("Connection closed by peer")

    recorder = Recorder(str(tmp_path), "run")
    recorder.start(0, 1, "gloo")
    pg = RecordingProcessGroup(Failing(), None, 0, 1, "0", recorder)
    try:
        pg.allreduce([torch.ones(2)], dist.AllreduceOptions())
    except RuntimeError as exc:
        assert "Connection closed" in str(exc)
    else:
        raise AssertionError("the backend's error was swallowed")
    recorder.close()
    text = (tmp_path / "rank-0.jsonl").read_text()
    assert '"state": "failed"' in text


class _Running:
    """A Work that never completes: every recorded collective stays pending."""

    def is_completed(self) -> bool:
        return False


def test_a_pending_collective_keeps_no_tracked_object_alive(tmp_path: Path) -> None:
    # Records live until the writer thread sees them complete, long enough to reach the
    # interpreter's oldest generation; objects surviving there trigger full collections of
    # the user's whole process (tens of ms each once torch is imported). Before the records
    # shared the writer's cached stack and tensors, each kept a dozen objects alive; until
    # they became dict entries and tuples of numbers, one.
    class Backend(_Backend):
        work = _Running()

        def allreduce(self, *args: object) -> _Running:
            return self.work

    recorder = Recorder(str(tmp_path), "run")
    recorder.start(0, 1, "gloo")
    pg = RecordingProcessGroup(Backend(), None, 0, 1, "0", recorder)
    tensors, opts = [torch.ones(2)], dist.AllreduceOptions()
    pg.allreduce(tensors, opts)  # the first call fills the writer's caches
    assert recorder.writer is not None
    writer = recorder.writer

    def kept_per_call() -> float:
        # A collection untracks a tuple whose items are untracked; a tuple of tuples may need a
        # second one (whether the inner tuples were looked at first depends on the list order).
        gc.collect()
        gc.collect()
        before = len(gc.get_objects())
        for _ in range(1000):
            pg.allreduce(tensors, opts)
        # The writer thread keeps the fields of collectives still running once it has looked at
        # them: look now, so that what it makes then is counted too.
        writer.flush()
        gc.collect()
        gc.collect()
        return (len(gc.get_objects()) - before) / 1000

    # The recorder's own threads (the progress and stack samplers) hold a few objects of their
    # own at any moment, and a first round fills caches of the interpreter's and torch's: the
    # least of three rounds is what each collective keeps.
    kept = min(kept_per_call() for _ in range(3))
    assert len(writer.pending()) == 3001
    recorder.close()
    assert kept <= 0.05, f"{kept:.2f} tracked objects kept alive per pending collective"


def test_no_module_unpickles_or_evaluates() -> None:
    # One exception: the flight-recorder reader, whose unpickler refuses every global
    # (tests/unit/test_flight_recorder.py shows a crafted dump refused).
    # And the dump the watchdog asks torch for (torch_internals.flight_recorder_dump), which
    # decodes the bytes torch's flight recorder hands it in the same process (never a file),
    # to add the source of each frame before they are written as JSON.
    allowed = {SRC / "trace" / "flight_recorder.py": {"pickle"},
               SRC / "runtime" / "torch_internals" / "c10d.py": {"pickle"}}
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                assert not any(n.split(".")[0] in ("pickle", "marshal", "shelve")
                               and n not in allowed.get(path, ()) for n in names), path
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("eval", "exec"), path


def test_a_collective_called_with_no_python_frame_above_is_recorded(tmp_path: Path) -> None:
    # DDP's Reducer calls allreduce from the autograd engine's CUDA device thread, where no
    # Python frame is above the recording group's method. A thread started from C with the
    # method itself as its function is in the same place.
    import _thread
    import threading

    recorder = Recorder(str(tmp_path), "run")
    recorder.start(0, 1, "gloo")
    backend = _Backend()
    pg = RecordingProcessGroup(backend, None, 0, 1, "0", recorder)
    done = threading.Event()

    def on_thread() -> None:
        try:
            pg.allreduce([torch.ones(2)], dist.AllreduceOptions())
        finally:
            done.set()

    _thread.start_new_thread(pg.allreduce, ([torch.ones(2)], dist.AllreduceOptions()))
    _thread.start_new_thread(on_thread, ())
    assert done.wait(10)
    deadline = 100
    while backend.calls < 2 and deadline:
        deadline -= 1
        threading.Event().wait(0.05)
    assert backend.calls == 2 and pg._enabled  # recording was not switched off
    recorder.close()
    trace = read_rank(tmp_path / "rank-0.jsonl")
    assert len(trace.collectives) == 2 and not trace.cut


_IMPORT_DURING_SHARING = """
import os, sys
os.environ.update({"DDPDOCTOR_LOGDIR": sys.argv[1], "RANK": "2", "LOCAL_RANK": "0",
                   "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "race"})
import threading
from ddpdoctor.runtime import bootstrap
bootstrap.boot()
import pytest
import torch
import torch.distributed
print("imported", torch.__version__)
print("threads", sorted(t.name for t in threading.enumerate()))
"""


def test_a_multi_node_rank_imports_torch_with_no_thread_of_ours_touching_the_store(
        tmp_path: Path) -> None:
    """A rank of a multi-node job (2 nodes x 2 ranks) imports torch at boot while ddpdoctor's
    watchdog runs. A thread of ours that imported torch.distributed meanwhile (the per-rank
    peers thread did, for the store) failed the main thread's import with "'torch._C' is not
    a package"; the nodes now talk through their launchers, and no thread of a rank
    imports torch or touches the store."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _IMPORT_DURING_SHARING, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "imported" in proc.stdout, proc.stderr[-2000:]
    assert "Error" not in proc.stderr, proc.stderr[-2000:]
    threads = proc.stdout.split("threads", 1)[1]
    assert "ddpdoctor-peers" not in threads, threads


def test_an_exception_deep_in_torch_keeps_the_users_frame() -> None:
    from ddpdoctor.runtime.recorder import MAX_FRAMES, kept_frames

    torch_dir = str(Path(torch.__file__).parent)
    user = {"file": "/home/me/train.py", "line": 12, "function": "<module>", "text": ""}
    deep = [{"file": f"{torch_dir}/_dynamo/f{i}.py", "line": i, "function": "f", "text": ""}
            for i in range(40)]
    kept = kept_frames([user, *deep])
    assert kept[0] == user and kept[1:] == deep[-MAX_FRAMES:]
    assert kept_frames(deep[:5]) == deep[:5]


def test_the_flight_recorder_is_switched_off_only_where_it_would_repeat_ddpdoctors_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.runtime import env
    from ddpdoctor.runtime.torch_hooks import flight_recorder_redundant as redundant

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert redundant("gloo", {})
    assert not redundant("nccl", {}), "NCCL groups ddpdoctor wraps keep their CUDA states"
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        assert not redundant("gloo", {name: "2000"}), "the user sized it"
        assert not redundant("gloo", {name: "0"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not redundant("gloo", {}), "a GPU host may make NCCL groups later"
    assert redundant("gloo", {env.CPU: "1"}), "CPU mode makes every NCCL group a gloo one"


def test_an_nccl_group_beside_recorded_gloo_ones_has_its_flight_recorder_dumped_on_a_hang(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from ddpdoctor.runtime import pg_wrapper, torch_hooks
    from ddpdoctor.runtime import torch_internals as internals

    class Recording:  # stands for the job's recording default group, around gloo
        def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
            return "gloo"

    recorder = SimpleNamespace(flight_recorder=False)
    monkeypatch.setattr(torch_hooks, "_recorder", recorder)
    monkeypatch.setattr(pg_wrapper, "RecordingProcessGroup", Recording)
    monkeypatch.setattr(internals, "default_group", Recording)
    monkeypatch.setattr(torch_hooks, "_inner_kind", "gloo")
    made: list[object] = []
    new_group = torch_hooks._wrap_new_group(lambda *a, **k: made.append(k.get("backend")))
    new_group([0, 1], backend="gloo")
    assert made == [torch_hooks.PLUGIN] and not recorder.flight_recorder
    new_group([0, 1], backend="nccl")
    assert made[-1] == "nccl" and recorder.flight_recorder
    new_group([0, 1])  # the default group's backend: recorded gloo, not the NCCL just made
    assert made[-1] == torch_hooks.PLUGIN and torch_hooks._inner_kind == "gloo"
