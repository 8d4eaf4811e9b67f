"""Every example in examples/ runs under ``ddpdoctor run`` and gets the diagnosis it documents.

Each example's docstring ends with an ``Expected diagnosis`` block (one per ``--case`` for
seed 001); source lines the diagnosis must point at carry a ``# ddpdoctor: <marker>`` comment.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .jobs import EXAMPLES, TERMINAL, last_screen, marker_line, run_job

_BLOCK = re.compile(r"Expected diagnosis(?: \(case (\d+)\))?:\n((?:[ \t]+\w+:.*\n)+)")
# Scripts that start their own workers with mp.spawn run under --launcher python.
_SPAWNING = {"seed001_uneven.py"}
SMOKE = ("--cpu", "--epoch-steps", "2")  # examples/ci/github-workflow.yml's settings


def _cases(smoke: bool = False) -> list:
    """Each documented diagnosis; ``smoke``: those of the examples whose epochs come from a
    DataLoader, which the CI smoke settings (``--epoch-steps 2``) cut short (the others run
    the same under them)."""
    cases = []
    for path in sorted(EXAMPLES.glob("*.py")):
        if smoke and "DataLoader(" not in path.read_text():
            continue
        for case, body in _BLOCK.findall(path.read_text()):
            fields = dict(line.strip().split(":", 1) for line in body.strip().splitlines())
            expected = {k.strip(): v.strip().split()[0] for k, v in fields.items()}
            args = ("--case", case) if case else ()
            name = path.stem + (f"-case{case}" if case else "")
            cases.append(pytest.param(path, args, expected, () if not smoke else SMOKE,
                                      id=name + ("-smoke" if smoke else "")))
    return cases


def test_every_example_documents_its_expected_diagnosis() -> None:
    documented = {p.values[0].name for p in _cases()}
    assert documented == {p.name for p in EXAMPLES.glob("*.py")}
    assert len(_cases(smoke=True)) >= 4  # the seed 000 pair, seed 002, the shared helper


def _none(value: str) -> bool:
    return value in ("none", "-")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path, args, expected, smoke", [*_cases(), *_cases(smoke=True)])
def test_example_diagnosis(tmp_path: Path, path: Path, args: tuple, expected: dict,
                           smoke: tuple) -> None:
    """The documented diagnosis, as run plainly and (examples with DataLoaders) under the CI
    smoke settings, which must find every example's bug too."""
    options = (("--launcher", "python") if path.name in _SPAWNING else ()) + smoke
    # Run as on an 80-column terminal: the report printed last is its brief form.
    job = run_job(tmp_path, path, *args, options=options, hang_timeout=5, env=TERMINAL)
    report = job.report
    assert report is not None, job.stderr[-3000:]
    assert report["verdict"] == expected["verdict"], job.stderr[-3000:]
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    if _none(expected["finding"]):
        assert not errors, errors
        assert job.returncode == 0, job.stderr[-3000:]
        # Nothing warns on a healthy run: torch 2.14 printed a deprecation ddpdoctor caused.
        assert "Warning" not in job.stderr and "warning" not in job.stderr, job.stderr
        return
    assert job.returncode != 0
    root = report["findings"][0]
    assert root["kind"] == expected["finding"], root["summary"]
    assert root["cause"] == (None if _none(expected["cause"]) else expected["cause"])
    wanted = {int(r) for r in expected["ranks"].split(",")}
    if root["kind"] == "rank_crashed":
        # The crashed rank has no collective (op null); the others show where they were left.
        crashed = {int(r) for r, d in root["ranks"].items() if d["op"] is None}
        assert crashed == wanted, root["ranks"]
    else:
        assert {int(r) for r in root["ranks"]} == wanted
    sites = {(Path(d["site"]["file"]).name, d["site"]["line"])
             for d in root["ranks"].values() if d.get("site")}
    for marker in expected["lines"].split(","):
        assert (path.name, marker_line(path, marker)) in sites, (marker, sites)
    # The last screen of a 30-row terminal holds the verdict, each rank's line, the cause
    # and the fix; the whole report is in the log folder.
    screen = last_screen(job.stderr)
    assert f"ddpdoctor: {expected['verdict'].upper()} — root cause {root['kind']}" in screen
    assert "rank   op" in screen
    for name, line in sites:
        assert f"{name}:{line}" in screen, (name, line, screen)
    if root["cause"] is not None:
        assert f"[{root['cause']}]" in screen and "Fix:" in screen, screen
    assert "Why:" in (job.logdir / "report.txt").read_text()
