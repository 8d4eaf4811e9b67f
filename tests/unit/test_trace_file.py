"""Traces appended through a shared mapping: what a rank leaves however it ends, and how the
readers, the live monitor and the launcher handle the NUL padding of a killed rank's file."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.unit.writer_jobs import writer_job

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.json_report import to_dict
from ddpdoctor.runtime import env, trace_file
from ddpdoctor.runtime.trace_file import TraceFile
from ddpdoctor.runtime.writer import TraceWriter
from ddpdoctor.trace import padding, schema
from ddpdoctor.trace.reader import load_run

REPO = Path(__file__).resolve().parents[2]


def _lines(n: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [json.dumps({"kind": "x", "i": i, "pad": "y" * rng.randrange(0, 900)}).encode() + b"\n"
            for i in range(n)]


def test_appends_cross_windows_and_close_trims_to_the_data(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_file, "WINDOW", 8192)  # many windows, lines across their edges
    path = tmp_path / "t.jsonl"
    f = TraceFile(str(path))
    data = _lines(400) + [b"z" * 20000 + b"\n"] + _lines(50, seed=2)  # one line over a window
    for chunk in data:
        f.append(chunk)
    whole = b"".join(data)
    on_disk = path.read_bytes()  # before close: the data, then what is reserved
    assert on_disk.startswith(whole) and len(on_disk) > len(whole)
    assert set(on_disk[len(whole):]) == {0} and len(on_disk) - len(whole) < 8192
    with open(path, "rb") as fh:
        assert padding.data_end(fh.fileno(), len(on_disk)) == len(whole)
    f.close()
    assert path.read_bytes() == whole


def _resident_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            if line[:1].isdigit() or line[:1] in "abcdef":  # a mapping's header line
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE")
def test_prefault_maps_the_pages_ahead_and_changes_no_byte(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_file, "WINDOW", 256 * 1024)
    path = tmp_path / "t.jsonl"
    f = TraceFile(str(path))
    f.append(b"x" * 100 + b"\n")
    before = _resident_kb(path)
    f.prefault(128 * 1024)
    if f._populate is None:
        pytest.skip("this kernel cannot populate a mapping (before Linux 5.14)")
    assert _resident_kb(path) >= before + 120
    f.prefault(128 * 1024)  # faulted already: nothing more
    f.prefault(10 ** 9)  # past the window's end: cut there
    assert f._populate is not None  # no call was refused
    f.append(b"y" * 5000 + b"\n")
    f.close()
    assert path.read_bytes() == b"x" * 100 + b"\n" + b"y" * 5000 + b"\n"


def test_an_existing_file_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"first\n")
    f = TraceFile(str(path))
    f.append(b"second\n")
    f.close()
    assert path.read_bytes() == b"first\nsecond\n"


@pytest.mark.parametrize("how", ["fallocate fails", "env"])
def test_without_a_mapping_the_file_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               how: str) -> None:
    if how == "env":
        monkeypatch.setenv(env.TRACE_WRITE, "1")
    else:
        def full(*_args: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")
        monkeypatch.setattr(os, "posix_fallocate", full)
    path = tmp_path / "t.jsonl"
    f = TraceFile(str(path))
    data = _lines(300)
    for chunk in data:
        f.append(chunk)
        assert path.stat().st_size == f.pos  # nothing reserved: no padding, ever
    f.close()
    assert path.read_bytes() == b"".join(data)


def test_collective_lines_across_window_edges_are_whole_and_in_the_declared_layout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # With small windows many lines are split between two: each must still be whole, in the
    # layout the readers' fast path depends on byte for byte (schema.COLLECTIVE_HEAD ...).
    monkeypatch.setattr(trace_file, "WINDOW", 8192)
    path = tmp_path / "rank-0.jsonl"
    w = TraceWriter(str(path), schema.header(0, "r", 0), 0, interval=3600, max_bytes=None)
    rng = random.Random(3)
    expected = []
    numbers = {True: 0, False: 0}  # point-to-point ops are numbered apart
    for n in range(1, 1501):
        stack = (("/job/train.py", rng.randrange(1, 6), "f" * rng.randrange(1, 300)),)
        p2p = rng.random() < 0.2
        numbers[p2p] += 1
        seq, p2p_seq = (None, numbers[p2p]) if p2p else (numbers[p2p], None)
        bucket = rng.randrange(4) if rng.random() < 0.5 else None
        site = w.site("0", "send" if p2p else "all_reduce", "user", None,
                      (((rng.randrange(1, 9),), "torch.float32"),), None, None,
                      1 if p2p else None, stack)
        cid = w.write_at(site, seq, p2p_seq, bucket, n // 10, 5.0 + n)
        extra = (f', "p2p_seq": {p2p_seq}' if p2p_seq is not None else "") + \
            (f', "bucket": {bucket}' if bucket is not None else "")
        expected.append(f'{{"id": {cid}, "kind": "collective", '
                        f'"seq": {"null" if seq is None else seq}, "iteration": {n // 10}, '
                        f'"site": {site.sid}{extra}}}')
    w.close()
    lines = [line for line in path.read_text().splitlines() if '"collective"' in line]
    assert lines == expected
    trace = load_run([tmp_path]).ranks[0]
    assert len(trace.collectives) == 1500 and not trace.damaged_lines and not trace.truncated


_KILLED = textwrap.dedent("""
    import os, signal, sys
    from ddpdoctor.runtime.writer import TraceWriter
    from ddpdoctor.trace import schema
    w = TraceWriter(sys.argv[1], schema.header(0, "r", 0), 0, interval=3600, max_bytes=None)
    w.put({"kind": "process_start", "t": 1.0, "rank": 0, "world_size": 1, "pid": os.getpid()})
    stack = (("/job/train.py", 3, "main"),)
    for seq in range(1, 2001):
        site = w.site("0", "all_reduce", "user", "all_reduce", (((4,), "torch.float32"),),
                      "SUM", None, None, stack)
        w.write_at(site, seq, None, None, seq // 10, 5.0 + seq)
    os.kill(os.getpid(), signal.SIGKILL)  # no close: the file keeps its reserved bytes
""")


def test_a_killed_writer_leaves_every_line_and_readers_skip_its_padding(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    proc = subprocess.run([sys.executable, "-c", _KILLED, str(path)], cwd=REPO, timeout=60,
                          capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    raw = path.read_bytes()
    end = len(raw.rstrip(b"\0"))
    assert 0 < len(raw) - end <= schema.PAD_MAX and raw[end - 1:end] == b"\n"
    run = load_run([tmp_path])
    trace = run.ranks[0]
    assert len(trace.collectives) == 2000 and not trace.truncated and not trace.damaged_lines
    assert trace.collectives[1999].seq == 2000
    padding.trim(str(tmp_path))  # what the launcher does once the job has ended
    assert path.read_bytes() == raw[:end]
    again = load_run([tmp_path]).ranks[0]
    assert len(again.collectives) == 2000 and not again.damaged_lines


def test_padded_ranks_give_the_diagnosis_of_trimmed_ones(tmp_path: Path) -> None:
    trimmed = writer_job(tmp_path / "trimmed", None, iterations=120, eval_at=100, hang=True)
    padded = tmp_path / "padded"
    padded.mkdir()
    for i, src in enumerate(sorted(trimmed.glob("rank-*.jsonl"))):
        # Rank 1 also ends mid-line, as a rank killed while storing one does.
        cut = b'{"id": 99999, "kind": "coll' if i == 1 else b""
        (padded / src.name).write_bytes(src.read_bytes() + cut + b"\0" * (5000 + 7 * i))
    shutil.copy(trimmed / schema.JOB_FILE, padded)  # the launcher's word: it stopped a hang
    want, got = to_dict(diagnose(load_run([trimmed]))), to_dict(diagnose(load_run([padded])))
    assert want["findings"] and want["verdict"] == got["verdict"]
    assert got["notes"] == want["notes"] + [
        "rank 1: last line cut off (the process was killed while writing); skipped"]
    want["notes"] = got["notes"] = []
    assert json.dumps(got, default=str).replace(str(padded), "") == \
        json.dumps(want, default=str).replace(str(trimmed), "")
    run = load_run([padded])
    assert run.ranks[1].truncated and not run.ranks[0].truncated
    assert not any(t.damaged_lines for t in run.ranks.values())


def test_zeros_past_the_padding_bound_are_damage_not_padding(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"line\n" + b"\0" * (schema.PAD_MAX + 10))
    with open(path, "rb") as fh:
        assert padding.data_end(fh.fileno(), path.stat().st_size) == path.stat().st_size
    path.write_bytes(b"line\n" + b"\0" * 100)
    with open(path, "rb") as fh:
        assert padding.data_end(fh.fileno(), path.stat().st_size) == 5
