"""The bench's in-process measurement runs against the package as it is (a renamed internal
once broke it silently: the bench is not run by CI), and what it measures is recorded."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_hot_path_measurement_runs_and_records_every_call() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("ddpdoctor_bench_overhead",
                                                      BENCH / "overhead.py")
        assert spec is not None and spec.loader is not None
        overhead = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = overhead  # its dataclasses look their module up
        spec.loader.exec_module(overhead)
    finally:
        sys.path.remove(str(BENCH))
    result = overhead.hot_path_us(n=400)
    # Recording does work the bare backend call does not: the wrapper is really in the path.
    assert 0 < result.plain_us < result.recorded_us
    assert result.cpu_us > 0 and result.recorded_wall_us > 0 and result.module_loop_us > 0


def _bench_module(name: str) -> object:
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"ddpdoctor_bench_{name}",
                                                      BENCH / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _arms_bench(name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                cost: Callable[[str, dict[str, str] | None, int], object],
                ) -> tuple[Any, Path, list[tuple[str, object]]]:
    """bench/<name>.py with its --before checkout made in ``tmp_path`` and every job faked by
    ``cost(kind, env, collectives)``: (the module, that checkout, each job's (kind, env))."""
    bench: Any = _bench_module(name)
    before = tmp_path / "src"
    before.mkdir()
    monkeypatch.setattr(bench, "checkout", lambda commit: before)
    seen: list[tuple[str, object]] = []

    def fake_job(kind: str, script: Path, args: list[str],
                 env: dict[str, str] | None = None) -> object:
        seen.append((kind, env))
        return cost(kind, env, int(args[args.index("--ops") + 1]))

    monkeypatch.setattr(bench.overhead, "job", fake_job)
    return bench, before, seen


def test_the_headline_is_the_median_of_per_unit_ratios_and_met_only_inside_its_range() -> None:
    whole = _bench_module("whole_job")
    overhead = sys.modules["overhead"]

    def job(step: float, cpu: float, others: float = 0.0, launcher: float = 0.3,
            steal: float = 0.0) -> object:
        ranks = [{"rank": r, "step_ms": step, "cpu_s": cpu / 2, "steps": 300} for r in (0, 1)]
        return overhead.JobResult(ranks, job_cpu_s=cpu + 5, wall_s=30.0,
                                  others_cpu_s=others * 30.0, steal_s=steal * 30.0,
                                  launcher_cpu_s=launcher)

    def unit(r: float, drift: float = 0.0, plain_first: bool = True) -> object:
        # four jobs in a row on a machine growing slower by ``drift`` a job
        times = [50 * (1 + drift * i) for i in range(4)]
        kinds = ["plain", "ddp", "ddp", "plain"] if plain_first else \
            ["ddp", "plain", "plain", "ddp"]
        jobs: dict[str, list] = {"plain": [], "ddp": []}
        for kind, t in zip(kinds, times):
            scale = r if kind == "ddp" else 1.0
            jobs[kind].append(job(t * scale, 20 * scale))
        return whole.Unit(tuple(jobs["plain"]), tuple(jobs["ddp"]), plain_first)

    units = [unit(r) for r in (1.0, 1.005, 1.008, 1.02)]
    step = whole.figures(units)[0]
    assert [round(x, 9) for x in step.ratios] == [1.0, 1.005, 1.008, 1.02]
    assert abs(step.median - 1.0065) < 1e-9
    assert step.quartiles[1] > 1.01 and step.met is False  # median inside, range not: NO
    quiet = whole.figures(units[:3])[0]
    assert quiet.met is True
    # A steady drift cancels out of a unit, not out of its neighbouring pairs.
    drifting = unit(1.0, drift=0.02)
    assert abs(drifting.ratio(lambda j: j.median("step_ms")) - 1.0) < 1e-9
    assert [round(x, 4) for x in drifting.neighbours(lambda j: j.median("step_ms"))] == \
        [round(1.02 / 1.0, 4), round(1.04 / 1.06, 4)]
    noisy = whole.Unit((job(50, 20, others=0.5), job(50, 20)), (job(50, 20), job(50, 20)))
    assert noisy.noisy and not units[0].noisy
    assert whole.own_cpu_per_minute(units) == [0.6] * 8  # 0.3 CPU-s in a 30 s job
    # Outside the steps (job CPU less the ranks' step CPU): each ddp job here used 20 * r
    # in its steps and 5 more, so ddpdoctor adds nothing once a job, whatever r...
    assert [round(x, 9) for x in whole.added_outside_steps(units)] == [0.0] * 4
    # ...and a launcher that costs 0.9 CPU-s more a job reads +0.90, ratios aside.
    fixed = whole.Unit((job(50, 20), job(50, 20)), (job(50, 20.9), job(50, 20.9)))
    fixed.doctor[0].ranks[0]["cpu_s"] = fixed.doctor[1].ranks[0]["cpu_s"] = 10.0
    fixed.doctor[0].ranks[1]["cpu_s"] = fixed.doctor[1].ranks[1]["cpu_s"] = 10.0
    assert [round(x, 9) for x in whole.added_outside_steps([fixed])] == [0.9]
    assert "| CPU of every process outside the steps, added per job | 5.0 s | 5.9 s | " \
        "+0.90 CPU-s |" in whole.tables([fixed])
    stolen = whole.Unit((job(50, 20, steal=0.25), job(50, 20)), (job(50, 20), job(50, 20)))
    assert stolen.steal_cores == 0.25 and not stolen.noisy  # shown, not a flag of its own
    text = whole.tables(units + [noisy, stolen])
    assert "| 5 | plain, ddp, ddp, plain |" in text and "| 0.50 | 0.00 | yes |" in text
    assert "| 6 | plain, ddp, ddp, plain |" in text and "| 0.00 | 0.25 |  |" in text
    assert "quiet units alone" in text
    assert "own process, CPU per job-minute" in text
    assert "4.4 M parameters, DDP's default buckets" in text  # the job issue 36 measured
    small = whole.tables(units, job=whole.JOBS["small"])
    assert "bucket_cap_mb=25" in small and "4.4 M" not in small
    assert whole.JOBS["issue"].args[-2:] == ("--bucket-cap-mb", "default")
    # An A/A run (plain torchrun in both arms) is labelled as one, with no launcher row.
    aa = whole.tables(units, aa=True)
    assert "| plain torchrun A | plain torchrun B |" in aa and "| 1 | A, B, B, A |" in aa
    assert "own process, CPU per job-minute" not in aa
    # Units of eight: each arm's jobs at the same mean position (a steady drift cancels).
    assert whole.order(4, True) == "abbaabba" and whole.order(4, False) == "baabbaab"
    for arm in "ab":
        assert sum(i for i, x in enumerate(whole.order(4, True)) if x == arm) == 14
    with pytest.raises(ValueError):
        whole.order(3, True)


def test_the_machine_cpu_reads_busy_and_steal_from_proc_stat(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """/proc/stat's first line: user nice system idle iowait irq softirq steal ..., in ticks;
    busy is user, nice, system, irq and softirq; steal is what the host gave its other
    guests."""
    _bench_module("whole_job")
    overhead: Any = sys.modules["overhead"]
    stat = tmp_path / "stat"
    stat.write_text("cpu  1000 10 200 5000 30 4 6 250 0 0\ncpu0 500 5 100 2500 15 2 3 125 0 0\n")
    real_open = open
    monkeypatch.setattr(overhead, "open", lambda path, *a, **k: real_open(
        stat if path == "/proc/stat" else path, *a, **k), raising=False)
    tick = os.sysconf("SC_CLK_TCK")
    assert overhead.machine_cpu() == ((1000 + 10 + 200 + 4 + 6) / tick, 250 / tick)
    stat.unlink()
    busy, steal = overhead.machine_cpu()
    assert busy != busy and steal != steal  # NaN where there is no such file


def test_copies_of_real_traces_name_their_own_rank_and_keep_collective_lines() -> None:
    real = _bench_module("real_traces")
    header = b'{"kind": "header", "format": "ddpdoctor-trace", "version": 7, "rank": 0}\n'
    group = (b'{"kind": "group", "t": 1.0, "group": "0", "ranks": [0, 1], "size": 2, '
             b'"group_rank": 0, "backend": "gloo"}\n')
    start = (b'{"kind": "process_start", "rank": 0, "local_rank": 0, "world_size": 2, '
             b'"env": {"RANK": "0", "WORLD_SIZE": "2"}}\n')
    import json

    assert json.loads(real._rewrite(header, 9, 16))["rank"] == 9
    g = json.loads(real._rewrite(group, 9, 16))
    assert g["ranks"] == list(range(16)) and g["size"] == 16 and g["group_rank"] == 9
    p = json.loads(real._rewrite(start, 9, 16))
    assert (p["rank"], p["world_size"], p["env"]["RANK"], p["env"]["WORLD_SIZE"]) == \
        (9, 16, "9", "16")
    assert all(line.startswith(real._NAMED) for line in (header, group, start))
    assert not b'{"id": 1, "kind": "collective"'.startswith(real._NAMED)


def test_the_launcher_bench_reads_cpu_and_the_rate_its_fake_ranks_achieved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``launcher_cost.py``: the launcher's CPU clock to the nanosecond (every thread), the
    collectives issued read back from the traces; one fake rank writes a real trace at its
    rate through the rank's own writer (its progress block beside it)."""
    cost, fake = _bench_module("launcher_cost"), _bench_module("fake_ranks")
    first = cost.cpu_seconds(os.getpid())  # type: ignore[attr-defined]
    sum(i * i for i in range(200_000))
    assert cost.cpu_seconds(os.getpid()) > first > 0  # type: ignore[attr-defined]
    monkeypatch.setenv("DDPDOCTOR_LOGDIR", str(tmp_path))

    class Started:
        def release(self) -> None:
            pass

    fake.rank_main(0, 2, 200.0, 0.5, Started())  # type: ignore[attr-defined]
    assert cost.issued(tmp_path) == 100  # type: ignore[attr-defined]
    assert (tmp_path / "rank-0.jsonl.progress").exists()


def test_the_whole_job_per_collective_figure_cancels_fixed_costs_in_any_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/per_op_whole_job.py: each arm's figure is (long job's CPU - short job's) over the
    collectives between them, per rank, whatever order a round runs its jobs in."""
    bench = _bench_module("per_op_whole_job")
    overhead = bench.overhead
    ran: list[tuple[str, int]] = []

    def fake_job(kind: str, script: Path, args: list[str],
                 env: dict[str, str] | None = None) -> object:
        n = int(args[args.index("--ops") + 1])
        ran.append((kind, n))
        per_op = 100e-6 if kind == overhead.PLAIN else 110e-6  # CPU-s per collective, 2 ranks
        start = 3.0 if kind == overhead.PLAIN else 4.5  # a fixed cost the difference cancels
        return overhead.JobResult([], start + n * per_op, wall_s=1.0, others_cpu_s=0.0)

    monkeypatch.setattr(overhead, "job", fake_job)
    arms = [("a", overhead.PLAIN, None), ("b", overhead.DOCTOR, None)]
    orders = set()
    for flip in range(4):
        ran.clear()
        got, others = bench.run_round(arms, 1000, 11000, flip)
        assert got == {"a": pytest.approx(50.0), "b": pytest.approx(55.0)} and others == 0.0
        assert sorted(ran) == sorted({(k, n) for k in (overhead.PLAIN, overhead.DOCTOR)
                                      for n in (1000, 11000)})
        orders.add(tuple(ran))
    assert len(orders) == 4  # each arm, short and long, first in turn


def test_the_whole_job_figure_gives_each_arm_against_plain_in_the_same_rounds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """bench/per_op_whole_job.py's table: per arm, the median of its per-round differences
    from plain torchrun, and from ddpdoctor run; --before runs that commit's src first on
    PYTHONPATH, --aa a second plain arm."""
    overhead: Any = _bench_module("per_op_whole_job").overhead

    def cost(kind: str, env: dict[str, str] | None, n: int) -> object:
        per_op = 100e-6 if kind == overhead.PLAIN else 112e-6 if env else 108e-6
        return overhead.JobResult([], 2.0 + n * per_op, wall_s=1.0, others_cpu_s=0.0)

    bench, before, seen = _arms_bench("per_op_whole_job", monkeypatch, tmp_path, cost)
    overhead = bench.overhead
    monkeypatch.setattr(sys, "argv", ["per_op_whole_job.py", "--rounds", "3", "--short", "1000",
                                      "--long", "11000", "--before", "abc1234", "--aa"])
    bench.main()
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in out.splitlines() if line.startswith("| ")}
    assert rows["ddpdoctor run"][2] == "**+4.0**" and rows["ddpdoctor run"][1] == "54.0"
    assert rows["ddpdoctor run, abc1234"][2] == "**+6.0**"
    assert rows["plain torchrun (A/A)"][2] == "**+0.0**"
    assert rows["ddpdoctor run"][3] == "—"  # 3 rounds allow no 95 % interval
    # the last column: each arm against ddpdoctor run in the same rounds
    assert rows["ddpdoctor run, abc1234"][-1].strip(" |") == "+2.0"
    assert rows["plain torchrun (A/A)"][-1].strip(" |") == "-4.0"
    assert rows["ddpdoctor run"][-1].strip(" |") == "—"
    assert "ddpdoctor run: too few rounds to tell" in out
    assert seen.count((overhead.DOCTOR, {"PYTHONPATH": str(before)})) == 6
    assert len(seen) == 24 and not before.exists()  # the extracted tree is removed


def test_a_bench_compiles_the_ddpdoctor_its_jobs_import_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/overhead.py: the ddpdoctor package on a job's PYTHONPATH gets its bytecode before
    the first ddpdoctor job (a user's install has it), and only once a bench."""
    overhead: Any = _bench_module("per_op_whole_job").overhead
    package = tmp_path / "ddpdoctor"
    package.mkdir()
    (package / "mod.py").write_text("X = 1\n")
    compiled: list[str] = []
    real = overhead.compileall.compile_dir
    monkeypatch.setattr(overhead.compileall, "compile_dir",
                        lambda path, **kw: compiled.append(path) or real(path, **kw))
    environ = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(tmp_path / "none")])}
    overhead.compile_sources(environ)
    assert [p.name for p in (package / "__pycache__").iterdir()][0].startswith("mod.")
    assert str(package) in compiled and str(tmp_path / "none" / "ddpdoctor") not in compiled
    compiled.clear()
    overhead.compile_sources(environ)
    assert compiled == []  # once a bench


def test_the_median_interval_is_the_binomial_order_statistics_and_decides_a_target() -> None:
    """bench/overhead.py: a 95 % interval of a median from n rounds is the k-th least and
    greatest values (n = 12: the 3rd and the 10th; n = 40: the 14th and the 27th); under 6
    rounds there is none; a target is met only when the whole interval is at or under it."""
    overhead: Any = _bench_module("per_op_whole_job").overhead
    values = [float(v) for v in range(40, 0, -1)]  # 40..1, unsorted on purpose
    assert overhead.median_interval(values[-12:]) == (3.0, 10.0)
    assert overhead.median_interval(values) == (14.0, 27.0)
    assert overhead.median_interval(values[-6:]) == (1.0, 6.0)
    assert overhead.median_interval(values[-5:]) is None
    assert overhead.median_interval(values[-5:], level=0.9) == (1.0, 5.0)
    assert overhead.against_target((3.0, 8.0), 8.0) == "met"
    assert overhead.against_target((3.0, 8.5), 8.0) == "not resolved"
    assert overhead.against_target((8.1, 12.0), 8.0) == "not met"
    assert overhead.against_target(None, 8.0) == "too few rounds to tell"


def test_the_floor_arms_run_ddpdoctor_with_a_stand_in_hot_path(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/hot_path_floor.py: --hot-paths adds a ddpdoctor arm per stand-in named, naming
    it in the environment (an unknown name is refused); the floor keeps one entry per call
    and returns the backend's own result; an unknown variant stops the job with a message."""
    floors: Any = _bench_module("hot_path_floor")
    overhead: Any = _bench_module("per_op_whole_job").overhead
    got = overhead.arms(None, None, aa=True,
                        stand_ins=overhead.hot_paths("off, floor,lean"))
    assert [(kind, env) for _, kind, env in got[2:5]] == [
        (overhead.DOCTOR, {floors.VARIANT_ENV: "off"}),
        (overhead.DOCTOR, {floors.VARIANT_ENV: "floor"}),
        (overhead.DOCTOR, {floors.VARIANT_ENV: "lean"})]
    assert got[-1][1] == overhead.PLAIN and len(got) == 6
    assert len(overhead.arms(None, None, aa=False)) == 2
    for bad in ("fast", "full", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="unknown hot path"):
            overhead.hot_paths(bad)

    class Backend:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def allreduce(self, *args: object) -> str:
            self.calls.append(args)
            return "work"

    class Group:
        _inner = Backend()

    issue = floors.floor_issue(Group)

    def user_step() -> object:  # frame 2 for the floor, as torch's all_reduce would be
        return (lambda: issue("all_reduce", "allreduce", ("t", "o"), None, None, None, None,
                              False))()

    assert [user_step() for _ in range(3)] == ["work"] * 3
    assert Group._inner.calls == [("t", "o")] * 3
    with pytest.raises(SystemExit, match="unknown hot-path variant 'fast'"):
        floors.use("fast")


def test_what_the_in_job_breakdowns_switch_off_still_exists() -> None:
    """bench/breakdown.py and bench/parts_alone.py replace parts of the recording by name (run
    by hand, never by CI): a renamed part would make them time the wrong thing."""
    from ddpdoctor.runtime import pg_wrapper
    from ddpdoctor.runtime.labels import StackLabeler
    from ddpdoctor.runtime.recorder import Recorder
    from ddpdoctor.runtime.writer import TraceWriter

    for owner, name in [(Recorder, "learn"), (StackLabeler, "place_id"),
                        (pg_wrapper._Issuer, "issue")]:
        assert callable(getattr(owner, name)), f"{owner.__name__}.{name}"
    assert "write_at" in TraceWriter.__annotations__  # a closure each writer makes
    assert {"calls", "write_at", "place_id"} <= set(pg_wrapper._Issuer.__slots__)
    assert {"_issuer", "_issue"} <= set(  # instance attributes the constructor sets
        pg_wrapper.RecordingProcessGroup.__init__.__code__.co_names)
    assert isinstance(pg_wrapper.RecordingProcessGroup._enabled, property)
    from ddpdoctor.runtime import writer
    assert isinstance(writer._is_success_quiet, bool) and callable(writer.use_is_success)


def test_the_thread_split_gives_each_arm_by_thread_and_against_plain(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """bench/thread_split.py: per arm, the medians of each rank's process CPU per collective
    and its split (training thread, ddpdoctor's threads, the rest), and the process figure
    less plain's; the --before arm runs that commit's src first on PYTHONPATH."""
    overhead: Any = _bench_module("thread_split").overhead

    def cost(kind: str, env: dict[str, str] | None, n: int) -> object:
        added = 0.0 if kind == overhead.PLAIN else 12.0 if env else 10.0
        ranks = [{"rank": r, "cpu_us": 100.0 + added + r,
                  "split_us": {"main": 40.0 + added / 2, "ddpdoctor": added / 2,
                               "gloo": 60.0 + r}} for r in (0, 1)]
        return overhead.JobResult(ranks, 1.0)

    bench, before, seen = _arms_bench("thread_split", monkeypatch, tmp_path, cost)
    overhead = bench.overhead
    monkeypatch.setattr(sys, "argv", ["thread_split.py", "--rounds", "2", "--before", "abc1234"])
    bench.main()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert rows["plain torchrun"][-1].strip(" |") == "+0.0"
    assert rows["ddpdoctor run"][-1].strip(" |") == "+10.0"
    assert rows["ddpdoctor run, abc1234"][-1].strip(" |") == "+12.0"
    assert rows["ddpdoctor run"][1].startswith("110.5 ") and \
        rows["ddpdoctor run"][3].startswith("5.0 ")
    # Paired by round: each arm's mean over its ranks less plain's, for process and thread.
    assert rows["ddpdoctor run, paired"][1:] == ["+10.0 (+10.0 to +10.0)",
                                                 "+5.0 (+5.0 to +5.0) |"]
    assert seen.count((overhead.DOCTOR, {"PYTHONPATH": str(before)})) == 2
    assert len(seen) == 6 and not before.exists()  # the extracted tree is removed


def test_the_lean_stand_in_walks_the_callers_path_and_returns_the_backends_work() -> None:
    """bench/hot_path_floor.py's lean variant: the recording's work per collective in one
    function; it asks the labeler for the caller's path (frame 2, as torch's all_reduce is),
    asks the previous Work whether it completed, and returns the backend's own Work."""
    import torch

    floors: Any = _bench_module("hot_path_floor")

    class Work:
        asked = 0

        def is_completed(self) -> bool:
            Work.asked += 1
            return True

        def is_success(self) -> bool:
            return True

    class Backend:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def allreduce(self, *args: object) -> Work:
            self.calls.append(args)
            return Work()

    class Labeler:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def place_id(self, frame: Any) -> int:
            self.seen.append(frame.f_code.co_name)
            return 7

    class Recorder:
        labeler = Labeler()

    class Group:
        _inner = Backend()
        _recorder = Recorder()

    issue = floors.lean_issue(Group)
    tensor = torch.ones(2)

    def user_step() -> object:
        def all_reduce() -> object:  # frame 1 is the group's method in the job
            return (lambda: issue("all_reduce", "allreduce", ([tensor], "o"), [tensor],
                                  "sum", None, None, False))()
        return all_reduce()

    works = [user_step() for _ in range(3)]
    assert all(isinstance(w, Work) for w in works) and len(set(map(id, works))) == 3
    assert Group._inner.calls == [([tensor], "o")] * 3
    assert Recorder.labeler.seen == ["all_reduce"] * 3
    assert Work.asked == 2  # the first and second Works, when the next collective came



def _branchy(flag: bool) -> int:
    if flag:
        value = 1
    else:
        value = sum(range(5)) + len(str(flag)) * 2
    return value


def test_the_code_count_gives_what_a_call_ran_and_no_more() -> None:
    """bench/hot_path_code.py: per code object, the instructions one call executed, their
    bytes and 64-byte lines; the branch not taken is not counted."""
    import dis

    code_count: Any = _bench_module("hot_path_code")
    ours = lambda code: code is _branchy.__code__  # noqa: E731
    short = code_count.executed(lambda: _branchy(True), ours=ours)
    long = code_count.executed(lambda: _branchy(False), ours=ours)
    assert list(short) == list(long) == ["test_bench_hot_path.py:_branchy"]
    (ins, size, lines), (ins_long, size_long, _) = short.popitem()[1], long.popitem()[1]
    every = list(dis.get_instructions(_branchy))
    assert 0 < ins < ins_long < len(every)
    assert 0 < size < size_long <= len(_branchy.__code__.co_code)
    assert -(-size // code_count.LINE) <= lines <= 2 * ins  # each instruction in one line or two
    assert code_count.executed(lambda: _branchy(True), trace=False, ours=ours) == {}
    table = code_count.table({"this": {"full": {"a.py:f": [10, 40, 1], "b.py:g": [5, 20, 1]},
                                       "lean": {"a.py:h": [3, 12, 1]}}})
    assert "| this | full | 15 | 60 | 2 |" in table and "| this | lean | 3 | 12 | 1 |" in table
    assert "| a.py:f | 10 | 40 | 1 |" in table


def test_the_fixed_cost_parts_start_ddpdoctor_as_a_job_would(tmp_path: Path) -> None:
    fixed: Any = _bench_module("fixed_costs")
    base = dict(os.environ, PYTHONPATH=str(BENCH.parent / "src"))
    found = {p.key: p for p in fixed.parts(base, 2)}
    for key in ("rank", "agent"):
        (tmp_path / key).mkdir()
        plain, doctor = found[key].measure(tmp_path / key)
        assert 0 < plain and 0 < doctor
    assert list((tmp_path / "rank").glob("*/rank-0*.jsonl")), "the process was no rank"
    # Both arms import what the boot imports and torch would anyway; ddpdoctor's own never.
    shared = fixed.shared_with_torch(base, fixed.rank_env(base, str(tmp_path), 2, True))
    assert "subprocess" in shared and "socket" in shared
    assert not [m for m in shared if m.startswith(("ddpdoctor", "sitecustomize"))]
    assert not list((tmp_path / "agent").glob("*/rank-*.jsonl"))
    plain, patches = found["patches"].measure(tmp_path)
    assert plain is None and 0 < patches < 5
    plain, agent_patches = found["agent-patches"].measure(tmp_path)
    assert plain is None and 0 < agent_patches < 5
    plain, helper = found["helper"].measure(tmp_path)
    assert plain is None and 0 < helper < 5
    assert (tmp_path / "stderr-tail.txt").stat().st_size == fixed.TAIL_INPUT
    plain, quick = found["agent-end"].measure(tmp_path)  # two torchruns of one worker each
    assert 0 < plain and 0 < quick and (tmp_path / "worker.py").exists()
    # Each part counts as often as a job has it: a rank's once per rank, the agent's once.
    compared = ("rank", "agent", "agent-end")
    figures = [fixed.Figure(p, [0.010] * 3 if p.key in compared else [], [0.030] * 3)
               for p in fixed.parts(base, 4)]
    assert [f.part.per_job(4) for f in figures] == [4, 1, 4, 1, 4, 1, 1]
    assert fixed.per_job_sum(figures, 4) == pytest.approx(
        4 * 0.020 + 0.020 + 4 * 0.030 + 0.030 + 4 * 0.030 + 0.030 + 0.020)


def test_the_rank_phases_are_what_each_reading_grew_by() -> None:
    phases: Any = _bench_module("rank_phases")
    readings = [["start", 0.05, 0.01, 3, 10, 100.0], ["import torch", 1.45, 0.15, 8, 70, 101.8]]
    got = phases.phases(readings)
    assert [name for name, _ in got] == ["start", "import torch"]
    assert got[0][1]["user"] == 0.05 and got[0][1]["wall"] == 0.0
    assert got[1][1] == pytest.approx({"user": 1.40, "sys": 0.14, "vcsw": 5, "ivcsw": 60,
                                       "wall": 1.8})
    assert "import torch" in phases.RANK_SCRIPT and "{steps} steps" in phases.RANK_SCRIPT
