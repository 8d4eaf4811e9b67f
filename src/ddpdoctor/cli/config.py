"""``ddpdoctor.yaml``: defaults for ``ddpdoctor run`` options, read from the working directory.

The file holds up to two mappings. ``run``: ``run``'s own long options without the dashes
(``hang-timeout`` or ``hang_timeout``); ``torchrun``: torchrun options, passed to torchrun
before those of the command line (``true`` for a flag; torchrun's parser checks them when the
job starts). Options given on the command line win::

    # ddpdoctor.yaml
    run:
      cpu: true
      max-steps: 2
      hang-timeout: 20
      junit: ddpdoctor-junit.xml
    torchrun:
      nproc-per-node: 4
      standalone: true

Unknown keys, values of the wrong type and malformed YAML are refused with one line naming
the file and the key (``ddpdoctor`` then exits with code 2). Read with ``yaml.safe_load``.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from ddpdoctor.analysis import yamlfile
from ddpdoctor.runtime.env import Launcher

FILENAME = "ddpdoctor.yaml"
SECTIONS = ("run", "torchrun")

# Option (as spelled on the command line, without "--") -> (parameter name, value type).
RUN_OPTIONS: dict[str, tuple[str, str]] = {
    "launcher": ("launcher", "launcher"),
    "logdir": ("logdir", "str"),
    "backend": ("backend", "str"),
    "hang-timeout": ("hang_timeout", "float"),
    "stuck-timeout": ("stuck_timeout", "float"),
    "grace": ("grace", "float"),
    "json": ("json_out", "str"),
    "cpu": ("cpu", "bool"),
    "max-steps": ("max_steps", "int"),
    "epoch-steps": ("epoch_steps", "int"),
    "max-trace-mb": ("max_trace_mb", "float"),
    "junit": ("junit_out", "str"),
    "markdown": ("markdown_out", "str"),
    "expect-schedule": ("expect_schedule", "str"),
    "flight-recorder": ("flight_recorder", "bool"),
    "record-nccl": ("record_nccl", "bool"),
    "timeline": ("timeline_out", "str"),
    "share-lines": ("share_lines", "bool"),
    "verbose": ("verbose", "bool"),
}
LAUNCHERS = (Launcher.TORCHRUN.value, Launcher.PYTHON.value)
# Lower bounds the command line enforces too (checked here to name the file in the error).
MINIMUM: dict[str, float] = {"hang-timeout": 0.5, "stuck-timeout": 0.5,
                             "grace": 0.0, "max-steps": 1, "epoch-steps": 1,
                             "max-trace-mb": 0.0}


class ConfigError(Exception):
    """A ``ddpdoctor.yaml`` that cannot be used; the message is one line."""


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"


def _convert(value: Any, kind: str, where: str) -> Any:
    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, not {value!r}")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be an integer, not {value!r}")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where} must be a number, not {value!r}")
    if kind == "launcher":
        if value in LAUNCHERS:
            return Launcher(value)
        raise ConfigError(f"{where} must be one of {', '.join(LAUNCHERS)}, not {value!r}")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where} must be a string, not {value!r}")


def _torchrun_tokens(body: dict, source: str) -> list[str]:
    """The ``torchrun`` section as command-line tokens: ``--key value``, ``--key`` for true."""
    tokens: list[str] = []
    for raw_key, value in body.items():
        key = str(raw_key).lstrip("-")
        where = f"{source}: torchrun.{raw_key}"
        if value is None or value is False:
            continue
        if value is True:
            tokens.append(f"--{key}")
        elif isinstance(value, (str, int, float)):
            tokens += [f"--{key}", str(value)]
        else:
            raise ConfigError(f"{where} must be a string, a number or true, not {value!r}")
    return tokens


def parse(text: str, source: str = FILENAME) -> dict[str, Any]:
    """Validate a config document; returns ``{"run": {parameter name: value}, "torchrun":
    [tokens]}`` (sections that are present)."""
    try:
        data = yamlfile.load(text, source)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'run' section, e.g. "
                          f"'run: {{cpu: true}}'")
    out: dict[str, Any] = {}
    for section, body in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"{source}: unknown key '{section}'"
                              f"{_suggest(str(section), list(SECTIONS))}")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: '{section}' must be a mapping of option: value")
        if section == "torchrun":
            out[section] = _torchrun_tokens(body, source)
            continue
        values: dict[str, Any] = {}
        known = list(RUN_OPTIONS)
        for raw_key, value in body.items():
            key = str(raw_key).replace("_", "-")
            if key.startswith("--"):
                key = key[2:]
            if key not in RUN_OPTIONS:
                raise ConfigError(f"{source}: unknown key '{section}.{raw_key}'"
                                  f"{_suggest(key, known)}")
            name, kind = RUN_OPTIONS[key]
            if value is not None:
                where = f"{source}: {section}.{raw_key}"
                value = _convert(value, kind, where)
                if key in MINIMUM and value < MINIMUM[key]:
                    raise ConfigError(f"{where} must be at least {MINIMUM[key]:g}, not {value!r}")
                values[name] = value
        out[section] = values
    return out


def load(directory: str | Path | None = None) -> dict[str, Any]:
    """Read ``ddpdoctor.yaml`` from ``directory`` (the working directory); {} without one."""
    path = Path(directory or Path.cwd()) / FILENAME
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None
    return parse(text, str(path))
