"""Whose code a frame is, decided one way for the whole runtime.

*Internal* code is torch's and ddpdoctor's own: a collective's call site is the first frame
outside it, and the labeller reads internal frames to name DDP's collectives. *Library* code
is internal code plus the Python standard library, installed packages and frozen modules:
the hang evidence's user frames and CPU mode's "does the script itself ask" skip it as well.
(The analysis asks the same of recorded file names with
:func:`ddpdoctor.trace.model.is_internal_file`.) Folders are compared as given and resolved,
since a virtual environment may reach them through a link.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys
import sysconfig
from types import FrameType


def _prefixes(dirs: set[str]) -> tuple[str, ...]:
    found = {os.path.join(p, "") for d in dirs if d
             for p in (d, os.path.abspath(d), os.path.realpath(d))}
    return tuple(sorted(found))


OWN = _prefixes({os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})  # ddpdoctor/


def is_own(filename: str) -> bool:
    """ddpdoctor's own code."""
    return filename.startswith(OWN)


@functools.lru_cache(maxsize=1)
def internal_prefixes() -> tuple[str, ...]:
    """Path prefixes of torch's and ddpdoctor's files. Torch is located, never imported: the
    watchdog thread asks this while the main thread may be importing torch, and a second
    thread importing it then sees a half-initialised package."""
    dirs: set[str] = set()
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "__file__", None):
        dirs.add(os.path.dirname(str(torch.__file__)))
    else:
        spec = importlib.util.find_spec("torch")
        if spec is not None and spec.origin:
            dirs.add(os.path.dirname(spec.origin))
    return OWN + _prefixes(dirs)


@functools.lru_cache(maxsize=1)
def library_prefixes() -> tuple[str, ...]:
    """Path prefixes of code that is not the user's: internal code, the standard library,
    installed packages; and frozen modules (``<frozen ...>``)."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:  # some virtualenvs' site module
        pass
    return internal_prefixes() + _prefixes(dirs) + ("<frozen",)


def is_internal(filename: str) -> bool:
    """Torch's or ddpdoctor's code."""
    return filename.startswith(internal_prefixes())


def is_library(filename: str) -> bool:
    """Not the user's code: internal, standard library, an installed package, frozen."""
    return filename.startswith(library_prefixes())


def first_user_frame(frame: FrameType | None) -> FrameType | None:
    """``frame`` or the first frame outwards from it that is the user's code."""
    while frame is not None and is_library(frame.f_code.co_filename):
        frame = frame.f_back
    return frame
