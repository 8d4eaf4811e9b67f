"""A rank's progress block: how far the rank got, in one small file read in one go.

Next to each trace the rank keeps ``<trace>.progress``, rewritten in place (one ``pwrite``)
whenever what it says changes: by the writer thread when collectives were issued or completed
(at most every ``writer.BUSY_LOOK_SECONDS`` while it issues them, ``writer.DONE_SECONDS``
once it is quiet), and at once for the rare records (a group made, an
activity record, an exception, the exit). The launcher's monitor reads every rank's block
head a poll, whatever the rate of collectives, and reads and parses the rest only when its
generation changed; it reads the traces themselves only to diagnose. The trace stays the
record: a block says how far its rank got, never what it did.

Layout: a 20-byte head, ``<4s H H I I I>`` little-endian (:data:`MAGIC`, :data:`VERSION`, 0,
generation, payload length, CRC-32 of the payload), then the payload, a JSON object (below).
A reader that meets a head and payload that disagree (the rank rewrote the block while it
read) reads it again at its next poll. The payload::

    {"rank": 0, "round": 0, "attempt": 0, "world_size": 2, "issued_id": 812,
     "last_issue": 1764373000.5,
     "completed": 811, "iteration": 203, "last_op": "all_reduce (ddp.bucket)",
     "issued": {"0": 812}, "groups": {"1": [0, 1]}, "init": "completed",
     "status": "running", "exited": false, "cut": false, "activity_n": 0, "activity": null,
     "activity_before": null,
     "pending_count": 1, "pending": [<collective record>, ...]}

``issued_id``: the id of the last collective written, ``last_issue`` its issue time (the
rank's clock); ``completed``: how many have completed
or failed; ``issued``: per group, the highest sequence number issued; ``groups``: the members
of each group made (``group`` records); ``init``: the last state of ``init_process_group``;
``status``: ``running`` until an ``exception`` or ``exit`` record, then that record's
(``exited`` once the exit record is written); ``cut``: the trace could no longer be written;
``activity``: the last ``activity`` record, ``activity_before`` the one before it and
``activity_n`` how many were written;
``pending``: the oldest :data:`MAX_LISTED` collectives still running, each a ``collective``
record with its issue time ``t``, its static part inline and its call stack's frames in
``frames``.
Standard library only: the rank side runs inside every training process.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Any

MAGIC = b"DDPP"
VERSION = 1
SUFFIX = ".progress"
MAX_LISTED = 16  # pending collectives a block lists, oldest first
# Seconds a collective runs, with none issued since, before its rank counts as waiting: the
# launcher then polls fast (launch/job.py), and the rank's writer wakes it (launch/wake.py).
WAITED = 0.3
_HEAD = struct.Struct("<4sHHIII")
MAX_BYTES = 4 * 1024 * 1024  # a longer payload is damage, not a block


def path_of(trace_path: str) -> str:
    """The block of the rank writing ``trace_path``."""
    return trace_path + SUFFIX


def trace_of(block_path: str) -> str:
    """The trace whose progress ``block_path`` holds."""
    return block_path[:-len(SUFFIX)] if block_path.endswith(SUFFIX) else block_path


def encode(generation: int, payload: bytes) -> bytes:
    """Head and payload (a JSON object's bytes), as one write stores them."""
    return _HEAD.pack(MAGIC, VERSION, 0, generation & 0xFFFFFFFF, len(payload),
                      zlib.crc32(payload)) + payload


def decode_head(data: bytes) -> tuple[int, int, int] | None:
    """(generation, payload length, CRC-32) from a block's first bytes; None when they are no
    block head of this version."""
    if len(data) < _HEAD.size:
        return None
    magic, version, _, generation, length, crc = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION or length > MAX_BYTES:
        return None
    return generation, length, crc


def read(fd: int, known: int | None = None) -> tuple[int, bytes] | None:
    """(generation, payload) of the block open on ``fd``; None while it is not whole (being
    written, or never written), or when its generation is ``known`` (nothing new: the
    payload is not read further)."""
    try:  # the head alone first: most polls find the generation they know
        data = os.pread(fd, _HEAD.size, 0)
    except OSError:
        return None
    head = decode_head(data)
    if head is None:
        return None
    generation, length, crc = head
    if generation == known:
        return None
    end = _HEAD.size + length
    if end > len(data):
        try:
            data = os.pread(fd, end, 0)
        except OSError:
            return None
    payload = data[_HEAD.size:end]
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    return generation, payload


def field(state: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    """``state[name]`` when it is a ``kind`` (bool is no int), else ``default``."""
    value = state.get(name, default)
    if kind is int and isinstance(value, bool):
        return default
    return value if isinstance(value, kind) else default
