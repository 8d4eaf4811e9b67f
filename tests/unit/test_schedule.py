"""The collective schedule: taken from a run, kept as YAML, compared with a later run."""

from __future__ import annotations

import pytest
import yaml

from ddpdoctor.analysis import schedule
from ddpdoctor.analysis.schedule import ScheduleError

from .factories import TraceBuilder, healthy_ddp, make_run, ranks


def _run(iterations: int = 3, buckets: tuple[int, ...] = (244,), extra: bool = False,
         world: int = 2):
    bs = ranks(world)
    for b in bs:
        b.ddp_init()
        for _ in range(iterations):
            b.step(buckets)
            if extra:
                b.user("all_reduce", shapes=[[1]], reduce_op="SUM", line=57)
        b.finish()
    return make_run(*bs)


def _roundtrip(s: schedule.Schedule) -> schedule.Schedule:
    return schedule.from_yaml(schedule.to_yaml(s))


def test_schedule_is_init_then_iteration_two_shared_by_identical_ranks() -> None:
    s = schedule.from_run(_run())
    assert s.world_size == 2 and s.iteration == 2
    assert s.groups == {"0": [0, 1]}
    assert len(s.ranks) == 1 and s.ranks[0].ranks == [0, 1]
    init = s.ranks[0].init
    assert [e.label for e in init] == ["ddp.init.verify_params", "ddp.init.verify_params",
                                       "ddp.init.sync_params", "ddp.init.sync_params"]
    it = s.ranks[0].iteration
    assert [(e.op, e.label) for e in it] == [
        ("broadcast", "ddp.rebuild_buckets"), ("broadcast", "ddp.rebuild_buckets"),
        ("broadcast", "ddp.buffers"), ("broadcast", "ddp.buffers"), ("all_reduce", "ddp.bucket")]
    assert it[-1].shapes == ((244,),) and it[-1].dtypes == ("float32",)
    assert it[-1].at == "train.py:21"


def test_yaml_round_trip_is_exact_and_one_collective_per_line() -> None:
    s = schedule.from_run(_run())
    text = schedule.to_yaml(s)
    data = yaml.safe_load(text)
    assert data["format"] == "ddpdoctor-schedule" and data["version"] == 2
    assert data["iteration"] == 2 and data["groups"] == {"0": [0, 1]}
    entry = data["schedules"][0]["iteration"][-1]
    assert entry == {"group": "0", "op": "all_reduce", "label": "ddp.bucket",
                     "shapes": [[244]], "dtypes": ["float32"], "reduce_op": "SUM",
                     "at": "train.py:21"}
    assert data["schedules"][0]["iteration"][0]["root"] == 0
    assert sum(1 for line in text.splitlines() if line.startswith("  - {")) == 4 + 5
    back = _roundtrip(s)
    assert back == s
    assert schedule.compare(back, schedule.from_run(_run(iterations=5))) == []


def test_an_added_all_reduce_in_the_loop_is_reported_with_its_line() -> None:
    expected = _roundtrip(schedule.from_run(_run()))
    diff = schedule.compare(expected, schedule.from_run(_run(extra=True)))
    assert diff[0] == "ranks 0, 1:"
    assert diff[1] == "  iteration 2 #6: added all_reduce user float32[1]  (train.py:57)"
    assert len(diff) == 2


def test_a_changed_bucket_layout_is_a_reshape() -> None:
    expected = _roundtrip(schedule.from_run(_run(buckets=(244,))))
    diff = schedule.compare(expected, schedule.from_run(_run(buckets=(200,))))
    assert diff == ["ranks 0, 1:", "  iteration 2 #5: reshaped all_reduce ddp.bucket "
                                   "float32[244] -> float32[200]  (train.py:21)"]
    # One bucket became two: the first is reshaped, the second added.
    more = schedule.compare(expected, schedule.from_run(_run(buckets=(122, 122))))
    assert more == ["ranks 0, 1:",
                    "  iteration 2 #5: reshaped all_reduce ddp.bucket float32[244] -> "
                    "float32[122]  (train.py:21)",
                    "  iteration 2 #6: added all_reduce ddp.bucket float32[122]  (train.py:21)"]
    fewer = schedule.compare(_roundtrip(schedule.from_run(_run(buckets=(122, 122)))),
                             schedule.from_run(_run(buckets=(244,))))
    assert fewer[-1] == ("  iteration 2 #6: removed all_reduce ddp.bucket float32[122]  "
                         "(was train.py:21)")


def test_a_removed_collective_and_a_rank_that_differs_alone() -> None:
    bs = ranks(2)
    for b in bs:
        b.ddp_init().train(3)
    bs[0].trace.collectives = [c for c in bs[0].trace.collectives
                               if not (c.iteration == 2 and c.label == "ddp.buffers")]
    for b in bs:
        b.finish()
    diff = schedule.compare(schedule.from_run(_run()), schedule.from_run(make_run(*bs)))
    assert diff[0] == "rank 0:"
    assert diff[1].startswith("  iteration 2 #3: removed broadcast ddp.buffers float32[32]")
    assert len([line for line in diff if "removed" in line]) == 2
    assert "rank 1:" not in diff


def test_world_size_groups_and_a_shorter_run_are_differences() -> None:
    expected = schedule.from_run(_run())
    assert any(line.startswith("world size: 2 expected, 4")
               for line in schedule.compare(expected, schedule.from_run(_run(world=4))))
    short = schedule.compare(expected, schedule.from_run(_run(iterations=1)))
    assert "reached only iteration 1" in short[0]
    bs = ranks(2)
    for b in bs:
        b.new_group("1", [0, 1]).ddp_init().train(3).finish()
    grouped = schedule.compare(expected, schedule.from_run(make_run(*bs)))
    assert "group 1: added (ranks [0, 1])" in grouped


def test_runs_without_ddp_keep_everything_in_init() -> None:
    b = [TraceBuilder(r, 2) for r in range(2)]
    for x in b:
        x.user("broadcast", root=0).user("all_reduce").finish()
    s = schedule.from_run(make_run(*b))
    assert s.iteration is None and [e.op for e in s.ranks[0].init] == ["broadcast", "all_reduce"]
    assert s.ranks[0].iteration == []
    assert _roundtrip(s) == s


def test_a_max_steps_run_matches_a_longer_run_of_the_same_script() -> None:
    bs = healthy_ddp(iterations=2)
    for b in bs:
        b.trace.exit = {"kind": "exit", "status": "max_steps", "code": 0, "steps": 2}
    assert schedule.compare(schedule.from_run(_run(iterations=6)),
                            schedule.from_run(make_run(*bs))) == []


@pytest.mark.parametrize("text, message", [
    ("a: [", "not valid YAML"),
    ("- 1\n- 2\n", "not a ddpdoctor schedule"),
    ("format: other\n", "not a ddpdoctor schedule"),
    ("format: ddpdoctor-schedule\nversion: 99\n", "version 99"),
    ("format: ddpdoctor-schedule\nversion: 1\nschedules: [{ranks: [0], init: [{op: x}]}]\n",
     "missing 'group'"),
    ("format: ddpdoctor-schedule\nversion: 1\nschedules: [{ranks: [0], init: "
     "[{group: '0', op: x, label: y, shapes: [[a]]}]}]\n", "shapes must be lists of integers"),
    ("format: ddpdoctor-schedule\nversion: 1\nschedules: [{init: []}]\n", "needs a list of ranks"),
    ("format: ddpdoctor-schedule\nversion: 1\nworld_size: many\n", "bad world_size"),
])
def test_bad_schedule_files_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ScheduleError) as info:
        schedule.from_yaml(text, "s.yaml")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("s.yaml")


def test_load_and_save_errors(tmp_path) -> None:
    with pytest.raises(ScheduleError, match="cannot read"):
        schedule.load(tmp_path / "missing.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ScheduleError):
        schedule.load(tmp_path / "bin.yaml")
    with pytest.raises(ScheduleError, match="cannot write"):
        schedule.save(schedule.from_run(_run()), tmp_path / "no" / "such" / "dir.yaml")
    path = tmp_path / "ok.yaml"
    schedule.save(schedule.from_run(_run()), path)
    assert schedule.load(path) == _roundtrip(schedule.from_run(_run()))


def _extra_reduce(reduce_op: str) -> schedule.Schedule:
    bs = ranks(2)
    for b in bs:
        b.ddp_init()
        for _ in range(3):
            b.step()
            b.user("all_reduce", shapes=[[1]], reduce_op=reduce_op, line=57)
        b.finish()
    return schedule.from_run(make_run(*bs))


def test_a_changed_reduce_op_is_a_changed_schedule() -> None:
    """What must match between ranks (signature.match_key) is what a schedule compares: the
    same tensors with another reduce op is a change, named as one."""
    diff = schedule.compare(_roundtrip(_extra_reduce("SUM")), _extra_reduce("AVG"))
    assert "iteration 2 #6: all_reduce user float32[1]: reduce op SUM -> reduce op AVG  " \
        "(train.py:57)" in [line.strip() for line in diff], diff
    assert schedule.compare(_roundtrip(_extra_reduce("SUM")), _extra_reduce("SUM")) == []


def test_a_version_1_schedule_is_compared_without_reduce_ops_and_roots() -> None:
    """A file saved before entries held them (version 1) matches the same job today, and
    still sees a reshaped collective."""
    text = schedule.to_yaml(schedule.from_run(_run()))
    old = "\n".join(line.replace(", reduce_op: SUM", "").replace(", root: 0", "")
                     for line in text.splitlines()).replace("version: 2", "version: 1")
    assert "root" not in old and "reduce_op" not in old
    saved = schedule.from_yaml(old)
    assert saved.version == 1
    assert schedule.compare(saved, schedule.from_run(_run())) == []
    assert any("reshaped" in line
               for line in schedule.compare(saved, schedule.from_run(_run(buckets=(200,)))))
    # The same file read as version 2 would call every broadcast's root a change.
    assert schedule.compare(schedule.from_yaml(old.replace("version: 1", "version: 2")),
                            schedule.from_run(_run()))


def test_uneven_ops_compare_their_dtypes_not_their_sizes() -> None:
    """An all_to_all's per-rank sizes follow the data (the match key leaves them out): two runs
    with other splits have the same schedule; another dtype is a change."""
    def run(rows: int, dtype: str = "float32") -> schedule.Schedule:
        bs = ranks(2)
        for b in bs:
            b.user("all_to_all_single", shapes=[[rows]], dtypes=[dtype], line=40)
            b.finish()
        return schedule.from_run(make_run(*bs))

    assert schedule.compare(_roundtrip(run(8)), run(12)) == []
    assert schedule.compare(_roundtrip(run(8)), run(8, "float16"))
