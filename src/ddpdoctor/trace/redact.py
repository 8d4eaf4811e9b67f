"""What must not leave a rank, or reach a report, as written: secrets in command lines.

Script arguments that look like secrets — an option named like ``--api-key``, ``--token``,
``--password``, ``--secret``, ``--credentials`` (its value, after ``=`` or as the next argument)
and ``KEY=value`` forms with such a name — are masked as ``***`` in traces (``process_start``'s
``argv``) and in reports (the JUnit test name, the Markdown header). Standard library only.
"""

from __future__ import annotations

import re

_SECRET = re.compile(r"key|token|passw|secret|credential|auth", re.I)
MASK = "***"


def mask_args(args: list[str]) -> list[str]:
    """``args`` with the values of secret-looking options and assignments masked."""
    out: list[str] = []
    mask_next = False
    for arg in args:
        if mask_next:
            out.append(MASK)
            mask_next = False
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
