"""torchrun's command line, read with torchrun's own parser.

``ddpdoctor run`` takes torchrun's options exactly as torchrun does — both spellings
(``--nproc-per-node`` / ``--nproc_per_node``), ``=`` or a separate value, every option a
torch release adds — because it asks ``torch.distributed.run.get_args_parser()`` which options
exist and whether they take a value, then lets that parser read them (rebuilt from a cached
description, ``launch/torchrun_cache.py``, so that ddpdoctor's own process does not import
torch on every run). ddpdoctor's own options
(``--logdir``, ``--hang-timeout``, ...) are told apart by name; none of them is a torchrun
option. The tokens reach torchrun verbatim.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NoReturn

from ddpdoctor.launch import torchrun_cache
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.runtime import torch_internals


def _raising(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``p``, made to raise :class:`UsageError` instead of exiting."""

    def error(message: str) -> NoReturn:
        raise UsageError(f"torchrun: {message}")

    p.error = error  # type: ignore[method-assign]
    return p


@lru_cache(maxsize=1)
def parser() -> argparse.ArgumentParser:
    """torchrun's argument parser (rebuilt from its cached description: no torch import)."""
    return _raising(torchrun_cache.parser())


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


@dataclass
class Split:
    """``ddpdoctor run``'s arguments, sorted: ddpdoctor's own options, torchrun's, the script
    and the script's arguments (``script`` None when there is none), or, after ``--``, a
    launch command of the user's (``command``: ``accelerate launch train.py``)."""

    own: list[str] = field(default_factory=list)
    torchrun: list[str] = field(default_factory=list)
    script: str | None = None
    args: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


def split(argv: list[str], own: dict[str, bool]) -> Split:
    """Sort ``argv`` (what follows ``ddpdoctor run``); ``own`` maps each of ddpdoctor's option
    strings to whether it takes a value. The first argument that is neither an option nor an
    option's value is the script; everything after it belongs to the script. After ``--``,
    a ``.py`` file is the script too; anything else is a launch command, run as it is."""
    actions = torch_internals.parser_options(parser())
    out = Split()
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            if i + 1 < len(argv):
                if argv[i + 1].endswith(".py"):
                    out.script, out.args = argv[i + 1], argv[i + 2:]
                else:  # a launch command of the user's: accelerate launch ..., srun ...
                    out.command = argv[i + 1:]
            return out
        name, eq, _ = token.partition("=")
        if name in own:
            out.own.append(token)
            if own[name] and not eq and i + 1 < len(argv):
                out.own.append(argv[i + 1])
                i += 1
        elif token.startswith("-") and len(token) > 1:
            action = actions.get(name)
            if action is None and not name.startswith("--") and name[:2] in actions:
                action = actions[name[:2]]  # a short option with its value attached: -r3
                eq = "=" if len(name) > 2 else eq
            if action is None:
                action = _abbreviated(name, actions, own)
            if action is None:
                raise UsageError(f"unknown option {name}{_did_you_mean(name, actions, own)}: "
                                 f"neither ddpdoctor's nor torchrun's (ddpdoctor run --help "
                                 f"lists ddpdoctor's; torchrun --help torchrun's)")
            out.torchrun.append(token)
            if _takes_value(action) and not eq and i + 1 < len(argv):
                out.torchrun.append(argv[i + 1])
                i += 1
        else:
            out.script, out.args = token, argv[i + 1:]
            return out
        i += 1
    return out


def _abbreviated(name: str, actions: dict[str, Any], own: dict[str, bool]) -> Any:
    """The torchrun option ``name`` abbreviates, as torchrun's parser (argparse) reads it: the
    one long option it begins (None when it begins none, or one of ddpdoctor's; an error
    when it begins several)."""
    if not name.startswith("--") or any(o.startswith(name) for o in own):
        return None
    found = [o for o in actions if o.startswith(name)]
    if len(found) > 1:
        raise UsageError(f"ambiguous option {name}: it begins {', '.join(found[:4])}")
    return actions[found[0]] if found else None


def _did_you_mean(name: str, actions: dict[str, Any], own: dict[str, bool]) -> str:
    known = [o for o in [*own, *actions] if o.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


@dataclass
class Torchrun:
    """torchrun's options as given (``tokens``, passed on verbatim) and as torchrun reads them
    (``values``, with torchrun's defaults and its ``PET_*`` environment variables)."""

    tokens: list[str]
    values: argparse.Namespace

    def given(self, dest: str) -> bool:
        """Whether the command line sets option ``dest`` (either spelling)."""
        actions = torch_internals.parser_options(parser())
        for token in self.tokens:
            name = token.partition("=")[0]
            action = actions.get(name) or (actions.get(name[:2]) if not name.startswith("--")
                                           else None)
            if action is not None and action.dest == dest:
                return True
        return False

    @property
    def module(self) -> bool:
        return bool(self.values.module)

    @property
    def no_python(self) -> bool:
        return bool(self.values.no_python)

    @property
    def nnodes_max(self) -> int:
        """The largest number of nodes ``--nnodes`` allows (``N`` or ``MIN:MAX``)."""
        text = str(self.values.nnodes or "1")
        try:
            return int(text.split(":")[-1])
        except ValueError:
            return 1

    @property
    def nproc_per_node(self) -> int | None:
        """Processes per node when given as a number (torchrun also takes auto, cpu, gpu)."""
        value = str(self.values.nproc_per_node or "")
        return int(value) if value.isdigit() else None

    @property
    def nproc_word(self) -> str | None:
        """Processes per node when given as a word: ``auto``, ``cpu``, ``gpu`` or ``xpu``."""
        value = str(self.values.nproc_per_node or "")
        return value if value and not value.isdigit() else None

    def run_id(self) -> str | None:
        """An id every node of a multi-node job computes alike (from the rendezvous), so the
        traces of all nodes are recognised as one run; None on a single node."""
        if self.nnodes_max <= 1:
            return None
        v = self.values
        where = v.rdzv_endpoint or f"{v.master_addr}:{v.master_port}"
        key = f"{v.rdzv_backend}|{where}|{v.rdzv_id}|{v.nnodes}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]


    def store_address(self) -> tuple[str, int] | None:
        """Where the job's rendezvous store listens (the static rendezvous' master address,
        or the c10d rendezvous endpoint); None for other rendezvous backends."""
        v = self.values
        if v.rdzv_backend == "static":
            return str(v.master_addr or "127.0.0.1"), int(v.master_port or 29500)
        if v.rdzv_backend == "c10d" and v.rdzv_endpoint:
            host, _, port = str(v.rdzv_endpoint).rpartition(":")
            if not host or not port.isdigit():
                host, port = str(v.rdzv_endpoint), "29400"
            return host.strip("[]"), int(port)
        return None

    @property
    def node_rank(self) -> int | None:
        """This node's number where the command line fixes it (a static rendezvous)."""
        return int(self.values.node_rank or 0) if self.values.rdzv_backend == "static" else None


def read(tokens: list[str], script: str, args: list[str]) -> Torchrun:
    """torchrun's reading of ``tokens`` followed by the script (raises :class:`UsageError`)."""
    argv = [*tokens, script, *args]
    try:
        values = parser().parse_args(argv)
    except torchrun_cache.NeedsTorch:  # an option the rebuilt parser cannot read: -h, ...
        values = _raising(torch_internals.torchrun_parser()).parse_args(argv)
    return Torchrun(list(tokens), values)
