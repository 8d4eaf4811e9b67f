"""The torch releases ddpdoctor was verified on, and every release a behaviour of torch it
relies on changed at: one table of versions (py-spy keeps one place per interpreter version).
Standard library only."""

from __future__ import annotations

VERIFIED = ((2, 6), (2, 15))  # oldest and newest minor release the test suite passed on

# From this release on every group's sequence numbers start at 0 by themselves and
# _set_sequence_number_for_group() only prints that it is deprecated, on every rank.
SEQUENCE_NUMBERS_START_AT_ZERO = (2, 14)
GLOO_FLIGHT_RECORDER = (2, 7)  # the first release whose gloo groups write flight-recorder entries
# (trace/ops.py holds, with each op, the release that added it: ``Op.since``.)


def minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string such as ``2.13.0+cpu``."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def supported(version: str) -> bool:
    """Whether this torch release is in the verified range (:data:`VERIFIED`)."""
    found = minor(version)
    return found is not None and VERIFIED[0] <= found <= VERIFIED[1]
