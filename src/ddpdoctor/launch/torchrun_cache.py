"""torchrun's option parser without importing torch: rebuilt from a description cached once per
torch install.

ddpdoctor reads torchrun's options with torchrun's own parser (``launch/torchrun.py``), but
``import torch.distributed.run`` costs about 1.5 CPU-seconds here, in ddpdoctor's own process,
on every ``ddpdoctor run`` (the job's torchrun imports torch once more, as it would without
ddpdoctor). The first run on a torch install imports it, describes each option of the real
parser (strings, value count, type, default, torch's ``PET_*`` environment actions) and keeps
the description under ``$XDG_CACHE_HOME/ddpdoctor`` (``~/.cache/ddpdoctor``), keyed by the
torch files the parser comes from and this Python; later runs rebuild the parser from it.

The rebuilt parser reads a command line as the real one does for what it describes; an option
whose action it does not know (``--help``, a release's new kind of action) raises
:class:`NeedsTorch` when given, and the caller asks the real parser. A type other than int,
float or str is read as a string (only options ddpdoctor never reads have one). Nothing here
fails a run: an unreadable or unwritable cache means the real parser, as before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpdoctor.runtime import torch_internals

FORMAT = 1  # of the cached description; part of the file's name
_ENV = torch_internals.TORCHRUN_ENV_PREFIX
_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}
# argparse's own action classes by name (the classes themselves are private to argparse).
_ARGPARSE_KINDS = {"_StoreAction": "store", "_StoreTrueAction": "store_true",
                   "_StoreFalseAction": "store_false", "_StoreConstAction": "store_const",
                   "_AppendAction": "append", "_CountAction": "count"}


class NeedsTorch(Exception):
    """The command line uses an option the rebuilt parser does not know how to read."""


class _Env(argparse.Action):
    """torch's ``argparse_util.env``: the default comes from ``PET_<DEST>`` when it is set."""

    def __init__(self, dest: str, default: Any = None, required: bool = False,
                 **kwargs: Any) -> None:
        default = os.environ.get(_ENV + dest.upper(), default)
        super().__init__(dest=dest, default=default, required=required and not default,
                         **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values)


class _CheckEnv(argparse.Action):
    """torch's ``argparse_util.check_env``: a flag whose default is ``PET_<DEST>`` (0 or 1)."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        kwargs.pop("nargs", None)
        kwargs.pop("const", None)
        default = bool(int(os.environ.get(_ENV + dest.upper(), "1" if default else "0")))
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, self.const)


class _Unknown(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        raise NeedsTorch(option)


def describe(parser: argparse.ArgumentParser) -> list[dict] | None:
    """A JSON description of ``parser``'s actions (None where one cannot be described). Made
    with no ``PET_*`` variable set, so that defaults are torch's own."""
    out = []
    for action in parser._actions:
        kind = torch_internals.torchrun_env_action(action) or \
            _ARGPARSE_KINDS.get(type(action).__name__, "unknown")
        type_name = getattr(action.type, "__name__", None) if action.type else None
        default = action.default
        try:
            json.dumps(default)
            json.dumps(action.const)
            json.dumps(action.choices)
        except (TypeError, ValueError):
            if not action.option_strings:
                return None  # a positional ddpdoctor cannot rebuild
            default, kind = None, "unknown"
        out.append({"options": list(action.option_strings), "dest": action.dest,
                    "kind": kind, "nargs": action.nargs, "const": action.const,
                    "default": default, "required": bool(action.required),
                    "type": type_name if type_name in _TYPES else None,
                    "choices": list(action.choices) if action.choices is not None else None})
    return out


def build(spec: list[dict]) -> argparse.ArgumentParser:
    """A parser that reads a command line as the described one does."""
    parser = argparse.ArgumentParser(prog="torchrun", add_help=False)
    for item in spec:
        kind = item["kind"]
        if item["default"] == argparse.SUPPRESS:  # argparse compares it by identity
            item = dict(item, default=argparse.SUPPRESS)
        kwargs: dict[str, Any] = {"dest": item["dest"]} if item["options"] else {}
        if kind == "env":
            kwargs.update(action=_Env, default=item["default"], required=item["required"])
        elif kind == "check_env":
            kwargs.update(action=_CheckEnv, default=bool(item["default"]))
        elif kind == "unknown":
            kwargs.update(action=_Unknown, nargs=item["nargs"], default=item["default"])
        else:
            kwargs.update(action=kind, default=item["default"])
            if kind in ("store_const", "append_const"):
                kwargs["const"] = item["const"]
            if item["options"]:
                kwargs["required"] = item["required"]
        if kind in ("env", "store", "append"):
            if item["nargs"] is not None:
                kwargs["nargs"] = item["nargs"]
            if item["type"] is not None:
                kwargs["type"] = _TYPES[item["type"]]
            if item["choices"] is not None:
                kwargs["choices"] = item["choices"]
        if item["options"]:
            parser.add_argument(*item["options"], **kwargs)
        else:
            parser.add_argument(item["dest"], **kwargs)
    return parser


def _cache_file() -> Path | None:
    sources = torch_internals.torchrun_parser_sources()
    if not sources:
        return None
    key = hashlib.sha256()
    for path in sources:
        stat = os.stat(path)
        key.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    key.update(f"{sys.version}|{FORMAT}".encode())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "ddpdoctor" / f"torchrun-options-{key.hexdigest()[:20]}.json"


def _describe_real() -> list[dict] | None:
    saved = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith(_ENV)]}
    try:
        return describe(torch_internals.torchrun_parser())
    finally:
        os.environ.update(saved)


def _write(path: Path, spec: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".torchrun-options-")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(spec, out)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def parser() -> argparse.ArgumentParser:
    """torchrun's parser: rebuilt from the cache, or the real one (the cache filled then)."""
    try:
        path = _cache_file()
    except OSError:
        path = None
    if path is not None:
        try:
            return build(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no cache yet, or one this code cannot read: the real parser writes it
    try:
        spec = _describe_real()
        if spec is not None:
            rebuilt = build(spec)
            if path is not None:
                _write(path, spec)
            return rebuilt
    except Exception:  # noqa: BLE001 - a cache is an optimisation: never fail a run for it
        pass
    return torch_internals.torchrun_parser()
