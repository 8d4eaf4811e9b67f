"""How ddpdoctor's own process (the launcher) imports torch: quietly. Standard library only."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def import_quietly(module: str) -> ModuleType:
    """``module`` of torch, imported into ddpdoctor's own process with torch's C++ warnings
    off: the store client of a job of several nodes must not print a C++ stack when the node
    that holds the store ends first. torch reads the level once, when it is first imported;
    the variable is put back at once, so the job's environment stays the user's."""
    previous = os.environ.get(_CPP_LOG_LEVEL)
    os.environ[_CPP_LOG_LEVEL] = "ERROR"
    try:
        return importlib.import_module(module)
    finally:
        if previous is None:
            del os.environ[_CPP_LOG_LEVEL]
        else:
            os.environ[_CPP_LOG_LEVEL] = previous
