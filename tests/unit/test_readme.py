"""The README's set-up promises: two commands first, and CI runs the second one."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_commands() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert "ddpdoctor run examples/" in commands[0]
    assert "[test]" in commands[1] and "pytest" in commands[1]
    # torch is pinned for set-up through the constraints file, never installed unpinned.
    assert all("-c constraints.txt" in c for c in commands)
    assert "torch==2.13.0" in (REPO / "constraints.txt").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in ci


def test_readme_example_exists() -> None:
    script = _readme_commands()[0].split("ddpdoctor run ", 1)[1].split()[0]
    assert (REPO / script).is_file()
