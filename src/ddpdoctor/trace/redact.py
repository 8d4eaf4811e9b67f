"""What must not leave a rank, or reach a report, as written: secrets in command lines.

Script arguments that look like secrets are masked as ``***`` in traces (``process_start``'s
``argv``) and in reports (the JUnit test name, the Markdown header), by name — an option named
like ``--api-key``, ``--token``, ``--db-pass``, ``--secret``, ``--credentials`` (its value,
after ``=`` or as the next argument) and ``KEY=value`` forms with such a name — and by shape:
the password of a URL with credentials (``postgres://user:***@host/db``), and a long token
with the spread of a random one (an API key given as a plain value). Standard library only.
"""

from __future__ import annotations

import math
import re

_SECRET = re.compile(r"key|token|pass|secret|credential|auth|pwd", re.I)
# A URL with credentials (scheme://user:password@host): the password is masked wherever it is.
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+(?=@)", re.I)
# A long value of letters, digits and the few signs keys use (an API key pasted as a value).
_KEY_LIKE = re.compile(r"^[A-Za-z0-9_\-+/=]{24,}$")
MASK = "***"


def mask_args(args: list[str]) -> list[str]:
    """``args`` with the values of secret-looking options and assignments masked."""
    out: list[str] = []
    mask_next = False
    for raw in args:
        arg = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, raw)
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if _looks_random(arg):
            out.append(arg.partition("=")[0] + "=" + MASK if arg.startswith("-") and "=" in arg
                       else MASK)
            continue
        name, eq, _value = arg.partition("=")
        if arg.startswith("-") and _SECRET.search(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                mask_next = True
        elif eq and not arg.startswith("-") and _SECRET.search(name) and " " not in name:
            out.append(f"{name}={MASK}")
        else:
            out.append(arg)
    return out


def _looks_random(arg: str) -> bool:
    """A long token of letters and digits with the spread of a random one (an API key): a
    path or a file name (dots, repeated words and digits) is not."""
    value = arg.partition("=")[2] if arg.startswith("-") else arg
    if not _KEY_LIKE.match(value) or not any(c.isdigit() for c in value):
        return False
    counts = [value.count(c) for c in set(value)]
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts)
    return entropy >= 4.2
