"""torchrun's command line after ``ddpdoctor run``: read with torchrun's own parser, passed on
verbatim, ddpdoctor's own options told apart (no processes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddpdoctor.cli import split_run_args
from ddpdoctor.launch import torchrun
from ddpdoctor.launch.command import (
    build_command,
    build_env,
    default_nproc,
    gpu_count_word,
    lone_rank,
)
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.options import RunOptions, check_options
from ddpdoctor.runtime import env as rank_env

LINES = [
    # pytorch/examples distributed/ddp-tutorial-series/run_example.sh
    ("--nnodes=1 --nproc_per_node=2 --rdzv_id=101 --rdzv_endpoint=localhost:5972 example.py",
     ["--nnodes=1", "--nproc_per_node=2", "--rdzv_id=101", "--rdzv_endpoint=localhost:5972"],
     "example.py", []),
    # pytorch/examples distributed/minGPT-ddp/run_example.sh
    ("--standalone --nproc_per_node=16 main.py", ["--standalone", "--nproc_per_node=16"],
     "main.py", []),
    ("--nproc-per-node auto --rdzv-conf timeout=60 --tee 3 --redirects 3 --log-dir /tmp/tl "
     "--local-ranks-filter 0 --monitor-interval 0.5 --local-addr 127.0.0.1 t.py 50 10",
     ["--nproc-per-node", "auto", "--rdzv-conf", "timeout=60", "--tee", "3", "--redirects",
      "3", "--log-dir", "/tmp/tl", "--local-ranks-filter", "0", "--monitor-interval", "0.5",
      "--local-addr", "127.0.0.1"], "t.py", ["50", "10"]),
    ("-r3 -t3 --no-python python t.py", ["-r3", "-t3", "--no-python"], "python", ["t.py"]),
    ("--run-path t.py --hang-timeout 9", ["--run-path"], "t.py", ["--hang-timeout", "9"]),
]


@pytest.mark.parametrize("line, tokens, script, args", LINES)
def test_torchrun_lines_are_sorted_from_ddpdoctors_options(line: str, tokens: list[str],
                                                           script: str, args: list[str]) -> None:
    argv = ["run", "--hang-timeout", "7", "--cpu", *line.split()]
    typer_argv, torchrun_args = split_run_args(argv)
    assert torchrun_args == tokens
    assert typer_argv == ["run", "--hang-timeout", "7", "--cpu", "--", script, *args]
    read = torchrun.read(torchrun_args, script, args)
    assert read.values.training_script == script


def test_the_command_passes_torchrun_options_through_and_adds_only_defaults() -> None:
    opts = RunOptions(script="main.py", torchrun_args=["--standalone", "--nproc_per_node=3"])
    check_options(opts)
    cmd = build_command(opts)
    assert cmd[3:] == ["--standalone", "--nproc_per_node=3", "main.py"]
    plain = build_command(RunOptions(script="t.py", args=["--lr", "1"]))
    assert plain[3] == "--nproc-per-node" and "--master-port" in plain
    assert plain[-3:] == ["t.py", "--lr", "1"]


@pytest.mark.parametrize("visible, count", [("0", 1), ("0,1,2", 3), ("", 2), ("-1", 2),
                                            ("1,-1,0", 1), ("GPU-f250eded", 1)])
def test_the_default_processes_per_node_are_the_visible_gpus(
        monkeypatch: pytest.MonkeyPatch, visible: str, count: int) -> None:
    # An empty CUDA_VISIBLE_DEVICES hides every GPU: it once fell through to the driver's count.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    assert default_nproc() == count
    opts = RunOptions(script="t.py")
    assert lone_rank(opts) == (count == 1)
    assert not lone_rank(RunOptions(script="t.py", torchrun_args=["--nproc-per-node", "1"]))
    assert not lone_rank(RunOptions(script="t.py", torchrun_args=["--nnodes", "2"]))


@pytest.mark.parametrize("word, ranks", [("gpu", 2), ("auto", 2), ("xpu", 2), ("cpu", None),
                                         (None, 2)])
def test_cpu_mode_runs_a_number_of_ranks_where_the_line_counts_accelerators(
        word: str | None, ranks: int | None) -> None:
    # The DDP tutorial's torchrun line says --nproc_per_node=gpu: under --cpu torchrun itself
    # stopped ("Cuda is not available") and the report blamed the script.
    line = ["--standalone"] + ([f"--nproc_per_node={word}"] if word else [])
    opts = RunOptions(script="main.py", args=["5", "2"], torchrun_args=line, cpu=True)
    check_options(opts)
    cmd = build_command(opts)
    env = build_env(opts, Path("/tmp/logs"), "r")
    if word == "cpu":  # one rank per core, as torchrun counts them, each with its device
        assert cmd[3:] == line + ["main.py", "5", "2"] and gpu_count_word(opts) is None
        assert env[rank_env.CPU_DEVICES] == str(os.cpu_count())
        return
    assert env[rank_env.CPU_DEVICES] == str(ranks)
    assert gpu_count_word(opts) == word
    if word is None:  # ddpdoctor's default, given first
        assert cmd[3:] == ["--nproc-per-node", str(ranks), *line, "main.py", "5", "2"]
        return
    assert cmd[-5:] == ["--nproc-per-node", str(ranks), "main.py", "5", "2"]
    on_gpus = RunOptions(script="main.py", torchrun_args=line)  # without --cpu: torchrun's
    assert build_command(on_gpus)[3:] == line + ["main.py"] and gpu_count_word(on_gpus) is None


@pytest.mark.parametrize("argv, message", [
    (["run", "--nprocs-per-node", "2", "t.py"],
     r"unknown option --nprocs-per-node \(did you mean --nproc-per-node\?\)"),
    (["run", "--hang-timout", "5", "t.py"],
     r"unknown option --hang-timout \(did you mean --hang-timeout\?\)"),
    (["run", "--nproc", "2", "t.py"], "ambiguous option --nproc: it begins --nproc-per-node"),
    (["run", "--nproc-per-node", "zero", "t.py"], "--nproc-per-node must be a number"),
    (["run", "--launcher", "python", "--standalone", "t.py"], "no meaning with --launcher"),
])
def test_bad_torchrun_options_are_one_line_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        typer_argv, tokens = split_run_args(argv)
        launcher = "python" if "python" in argv else "torchrun"
        check_options(RunOptions(script="t.py", torchrun_args=tokens, launcher=launcher))


def test_the_nodes_of_a_multi_node_job_share_one_run_id() -> None:
    def run_id(node: int) -> str | None:
        return torchrun.read(["--nnodes=2", f"--node-rank={node}", "--master-addr=10.0.0.1",
                              "--master-port=29400"], "t.py", []).run_id()

    assert run_id(0) == run_id(1) is not None
    assert torchrun.read(["--nproc-per-node=2"], "t.py", []).run_id() is None
    c10d = [torchrun.read(["--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1",
                           "--rdzv-id=job7"], "t.py", []).run_id() for _ in range(2)]
    assert c10d[0] == c10d[1] is not None


@pytest.mark.parametrize("rest, typer_tail", [
    # After --, a .py file is still the script (run under torchrun), as it always was.
    (["--", "t.py", "--lr", "1"], ["--", "t.py", "--lr", "1"]),
    # Anything else is the user's own launch command, run as it is.
    (["--", "accelerate", "launch", "--num_processes", "2", "t.py"],
     ["--launcher", "command", "--", "accelerate", "launch", "--num_processes", "2", "t.py"]),
    (["--", "srun", "python", "t.py"], ["--launcher", "command", "--", "srun", "python", "t.py"]),
    (["--", "bash", "launch.sh"], ["--launcher", "command", "--", "bash", "launch.sh"]),
])
def test_a_launch_command_after_the_double_dash(rest: list[str], typer_tail: list[str]) -> None:
    typer_argv, torchrun_args = split_run_args(["run", "--hang-timeout", "7", *rest])
    assert typer_argv == ["run", "--hang-timeout", "7", *typer_tail] and torchrun_args == []
    if typer_tail[0] == "--launcher":
        opts = RunOptions(script=typer_tail[3], args=typer_tail[4:], launcher="command")
        check_options(opts)
        assert build_command(opts) == typer_tail[3:]


def test_torchrun_options_before_a_launch_command_are_refused() -> None:
    with pytest.raises(UsageError, match="torchrun option"):
        split_run_args(["run", "--nproc-per-node", "2", "--", "accelerate", "launch", "t.py"])


CACHE_LINES = [line.split() for line, *_ in LINES] + [
    "--nnodes 1:4 --node-rank 1 --master-addr h --master-port 29600 --max-restarts 2 t.py".split(),
    "--rdzv-backend c10d --rdzv-endpoint host:29400 --rdzv-id job --standalone -m pkg.mod".split(),
    "--start-method fork --role trainer --shutdown-timeout 5 --virtual-local-rank t.py".split(),
    ["--master-port", "not-a-number", "t.py"],
    ["--start-method", "teleport", "t.py"],
    ["--nproc-per-node", "2"],
]


def _read_with(parser_of: object, argv: list[str]) -> object:
    try:
        return vars(parser_of.parse_args(argv))  # type: ignore[attr-defined]
    except UsageError as exc:
        return ("error", str(exc).split(":")[0])


@pytest.mark.parametrize("pet", [{}, {"PET_NPROC_PER_NODE": "3", "PET_STANDALONE": "1",
                                      "PET_MASTER_PORT": "29999", "PET_NNODES": "2"}])
def test_the_cached_torchrun_parser_reads_every_line_as_torchrun_does(
        pet: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher reads torchrun's options with a parser rebuilt from a cached description
    (no torch import); the first run describes the real one. Both read alike, PET_* included."""
    from ddpdoctor.launch import torchrun_cache
    from ddpdoctor.runtime import torch_internals

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name, value in pet.items():
        monkeypatch.setenv(name, value)
    first = torchrun_cache.parser()  # describes the real parser and writes the cache
    cached = list((tmp_path / "ddpdoctor").glob("torchrun-options-*.json"))
    assert len(cached) == 1
    rebuilt = torchrun_cache.parser()  # read from the file
    real = torch_internals.torchrun_parser()
    table = torch_internals.parser_options
    assert {k: v.nargs != 0 for k, v in table(rebuilt).items()} == \
        {k: v.nargs != 0 for k, v in table(real).items()}
    for argv in CACHE_LINES:
        expected = _read_with(torchrun._raising(real), argv)
        assert _read_with(torchrun._raising(rebuilt), argv) == expected, argv
        assert _read_with(torchrun._raising(first), argv) == expected, argv
    with pytest.raises(torchrun_cache.NeedsTorch):
        rebuilt.parse_args(["--help"])


def test_an_unreadable_torchrun_cache_falls_back_to_torchs_parser(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.launch import torchrun_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    torchrun_cache.parser()
    (path,) = (tmp_path / "ddpdoctor").glob("torchrun-options-*.json")
    path.write_text('[{"options": ["--x"]')  # cut short
    assert vars(torchrun_cache.parser().parse_args(["--nnodes", "2", "t.py"]))["nnodes"] == "2"
    assert path.read_text().startswith("[{") and len(path.read_text()) > 100  # written again
    os.chmod(tmp_path / "ddpdoctor", 0o500)  # read-only: the real parser, nothing raised
    try:
        path.unlink(missing_ok=True) if os.access(path.parent, os.W_OK) else None
        assert torchrun_cache.parser().parse_args(["t.py"]).training_script == "t.py"
    finally:
        os.chmod(tmp_path / "ddpdoctor", 0o700)


@pytest.mark.parametrize("abbreviation", ["--nproc-per-nod", "--nproc_per", "--standal"])
def test_torchruns_own_abbreviations_are_accepted_as_torchrun_accepts_them(
        abbreviation: str) -> None:
    """torchrun's parser (argparse) takes a unique prefix of a long option: so does run."""
    argv = ["run", abbreviation, *([] if "standal" in abbreviation else ["3"]), "t.py"]
    typer_argv, tokens = split_run_args(argv)
    assert typer_argv == ["run", "--", "t.py"] and tokens == argv[1:-1]
    opts = RunOptions(script="t.py", torchrun_args=tokens)
    check_options(opts)
    if "standal" in abbreviation:
        assert opts.torchrun.values.standalone
    else:
        assert str(opts.torchrun.values.nproc_per_node) == "3"


def test_a_prefix_of_ddpdoctors_own_option_is_not_taken_for_torchruns() -> None:
    with pytest.raises(UsageError, match="unknown option --max"):
        split_run_args(["run", "--max", "2", "t.py"])


@pytest.mark.parametrize("installed, refused", [("2.6.0+cu124", True), ("2.7.1", False),
                                                ("2.13.0+cpu", False)])
def test_flight_recorder_on_gloo_is_refused_before_the_run_where_torch_keeps_nothing(
        monkeypatch: pytest.MonkeyPatch, installed: str, refused: bool) -> None:
    import importlib.metadata

    from ddpdoctor.launch.command import check_flight_recorder

    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    opts = RunOptions(script="t.py", cpu=True, flight_recorder=True)
    if refused:
        with pytest.raises(UsageError, match="keeps nothing of gloo groups on torch 2.6.0"):
            check_flight_recorder(opts)
    else:
        check_flight_recorder(opts)
    check_flight_recorder(RunOptions(script="t.py", cpu=True))  # not asked: nothing to check
