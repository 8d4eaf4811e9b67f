"""Hardening: ddpdoctor changes nothing that is not its own, masks secrets by their shape as
well as their name, writes its reports for the user alone, never fails on text that is not
valid UTF-8, and an interrupted run is no crash."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis import diagnose
from ddpdoctor.launch.command import make_logdir
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.trace import redact, schema

from .factories import make_run, ranks

REPO = Path(__file__).resolve().parents[2]


# -- the log folder ------------------------------------------------------------------------
def test_an_existing_log_folder_keeps_its_mode_and_its_files(tmp_path: Path) -> None:
    folder = tmp_path / "shared-logs"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    (folder / ".write-test").write_text("mine")
    assert make_logdir(str(folder)) == folder.resolve()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o1777
    assert (folder / ".write-test").read_text() == "mine"


def test_a_refused_log_folder_is_left_as_it_was(tmp_path: Path) -> None:
    folder = tmp_path / "old-run"
    folder.mkdir()
    os.chmod(folder, 0o755)
    (folder / "rank-0.jsonl").write_text("{}\n")
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(UsageError, match="already holds traces"):
        make_logdir(str(folder))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert sorted(p.name for p in folder.iterdir()) == before


@pytest.mark.parametrize("name", ["job.json", "rank-0.jsonl.cut", "hang-request.json",
                                  "report.txt", "exits-12.json", "torchrun.txt"])
def test_a_folder_with_a_file_named_as_ddpdoctors_own_is_refused_and_left_alone(
        tmp_path: Path, name: str) -> None:
    """A user's job.json was overwritten, a user's .cut file made a healthy run incomplete and
    a leftover hang-request.json made healthy ranks write hang records (issue 53)."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / name).write_text("the user's\n")
    (folder / "notes.md").write_text("kept\n")
    with pytest.raises(UsageError, match=f"holds files named as ddpdoctor's own \\({name}\\)"):
        make_logdir(str(folder))
    assert (folder / name).read_text() == "the user's\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, "notes.md"])


def test_a_folder_of_other_files_is_used(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.md").write_text("kept\n")
    assert make_logdir(str(folder)) == folder.resolve()
    assert (folder / "notes.md").read_text() == "kept\n"


def test_a_new_log_folder_is_the_users_alone(tmp_path: Path) -> None:
    folder = make_logdir(str(tmp_path / "new"))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


# -- secrets ---------------------------------------------------------------------------------
@pytest.mark.parametrize("args, hidden", [
    (["--db-pass", "hunter2"], "hunter2"),
    (["--database-url", "postgres://u:SECRET@h/db"], "SECRET"),
    (["--database-url=mysql://admin:S3cr3t!@db:3306/x"], "S3cr3t!"),
    (["sk-proj-4f9aK2mZq8XvB1nT7yLcW3eR6uH0pJdS"], "4f9aK2mZq8XvB1nT7yLcW3eR6uH0pJdS"),
    (["--hf", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"], "AbCdEfGhIjKlMnOpQrStUvWxYz"),
    # Shapes an independent check found leaking (issue 53).
    (["--repo", "https://ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r.git"],
     "ghp_16C7e42F292c6912E7710c838347Ae178B4a"),
    (["--config", '{"lr": 0.1, "password": "hunter2", "db": {"api_key": "k9"}}'], "hunter2"),
    (["--config", '{"lr": 0.1, "password": "hunter2", "db": {"api_key": "k9"}}'], '"k9"'),
    (["--config", "db_password: hunter2"], "hunter2"),
    (["-p", "hunter2"], "hunter2"),
    (["--header", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc"], "eyJhbGciOiJIUzI1NiJ9"),
    (["Bearer", "abc.def.ghi"], "abc.def.ghi"),
    (["--note", "token github_pat_11ABCDEFG0123456789_abcdefghijkl used"],
     "github_pat_11ABCDEFG0123456789"),
    (["--slack", "xoxb-123456789012-abcdefghijkl"], "xoxb-123456789012"),
    (["--aws", "AKIAIOSFODNN7EXAMPLE"], "AKIAIOSFODNN7EXAMPLE"),
    (["--key-file=x", "--openai", "sk-abcdefghijklmnopqrstuvwx"], "sk-abcdefghijklmnopqrstuvwx"),
])
def test_secrets_are_masked_by_name_and_by_shape(args: list[str], hidden: str) -> None:
    masked = " ".join(redact.mask_args(args))
    assert hidden not in masked and redact.MASK in masked, masked


@pytest.mark.parametrize("args", [
    ["--resume", "checkpoints/checkpoint_epoch_0001_step_000020000.pt"],
    ["--data", "data_train_shard_00001_of_00064_v2_x"], ["--epochs", "3", "--lr=0.001"],
    ["--url", "https://example.org/data/train.tar"],
    ["--url", "https://user@example.org/data"], ["--config", '{"lr": 0.1, "epochs": 3}'],
    ["--lr-schedule", "cosine:0.1"], ["--desk", "sk-1"],
    ["--norm", "basic", "--lr", "3"], ["--mode", "token", "--lr", "3"], ["--desc", "Basic model"],
])
def test_ordinary_arguments_are_kept(args: list[str]) -> None:
    assert redact.mask_args(args) == args


# -- report files and encodings --------------------------------------------------------------
def _surrogate_log(folder: Path) -> Path:
    """Two ranks; rank 1 raised an error whose message holds a lone surrogate (a file name
    that is not valid UTF-8)."""
    folder.mkdir()
    for rank in (0, 1):
        lines = [schema.header(rank, "r", 0),
                 {"kind": "process_start", "rank": rank, "world_size": 2, "pid": 10 + rank}]
        if rank == 1:
            lines.append({"kind": "exception", "t": 2.0, "type": "ValueError",
                          "message": "bad file \ud800.bin", "frames": [
                              {"file": "/job/t\udcff.py", "line": 3, "function": "f"}]})
            lines.append({"kind": "exit", "t": 3.0, "status": "exception"})
        else:
            lines.append({"kind": "exit", "t": 3.0, "status": "finished"})
        text = "\n".join(json.dumps(line) for line in lines) + "\n"
        (folder / f"rank-{rank}.jsonl").write_text(text)
    return folder


def test_text_that_is_not_utf8_never_breaks_a_piped_report(tmp_path: Path) -> None:
    folder = _surrogate_log(tmp_path / "logs")
    for extra in ([], ["--json"]):
        proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "diff", *extra, str(folder)],
                              capture_output=True, cwd=REPO, timeout=60,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8"})
        out = proc.stdout.decode("utf-8", "replace") + proc.stderr.decode("utf-8", "replace")
        assert proc.returncode == 1, out
        assert "Traceback" not in out and "UnicodeEncodeError" not in out, out
        assert "ValueError" in out


def test_report_files_are_created_for_the_user_alone(tmp_path: Path) -> None:
    from ddpdoctor.cli.run import _write

    new, old = tmp_path / "junit.xml", tmp_path / "summary.md"
    old.write_text("earlier\n")
    os.chmod(old, 0o644)
    _write([(new, "<x>\ud800</x>", "w"), (old, "more \udcff\n", "a")])
    assert stat.S_IMODE(new.stat().st_mode) == 0o600
    assert stat.S_IMODE(old.stat().st_mode) == 0o644  # not ddpdoctor's to change
    assert new.read_text() == "<x>\\ud800</x>" and old.read_text() == "earlier\nmore \\udcff\n"


def test_junit_of_a_surrogate_message_is_valid_xml(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from ddpdoctor.render.junit import JunitReporter
    from ddpdoctor.render.run_info import RunInfo
    from ddpdoctor.render.view import ReportView
    from ddpdoctor.trace.reader import load_run

    report = diagnose(load_run([_surrogate_log(tmp_path / "logs")]))
    xml = JunitReporter().render(ReportView(report, RunInfo(name="t\udcff.py", exit_code=1)))
    xml.encode("utf-8")  # no lone surrogate left
    assert ET.fromstring(xml).find("testsuite/testcase/failure") is not None


# -- interrupted -----------------------------------------------------------------------------
def test_ctrl_c_is_an_interrupted_run_not_a_crash() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(2)
        b.forward()
        b.raise_("KeyboardInterrupt", "", line=30)
    report = diagnose(make_run(*bs, exit_codes={0: -2, 1: -2}))
    assert report.verdict == "incomplete"
    assert not [f for f in report.findings if f.is_error]
    assert any("interrupted" in n for n in report.notes)
    assert {r.status for r in report.ranks} == {"interrupted"}


# -- damaged input -------------------------------------------------------------------------
def _healthy_pair(folder: Path) -> Path:
    from .test_bad_input import _trace

    folder.mkdir()
    _trace(folder / "rank-0.jsonl", 0)
    _trace(folder / "rank-1.jsonl", 1)
    return folder


@pytest.mark.parametrize("name, rank", [("rank-2.jsonl", 2), ("rank-1.jsonl", 5),
                                        ("rank-1.jsonl", 131071)])
def test_a_rank_outside_the_world_is_damage_never_a_group_mismatch(
        tmp_path: Path, name: str, rank: int) -> None:
    from ddpdoctor.trace.reader import load_run

    from .test_bad_input import _trace

    folder = _healthy_pair(tmp_path / "logs")
    text = _trace(tmp_path / "copy.jsonl", 1).read_text()
    (folder / name).write_text(text.replace('"rank": 1,', f'"rank": {rank},', 1))
    run = load_run([folder])
    report = diagnose(run)
    assert report.verdict == "incomplete", (report.verdict, report.findings[:1])
    assert not [f for f in report.findings if f.kind == "group_mismatch"]
    assert any("outside the 2-rank world" in n for n in report.notes), report.notes
    assert len(report.notes) < 10  # not one note per missing rank of a 131072-rank world


def test_a_header_without_a_rank_is_unreadable_not_rank_minus_one(tmp_path: Path) -> None:
    from ddpdoctor.trace.reader import TraceError, load_run

    folder = _healthy_pair(tmp_path / "logs")
    path = folder / "rank-1.jsonl"
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    del head["rank"]
    path.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    run = load_run([folder])  # the other rank is still read; this file is a note
    assert list(run.ranks) == [0] and run.damaged
    assert any("names no rank" in n and n.endswith("left out") for n in run.notes)
    (folder / "rank-0.jsonl").unlink()
    with pytest.raises(TraceError, match="names no rank"):  # nothing else to read
        load_run([folder])


def _dumps(folder: Path, change: dict) -> Path:
    from .test_flight_recorder import _bucket, _dump

    folder.mkdir()
    _dump(folder / "nccl_trace_rank_0", [{**_bucket(s), **change} for s in range(1, 4)],
          pickled=False)
    _dump(folder / "nccl_trace_rank_1", [_bucket(s) for s in range(1, 4)], pickled=False)
    return folder


DEEP = "[" * 100_000 + "]" * 100_000
DAMAGED_DUMPS = [{"collective_seq_id": "abc"}, {"input_sizes": [["x"]]},
                 {"time_created_ns": [1]}, {"input_dtypes": 5}, {"p2p_seq_id": "x"},
                 {"input_sizes": [[[4160]]]}]


@pytest.mark.parametrize("change", DAMAGED_DUMPS, ids=[next(iter(c)) for c in DAMAGED_DUMPS])
def test_a_dump_with_fields_of_other_types_is_a_message_not_a_traceback(
        tmp_path: Path, change: dict) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    result = CliRunner().invoke(app, ["diff", str(_dumps(tmp_path / "logs", change))])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert result.exit_code in (1, 2) and "Traceback" not in result.output


@pytest.mark.parametrize("name", ["job.json", "exits-1.json", "nccl_trace_rank_0"])
def test_json_nested_100000_deep_is_a_message_not_a_traceback(tmp_path: Path, name: str) -> None:
    from typer.testing import CliRunner

    from ddpdoctor.cli import app

    folder = _healthy_pair(tmp_path / "logs")
    (folder / name).write_text(DEEP)
    result = CliRunner().invoke(app, ["diff", str(folder)])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    assert result.exit_code in (0, 1, 2)
