"""What must not leave a rank, or reach a report, as written: secrets in command lines.

Script arguments that look like secrets are masked as ``***`` in traces (``process_start``'s
``argv``) and in reports (the JUnit test name, the Markdown header), by name — an option named
like ``--api-key``, ``--token``, ``--db-pass``, ``--secret``, ``--credentials`` (its value,
after ``=`` or as the next argument), ``-p`` (a password as often as a port: masked),
``KEY=value`` forms with such a name, and values under such keys inside JSON or YAML given as
an argument (``--config '{"password": "***"}'``) — and by shape: the password of a URL with
credentials (``postgres://user:***@host/db``) and a token given as a URL's user
(``https://***@github.com/...``), the credentials of an ``Authorization:`` header and a
``Bearer`` token, the well-known token shapes (``ghp_``, ``github_pat_``, ``sk-``,
``xox?-``, ``AKIA``, ``hf_``) wherever they are, and a long token with the spread of a random
one (an API key given as a plain value). Standard library only.
"""

from __future__ import annotations

import math
import re

_SECRET = re.compile(r"key|token|pass|secret|credential|auth|pwd", re.I)
# A URL with credentials (scheme://user:password@host): the password is masked wherever it is.
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+(?=@)", re.I)
# A URL whose user part is a token (https://ghp_xxx@github.com/...): no colon, no dot.
_URL_TOKEN = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://)[A-Za-z0-9_\-]{16,}(?=@)", re.I)
# A value under a secret-looking key inside JSON or YAML text ("password": "x", token: x).
_KEYED_VALUE = re.compile(
    r"(?P<head>[\"']?[\w.-]*(?:key|token|pass|secret|credential|auth|pwd)[\w.-]*[\"']?\s*[:=]"
    r"\s*)(?P<quote>[\"']?)(?P<value>[^\"',}\s\]]+)(?P=quote)", re.I)
# An Authorization header's credentials ("Authorization: Basic xxx"), or a bearer token; not
# every "basic" or "token" word of an argument.
_AUTH_VALUE = re.compile(r"(?P<head>\b(?:Authorization:\s*(?:(?:Bearer|Basic|Token)\s+)?"
                         r"|Bearer\s+))\S+", re.I)
# Token shapes that providers give their keys, anywhere in an argument.
_KNOWN_TOKEN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                          r"|sk-[A-Za-z0-9_\-]{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
                          r"|AKIA[0-9A-Z]{16}|hf_[A-Za-z0-9]{20,})")
_AUTH_WORDS = ("bearer", "authorization:")
# A long value of letters, digits and the few signs keys use (an API key pasted as a value).
_KEY_LIKE = re.compile(r"^[A-Za-z0-9_\-+/=]{24,}$")
MASK = "***"


def mask_args(args: list[str]) -> list[str]:
    """``args`` with the values of secret-looking options and assignments masked."""
    out: list[str] = []
    mask_next = False
    for raw in args:
        arg = _masked_inside(raw)
        if mask_next and not arg.startswith("-"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        if arg == "-p" or arg.lower() in _AUTH_WORDS:
            out.append(arg)
            mask_next = True
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


def _masked_inside(arg: str) -> str:
    """``arg`` with the secrets masked that can sit anywhere inside it."""
    arg = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK, arg)
    arg = _URL_TOKEN.sub(lambda m: m.group("head") + MASK, arg)
    arg = _KNOWN_TOKEN.sub(MASK, arg)
    arg = _AUTH_VALUE.sub(lambda m: m.group("head") + MASK, arg)
    if any(c in arg for c in ":=") and not arg.startswith("-"):
        arg = _KEYED_VALUE.sub(lambda m: m.group("head") + m.group("quote") + MASK +
                               m.group("quote"), arg)
    return arg


def _looks_random(arg: str) -> bool:
    """A long token of letters and digits with the spread of a random one (an API key): a
    path or a file name (dots, repeated words and digits) is not."""
    value = arg.partition("=")[2] if arg.startswith("-") else arg
    if not _KEY_LIKE.match(value) or not any(c.isdigit() for c in value):
        return False
    counts = [value.count(c) for c in set(value)]
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts)
    return entropy >= 4.2
