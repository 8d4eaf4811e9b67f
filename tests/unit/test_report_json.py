"""The JSON report: the shape docs/report-format.md documents, serialisable, root first."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.analysis import diagnose
from ddpdoctor.render.json_report import to_dict

from . import scenarios
from .factories import healthy_ddp, make_run

DOC = Path(__file__).resolve().parents[2] / "docs" / "report-format.md"
RANK_KEYS = {"op", "label", "site", "state", "shapes", "dtypes", "iteration"}
FINDING_KEYS = {"kind", "severity", "group", "seq", "cause", "summary", "advice", "ranks"}


def test_diverged_report_has_the_documented_shape() -> None:
    data = to_dict(diagnose(scenarios.seed001_case5()))
    assert json.loads(json.dumps(data)) == data
    assert data["verdict"] == "diverged" and data["world_size"] == 2
    assert set(data["ranks"]) == {"0", "1"}
    assert data["ranks"]["1"]["iterations"] == 6
    root = data["findings"][0]
    assert FINDING_KEYS <= set(root)
    assert (root["kind"], root["severity"], root["group"], root["seq"], root["cause"]) == \
        ("op_mismatch", "error", "0", 11, "uneven_inputs")
    assert set(root["ranks"]) == {"0", "1"}
    r0, r1 = root["ranks"]["0"], root["ranks"]["1"]
    assert RANK_KEYS <= set(r0)
    assert (r0["op"], r0["label"], r0["state"], r0["iteration"]) == \
        ("barrier", "user", "pending", 5)
    assert r0["site"] == {"file": "/work/job/train.py", "line": 32, "function": "main"}
    assert (r1["op"], r1["label"], r1["shapes"], r1["dtypes"]) == \
        ("all_reduce", "ddp.bucket", [[2]], ["float32"])
    assert root["context"]["seq"] == 10 and root["context"]["ranks"]["0"]["label"] == \
        "ddp.bucket"
    assert root["advice"] and root["cause_title"]


def test_absent_rank_has_null_op_and_where_it_was() -> None:
    data = to_dict(diagnose(scenarios.seed001_case2()))
    root = data["findings"][0]
    assert root["kind"] == "missing_collective"
    absent = root["ranks"]["0"]
    assert absent["op"] is None and absent["label"] is None and absent["state"] == "finished"
    assert [f["kind"] for f in data["findings"]] == ["missing_collective", "rank_exited_early",
                                                     "rank_crashed"]
    assert [f["follow_on"] for f in data["findings"]] == [False, True, True]
    assert data["findings"][0]["explained_by"] is None
    assert all(f["explained_by"] for f in data["findings"][1:])


def test_crash_report_and_clean_report() -> None:
    data = to_dict(diagnose(scenarios.seed003_crash()))
    assert data["verdict"] == "crashed"
    crashed = data["findings"][0]["ranks"]["1"]
    assert crashed["state"] == "exception" and crashed["site"]["line"] == 8
    assert data["ranks"]["1"]["status"] == "exception"
    assert data["ranks"]["1"]["detail"] == "ValueError: Simulated error in process 1"

    clean = to_dict(diagnose(make_run(*healthy_ddp())))
    assert clean["verdict"] == "clean" and clean["findings"] == []
    assert clean["ranks"]["0"]["status"] == "finished"
    assert clean["ranks"]["0"]["last"]["label"] == "ddp.bucket"


def test_every_key_is_documented() -> None:
    text = DOC.read_text()
    data = to_dict(diagnose(scenarios.seed001_case5()))
    keys = set(data) | set(data["findings"][0]) | set(data["findings"][0]["ranks"]["0"]) \
        | set(data["ranks"]["0"])
    for key in keys:
        assert f"`{key}`" in text, key
    for verdict in ("clean", "diverged", "crashed", "incomplete"):
        assert f"`{verdict}`" in text
