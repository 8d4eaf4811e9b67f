"""The base of ddpdoctor's closed vocabularies (a stop kind, a finding kind, a rank's status):
an Enum whose members are the strings the reports and files show.

A member compares, hashes and serialises (JSON) as its string, and prints as it: an f-string,
``str()`` and ``format()`` give the value, not ``Class.MEMBER``. (``enum.StrEnum`` does the
same from Python 3.11 on; 3.10 is supported.)
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A string from a fixed set, printed as itself."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
