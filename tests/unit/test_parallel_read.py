"""Large runs are read by worker processes: same traces, same diagnosis, no process left."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.json_report import to_dict
from ddpdoctor.trace import parallel
from ddpdoctor.trace.model import Run
from ddpdoctor.trace.reader import load_run

BENCH = Path(__file__).resolve().parents[2] / "bench"
RANKS = 20

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="worker processes are forked on Linux only")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    spec = importlib.util.spec_from_file_location("ddpdoctor_bench_synth_p", BENCH / "synth.py")
    assert spec is not None and spec.loader is not None
    synth = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = synth  # dataclasses look their module up
    spec.loader.exec_module(synth)
    folder = tmp_path_factory.mktemp("synth") / "logs"
    return folder, synth.generate(folder, RANKS, 1200, diverge_rank=13)


@pytest.fixture(autouse=True)
def _no_threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    # Earlier tests of the session leave daemon threads (trace writers) behind; they take no
    # part here, and only the test of the thread rule itself must see them.
    if "thread" not in request.node.name:
        monkeypatch.setattr(parallel, "_threads_running", lambda: False)


def _load(folder: Path, workers: bool, monkeypatch: pytest.MonkeyPatch) -> Run:
    with monkeypatch.context() as m:
        m.setattr(parallel, "MIN_BYTES", 0 if workers else 1 << 60)
        m.setattr(parallel, "FILES_PER_TASK", 3)  # several tasks per worker, a short last one
        return load_run([folder])


def _view(run: Run) -> dict:
    return {r: ({f.name: getattr(t, f.name) for f in dataclasses.fields(t)
                 if f.name != "collectives"},
                [dataclasses.asdict(c) for c in t.collectives])
            for r, t in run.ranks.items()}


def test_workers_read_what_one_process_reads(synthetic: tuple[Path, dict],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    folder, info = synthetic
    files = sorted(folder.glob("rank-*.jsonl"))
    with monkeypatch.context() as m:
        m.setattr(parallel, "MIN_BYTES", 0)
        assert parallel.workers_for(files) >= 2 or len(os.sched_getaffinity(0)) < 2
    one = _load(folder, False, monkeypatch)
    many = _load(folder, True, monkeypatch)
    assert list(many.ranks) == list(one.ranks) and sorted(many.ranks) == list(range(RANKS))
    assert _view(many) == _view(one)
    assert many.notes == one.notes and many.sources == one.sources
    report = diagnose(many)
    assert json.dumps(to_dict(report), default=str) == \
        json.dumps(to_dict(diagnose(one)), default=str)
    root = report.findings[0]
    assert root.seq == info["diverge_seq"] and 13 in root.ranks
    assert multiprocessing.active_children() == []


def test_a_bad_file_read_by_a_worker_is_reported_as_ever(synthetic: tuple[Path, dict],
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    folder, _ = synthetic
    bad = tmp_path / "logs"
    bad.mkdir()
    for path in folder.glob("rank-*.jsonl"):
        os.link(path, bad / path.name)  # (a link out of the folder would not be followed)
    (bad / "rank-99.jsonl").write_text("not json at all\n")
    run = _load(bad, True, monkeypatch)  # a note, as when read in this process
    assert run.damaged and 99 not in run.ranks
    assert any(n.endswith("rank-99.jsonl is not a ddpdoctor trace: left out") for n in run.notes)
    assert multiprocessing.active_children() == []
    (bad / "rank-0.jsonl").unlink()
    (bad / "rank-0.jsonl").write_text("")
    serial = _load(bad, False, monkeypatch)
    assert [n for n in serial.notes if "left out" in n] == \
        [n for n in _load(bad, True, monkeypatch).notes if "left out" in n]


def _die_in_worker(paths: list[Path]) -> list[str]:
    if multiprocessing.parent_process() is not None:
        os._exit(9)  # a worker killed (out of memory, say)
    return [p.name for p in paths]


def test_a_worker_that_dies_costs_time_not_results(tmp_path: Path) -> None:
    files = [tmp_path / f"f{i}" for i in range(10)]
    got = list(parallel.in_batches(_die_in_worker, files, 2))
    assert got == [p.name for p in files]
    assert multiprocessing.active_children() == []


def _slow(paths: list[Path]) -> list[str]:
    time.sleep(0.2)
    return [p.name for p in paths]


def test_a_reader_that_stops_early_leaves_no_worker(tmp_path: Path) -> None:
    # Ctrl-C while the traces are read, or an error about the first file (two traces of one
    # rank): the caller leaves the loop while workers still read.
    files = [tmp_path / f"f{i}" for i in range(8 * parallel.FILES_PER_TASK)]
    batches = parallel.in_batches(_slow, files, 2)
    assert next(batches) == "f0"
    batches.close()
    assert multiprocessing.active_children() == []


def test_small_runs_and_threaded_processes_read_in_one_process(
        synthetic: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = synthetic
    files = sorted(folder.glob("rank-*.jsonl"))
    threads_running = parallel._threads_running
    monkeypatch.setattr(parallel, "_threads_running", lambda: False)
    assert parallel.workers_for(files) == 0  # a few MB: forking would not pay
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)
    assert parallel.workers_for(files[:parallel.MIN_FILES - 1]) == 0
    assert parallel.workers_for(files) >= 2 or len(os.sched_getaffinity(0)) < 2
    monkeypatch.setattr(parallel, "_threads_running", threads_running)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert parallel.workers_for(files) == 0  # a fork would copy the thread's locks
    finally:
        stop.set()
        thread.join()


def test_reading_is_followed_file_by_file_and_shown_on_a_terminal(
        synthetic: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import io

    from rich.console import Console

    app = importlib.import_module("ddpdoctor.cli.app")  # the package exports the Typer app

    folder, _ = synthetic
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(parallel, "MIN_BYTES", 0)
    load_run([folder], lambda done, total: calls.append((done, total)))
    assert calls == [(i, RANKS) for i in range(1, RANKS + 1)]
    for terminal in (True, False):
        out = io.StringIO()
        monkeypatch.setattr(app, "err", Console(file=out, force_terminal=terminal, width=100))
        with app.reading_progress() as on_file:
            on_file(1, app.READING_PROGRESS_FILES - 1)  # too few files for a bar
            assert out.getvalue() == ""
            for done in range(1, 41):
                on_file(done, 40)
        assert ("reading traces" in out.getvalue()) is terminal
        assert ("40/40" in out.getvalue()) is terminal
