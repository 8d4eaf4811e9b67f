"""Damaged and hostile log folders: ``ddpdoctor diff`` answers each with one line or a report,
the documented exit code, no traceback, a bounded read; and reports carry nothing raw."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddpdoctor.analysis import diagnose
from ddpdoctor.analysis.report import Report
from ddpdoctor.cli import app
from ddpdoctor.render.console import ConsoleReporter
from ddpdoctor.render.interface import render
from ddpdoctor.render.markdown import MarkdownReporter
from ddpdoctor.render.run_info import RunInfo
from ddpdoctor.render.safe import clean
from ddpdoctor.trace import redact
from ddpdoctor.trace.reader import load_run

HEADER = {"kind": "header", "format": "ddpdoctor-trace", "version": 3, "rank": 0,
          "run_id": "r", "attempt": 0}
START = {"kind": "process_start", "rank": 0, "world_size": 2, "pid": 1}
STACK = {"kind": "stack", "id": 0, "frames": [{"file": "t.py", "line": 3, "function": "f"}]}


def _coll(**kw) -> dict:
    return {"kind": "collective", "id": 1, "rank": 0, "seq": 1, "iteration": 0, "t": 1.0,
            "state": "pending", "group": "0", "op": "all_reduce", "label": "user",
            "shapes": [[2]], "dtypes": ["float32"], "numel": 2, "stack": 0, **kw}


DONE = {"kind": "done", "t": 2, "upto": 1, "pending": []}
EXIT = {"kind": "exit", "status": "finished", "t": 3}
HEALTHY = [START, STACK, _coll(), DONE, EXIT]


def _folder(tmp: Path, head: dict | None = None, records: list | None = None,
            raw: bytes | None = None, crlf: bool = False) -> Path:
    for rank in (0, 1):
        lines = [json.dumps({**HEADER, "rank": rank, **(head or {})})]
        lines += [json.dumps({**r, "rank": rank} if "rank" in r else r)
                  for r in (HEALTHY if records is None else records)]
        data = ("\r\n" if crlf else "\n").join(lines) + "\n"
        path = tmp / f"rank-{rank}.jsonl"
        path.write_bytes(raw if raw is not None and rank == 0 else data.encode())
    return tmp


CASES = [
    ("header rank [0]", dict(head={"rank": [0]}), 2),
    ("attempt 'x'", dict(head={"attempt": "x"}), 2),
    ("version -1", dict(head={"version": -1}), 2),
    ("version '2'", dict(head={"version": "2"}), 2),
    ("version 2.0", dict(head={"version": 2.0}), 2),
    ("world_size 'two'", dict(records=[{**START, "world_size": "two"}, STACK, _coll()]), 1),
    ("world_size 10**6", dict(records=[{**START, "world_size": 10**6}, STACK, _coll()]), 1),
    ("world_size 10**9", dict(records=[{**START, "world_size": 10**9}, STACK, _coll()]), 1),
    ("cap with strings", dict(records=HEALTHY + [{"kind": "cap", "t": 1, "bytes": "x",
                                                  "max_bytes": "y"}]), 1),
    ("a deleted collective line", dict(records=[START, STACK, _coll(), _coll(id=3, seq=3),
                                                {**DONE, "upto": 3}, EXIT]), 1),
    ("seq 10**9", dict(records=[START, STACK, _coll(seq=10**9), DONE, EXIT]), 1),
    ("seq 10**40", dict(records=[START, STACK, _coll(seq=10**40), DONE, EXIT]), 1),
    ("nested 200,000 deep", dict(raw=json.dumps(HEADER).encode() + b"\n" + b"[" * 200_000
                                 + b"]" * 200_000 + b"\n"), 1),
    ("unknown stack id", dict(records=[START, STACK, _coll(stack=99), DONE, EXIT]), 1),
    ("unknown state", dict(records=[START, STACK, _coll(state="exploded"), DONE, EXIT]), 1),
    ("a gap in the ids", dict(records=[START, STACK, _coll(), _coll(id=3, seq=3), EXIT]), 1),
    ("CRLF line endings", dict(crlf=True), 0),
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name, spec, code", CASES, ids=[c[0] for c in CASES])
def test_damaged_folders_get_their_exit_code_and_no_traceback(tmp_path: Path, name: str,
                                                              spec: dict, code: int) -> None:
    result = CliRunner().invoke(app, ["diff", str(_folder(tmp_path, **spec))])
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and result.exception is None or \
        isinstance(result.exception, SystemExit)
    if code == 1:
        assert "CLEAN" not in result.output


@pytest.mark.timeout(20)
def test_a_fifo_named_like_a_trace_is_left_out_not_waited_on(tmp_path: Path) -> None:
    _folder(tmp_path)
    os.remove(tmp_path / "rank-1.jsonl")
    os.mkfifo(tmp_path / "rank-1.jsonl")
    result = CliRunner().invoke(app, ["diff", str(tmp_path)])
    # Rank 0's trace is still diagnosed; the FIFO is named as left out, never read.
    assert result.exit_code in (0, 1) and "2 ranks" in result.output
    assert "rank-1.jsonl is not a regular file" in result.output and "left out" in \
        result.output
    assert "Traceback" not in result.output
    # Alone in its folder, it leaves nothing to diagnose: refused with one line.
    os.remove(tmp_path / "rank-0.jsonl")
    result = CliRunner().invoke(app, ["diff", str(tmp_path)])
    assert result.exit_code == 2 and "not a regular file" in result.output


def test_many_unreadable_files_are_named_up_to_a_bound_and_counted(tmp_path: Path) -> None:
    from ddpdoctor.trace.reader import MAX_LEFT_OUT_NOTES

    _folder(tmp_path)
    for rank in range(2, 40):
        (tmp_path / f"rank-{rank}.jsonl").write_bytes(b"")
    run = load_run([tmp_path])
    assert sorted(run.ranks) == [0, 1] and run.damaged
    named = [n for n in run.notes if n.endswith("is empty: the rank died before writing "
                                                "anything: left out")]
    assert len(named) == MAX_LEFT_OUT_NOTES
    assert f"{38 - MAX_LEFT_OUT_NOTES} more files that are no readable trace: left out" in \
        run.notes


def test_links_out_of_the_folder_are_not_followed(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    folder = _folder(tmp_path / "logs")
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    (folder / "rank-2.jsonl").symlink_to(secret)
    (folder / "nccl_trace_rank_3").symlink_to(folder.parent / "elsewhere")  # dangling too
    os.link(folder / "rank-1.jsonl", folder / "rank-1.attempt-0.copy.jsonl.x")  # not a trace
    (folder / "rank-1.jsonl").unlink()
    (folder / "rank-1.jsonl").symlink_to(folder / "rank-1.attempt-0.copy.jsonl.x")  # inside
    run = load_run([folder])
    assert sorted(run.ranks) == [0, 1]  # a link inside the folder is read
    assert any(n.endswith("rank-2.jsonl links to a file outside its folder: not followed")
               for n in run.notes), run.notes
    result = CliRunner().invoke(app, ["diff", str(folder)])
    assert "hunter2" not in result.output and "not followed" in result.output


def test_a_big_fault_file_is_read_by_its_first_bytes(tmp_path: Path) -> None:
    _folder(tmp_path, records=[START, STACK, _coll()])
    with open(tmp_path / "fault-1.txt", "wb") as fh:
        fh.write(b"Fatal Python error: Segmentation fault\n")
        fh.truncate(2 * 1024**3)  # sparse: 2 GB that must not be read
    assert load_run([tmp_path]).exit_codes == {0: -11, 1: -11}


def test_reports_strip_terminal_escapes_and_markdown_escapes_html(tmp_path: Path) -> None:
    evil = "boom\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://x\x1b\\link\x00 <script>x</script>"
    exc = {"kind": "exception", "type": "ValueError", "message": evil, "t": 2.0,
           "frames": [{"file": "t.py", "line": 3, "function": "f\x1b[31m"}]}
    _folder(tmp_path, records=[START, STACK, _coll(), DONE, exc])
    report = diagnose(load_run([tmp_path]))
    text = render(ConsoleReporter(200), report)
    assert "\x1b" not in text and "\x00" not in text and "pwned" not in text
    assert "boom" in text and "link" in text
    md = render(MarkdownReporter(), report, RunInfo(name="t.py --api-key s3cret"))
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert clean("a\x1b[1mb\x07c") == "abc"


def test_a_frame_naming_a_system_file_never_shows_that_file(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:SECRET-HASH:19000:0:99999:7:::\n")
    stack = {"kind": "stack", "id": 0, "frames": [{"file": str(secret), "line": 1,
                                                   "function": "f"}]}
    records = [START, stack, _coll(), _coll(id=2, seq=2, op="broadcast"), DONE]
    _folder(tmp_path / "logs", records=records) if (tmp_path / "logs").mkdir() is None else None
    result = CliRunner().invoke(app, ["diff", str(tmp_path / "logs")])
    assert "SECRET-HASH" not in result.output


def test_secret_looking_arguments_are_masked() -> None:
    argv = ["train.py", "--api-key", "secret123", "--token=abc", "HF_TOKEN=xyz", "--lr", "1",
            "--password"]
    assert redact.mask_args(argv) == ["train.py", "--api-key", "***", "--token=***",
                                      "HF_TOKEN=***", "--lr", "1", "--password"]


def test_markdown_and_junit_names_mask_secrets(tmp_path: Path) -> None:
    name = " ".join(redact.mask_args(["t.py", "--api-key", "secret123"]))
    assert "secret123" not in render(MarkdownReporter(), None, RunInfo(name=name))


def test_log_folder_files_are_private(tmp_path: Path) -> None:
    from ddpdoctor.launch.command import make_logdir
    from ddpdoctor.launch.errors import UsageError

    path = make_logdir(str(tmp_path / "logs"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    with pytest.raises(UsageError, match="in use by another ddpdoctor run"):
        import subprocess
        import sys

        code = ("from ddpdoctor.launch.command import make_logdir; "
                f"make_logdir({str(path)!r})")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        raise UsageError(proc.stderr.strip().splitlines()[-1])


# -- the generated corpus: every damage of tests/unit/damage.py on four real writer logs -------
@pytest.mark.timeout(600)
@pytest.mark.parametrize("base", ["healthy", "capped", "diverged", "crashed"])
def test_no_damage_invents_a_verdict_or_raises(tmp_path: Path, base: str) -> None:
    import time

    from ddpdoctor.trace.reader import TraceError

    from .damage import ALLOWED, make_base, variants

    start_kb = _reset_peak_rss()
    folder = make_base(base, tmp_path / "base")
    truth = diagnose(load_run([folder]))
    assert truth.verdict == {"healthy": "clean", "capped": "clean"}.get(base, base)
    unnoted: list[tuple[str, tuple]] = []
    wrong, slow, seen = [], [], 0
    for name, variant in variants(folder, tmp_path / "variants"):
        seen += 1
        start = time.monotonic()
        try:
            report = diagnose(load_run([variant]))
            render(ConsoleReporter(), report, RunInfo(name="damaged"))  # and it renders
            verdict = report.verdict
        except TraceError:
            verdict = "error"
        if verdict not in ALLOWED[base]:
            wrong.append((name, verdict, report.findings[0].summary[:160]))
        elif verdict not in ("incomplete", "error") and _story(report) != _story(truth) and \
                not set(report.notes) - set(truth.notes):
            unnoted.append((name, _story(report)))  # another story, and nothing said why
        if time.monotonic() - start > 10:
            slow.append(name)
    assert seen > 700
    assert not wrong, wrong[:5]
    assert not unnoted, unnoted[:5]
    assert not slow
    # What reading the corpus added to the process at its peak (torch, imported by other
    # tests, is already in the process: 650 MB with a CUDA build).
    assert _status_kb("VmHWM") - start_kb < 500 * 1024


def _story(report: Report) -> tuple:
    """What a report says happened: its verdict, and its root finding's kind, ranks, cause."""
    root = report.findings[0] if report.findings else None
    return (report.verdict, root and root.kind, root and tuple(sorted(root.ranks)),
            root and root.cause)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def _reset_peak_rss() -> int:
    """Start the process's peak resident size again from now (Linux: clear_refs 5); returns
    the resident size now, in KB."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kb("VmRSS")
