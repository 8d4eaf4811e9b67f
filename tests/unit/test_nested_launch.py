"""The nested-launch note a torchrun rank leaves when the script spawns its own workers."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.trace import nested_launch, schema


def test_the_first_rank_s_report_names_the_spawn_site_and_the_command(tmp_path: Path) -> None:
    assert nested_launch.message(tmp_path, "train.py") is None
    nested_launch.report(tmp_path, 1, "/job/train.py", 42)
    nested_launch.report(tmp_path, 0, "/job/other.py", 7)  # the first word stays
    text = nested_launch.message(tmp_path, "jobs/train.py")
    assert text is not None
    assert "(train.py:42)" in text and "other.py" not in text
    assert "ddpdoctor run --launcher python jobs/train.py" in text


def test_a_damaged_or_foreign_note_is_no_nested_launch(tmp_path: Path) -> None:
    note = tmp_path / schema.NESTED_LAUNCH
    for content in ("{not json", "[1, 2]", ""):
        note.write_text(content)
        assert nested_launch.message(tmp_path, "train.py") is None
    note.write_text('{"file": null, "line": "x"}')  # no usable site: still the advice
    text = nested_launch.message(tmp_path, "train.py")
    assert text is not None and "starts its own worker processes, so" in text
