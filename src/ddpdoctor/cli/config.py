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
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from ddpdoctor.analysis import yamlfile

FILENAME = "ddpdoctor.yaml"
SECTIONS = ("run", "torchrun")


@dataclass(frozen=True)
class OptionSpec:
    """A ``run`` option as the command line declares it: the parameter it sets, the kind of
    value (bool, int, float, choice, str, or list of str for a repeatable option), its least
    value, the choices a user gives."""

    name: str
    kind: str
    minimum: float | None = None
    choices: tuple[str, ...] = ()


def options_of(command: Callable[..., Any]) -> dict[str, OptionSpec]:
    """Every option of ``command`` (``ddpdoctor run``'s function, cli/run.py), keyed by its
    spelling without the dashes: the file takes what the command line declares, declared once
    there (its types and minimums; the choices its metavar shows, ``torchrun|python``)."""
    hints = typing.get_type_hints(command)
    out: dict[str, OptionSpec] = {}
    for name, param in inspect.signature(command).parameters.items():
        info = param.default
        if not isinstance(info, typer.models.OptionInfo):
            continue
        flag = next(d[2:].split("/")[0] for d in info.param_decls or () if d.startswith("--"))
        hint = hints.get(name, str)
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) is not None and len(args) == 1:  # Optional[X]
            hint = args[0]
        kind = {bool: "bool", int: "int", float: "float"}.get(hint, "str")
        if typing.get_origin(hint) is list:  # a repeatable option: a list in the file
            kind = "list"
        choices: tuple[str, ...] = ()
        if isinstance(hint, type) and issubclass(hint, Enum):
            kind = "choice"
            choices = tuple(info.metavar.split("|")) if info.metavar else \
                tuple(str(e.value) for e in hint)
        out[flag] = OptionSpec(name, kind, info.min, choices)
    return out


class ConfigError(Exception):
    """A ``ddpdoctor.yaml`` that cannot be used; the message is one line."""


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"


def _convert(value: Any, kind: str, where: str, choices: tuple[str, ...] = ()) -> Any:
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
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        return [_convert(item, "str", where) for item in items]
    if kind == "choice":
        if value in choices:
            return value
        raise ConfigError(f"{where} must be one of {', '.join(choices)}, not {value!r}")
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


def parse(text: str, options: dict[str, OptionSpec],
          source: str = FILENAME) -> dict[str, Any]:
    """Validate a config document against ``run``'s ``options`` (:func:`options_of`); returns
    ``{"run": {parameter name: value}, "torchrun": [tokens]}`` (sections that are present)."""
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
        known = list(options)
        for raw_key, value in body.items():
            key = str(raw_key).replace("_", "-")
            if key.startswith("--"):
                key = key[2:]
            if key not in options:
                raise ConfigError(f"{source}: unknown key '{section}.{raw_key}'"
                                  f"{_suggest(key, known)}")
            spec = options[key]
            if value is not None:
                where = f"{source}: {section}.{raw_key}"
                value = _convert(value, spec.kind, where, spec.choices)
                if spec.minimum is not None and value < spec.minimum:
                    raise ConfigError(f"{where} must be at least {spec.minimum:g}, "
                                      f"not {value!r}")
                values[spec.name] = value
        out[section] = values
    return out


def load(options: dict[str, OptionSpec],
         directory: str | Path | None = None) -> dict[str, Any]:
    """Read ``ddpdoctor.yaml`` from ``directory`` (the working directory) against ``run``'s
    ``options``; {} without one."""
    path = Path(directory or Path.cwd()) / FILENAME
    if not path.is_file():
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file") from None
    return parse(text, options, str(path))
