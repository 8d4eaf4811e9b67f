"""``ddpdoctor.yaml``: defaults for ``run`` options; flags win; bad keys are one-line errors."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from ddpdoctor.cli import app, config
from ddpdoctor.cli.config import ConfigError
from ddpdoctor.cli.run import run_command

OPTIONS = config.options_of(run_command)


def test_torchrun_section_gives_torchrun_tokens() -> None:
    got = config.parse("torchrun:\n  nproc-per-node: 4\n  standalone: true\n"
                       "  no_python: false\n  rdzv_id: abc\n", OPTIONS)
    assert got == {"torchrun": ["--nproc-per-node", "4", "--standalone", "--rdzv_id", "abc"]}


def test_run_section_gives_parameter_values_in_either_spelling() -> None:
    got = config.parse("run:\n  cpu: true\n  max-steps: 2\n  hang_timeout: 20\n"
                       "  --json: r.json\n  launcher: python\n  junit: j.xml\n", OPTIONS)
    assert got == {"run": {"cpu": True, "max_steps": 2, "hang_timeout": 20.0,
                           "json_out": "r.json", "launcher": "python", "junit_out": "j.xml"}}
    assert config.parse("", OPTIONS) == {} and config.parse("run:\n", OPTIONS) == {}
    assert config.parse("run:\n  backend: null\n", OPTIONS) == {"run": {}}


@pytest.mark.parametrize("text, message", [
    ("run:\n  hang_timout: 3\n", "unknown key 'run.hang_timout' (did you mean 'hang-timeout'?)"),
    ("runn: {cpu: true}\n", "unknown key 'runn' (did you mean 'run'?)"),
    ("diff: {}\n", "unknown key 'diff'"),
    ("run:\n  zzz: 1\n", "unknown key 'run.zzz' (known: launcher"),
    ("torchrun:\n  nnodes: [1]\n", "torchrun.nnodes must be a string, a number or true"),
    ("run:\n  hang-timeout: abc\n", "run.hang-timeout must be a number, not 'abc'"),
    ("run:\n  max-steps: 2.5\n", "run.max-steps must be an integer"),
    ("run:\n  max-steps: true\n", "run.max-steps must be an integer"),
    ("run:\n  cpu: 1\n", "run.cpu must be true or false"),
    ("run:\n  launcher: mpirun\n", "run.launcher must be one of torchrun, python"),
    ("run:\n  backend: [gloo]\n", "run.backend must be a string"),
    ("run:\n  max-steps: 0\n", "run.max-steps must be at least 1"),
    ("run:\n  hang-timeout: 0.1\n", "run.hang-timeout must be at least 0.5"),
    ("run: [\n", "not valid YAML at line 2"),
    ("- cpu\n", "expected a mapping with a 'run' section"),
    ("run: 3\n", "'run' must be a mapping"),
])
def test_bad_config_is_one_line_naming_file_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.parse(text, OPTIONS, "ddpdoctor.yaml")
    assert message in str(info.value), str(info.value)
    assert str(info.value).startswith("ddpdoctor.yaml") and "\n" not in str(info.value)


def test_load_reads_the_working_directory(tmp_path) -> None:
    assert config.load(OPTIONS, tmp_path) == {}
    (tmp_path / "ddpdoctor.yaml").write_text("run:\n  cpu: true\n")
    assert config.load(OPTIONS, tmp_path) == {"run": {"cpu": True}}
    (tmp_path / "ddpdoctor.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not a text file"):
        config.load(OPTIONS, tmp_path)


def test_every_run_option_can_be_configured_and_nothing_else() -> None:
    """The file's keys are the command line's own options, with their types, minimums and
    the choices --help shows (declared once, in cli/run.py)."""
    command = typer.main.get_command(app)
    run = command.commands["run"]
    options = [p for p in run.params if p.param_type_name == "option" and p.name != "help"]
    assert {p.name for p in options} == {spec.name for spec in OPTIONS.values()}
    flags = {opt[2:] for p in options for opt in p.opts if opt.startswith("--")}
    assert flags == set(OPTIONS)
    assert OPTIONS["hang-timeout"] == config.OptionSpec("hang_timeout", "float", 0.5)
    assert OPTIONS["max-steps"] == config.OptionSpec("max_steps", "int", 1)
    assert OPTIONS["launcher"] == config.OptionSpec("launcher", "choice", None,
                                                    ("torchrun", "python"))
    assert (OPTIONS["cpu"].kind, OPTIONS["share-lines"].kind, OPTIONS["json"].kind) == (
        "bool", "bool", "str")


def test_cli_refuses_a_bad_config_with_exit_2(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddpdoctor.yaml").write_text("run:\n  max_step: 2\n")
    result = CliRunner().invoke(app, ["run", "train.py"])
    assert result.exit_code == 2
    assert "unknown key 'run.max_step' (did you mean 'max-steps'?)" in result.output
    assert "Traceback" not in result.output


def test_cli_takes_defaults_from_config_and_flags_win(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddpdoctor.yaml").write_text(
        "run:\n  cpu: true\n  max-steps: 3\n  backend: nccl\n")
    seen = {}

    def fake_prepare(opts):
        seen["opts"] = opts
        raise typer.Exit(0)

    monkeypatch.setattr("ddpdoctor.cli.run.prepare_run", fake_prepare)
    CliRunner().invoke(app, ["run", "--backend", "gloo", "--max-steps", "1", "x.py", "--a"])
    opts = seen["opts"]
    assert opts.cpu is True and opts.max_steps == 1 and opts.backend == "gloo"
    assert opts.script == "x.py" and opts.args == ["--a"]
    CliRunner().invoke(app, ["run", "x.py"])
    assert seen["opts"].max_steps == 3 and seen["opts"].backend == "nccl"
