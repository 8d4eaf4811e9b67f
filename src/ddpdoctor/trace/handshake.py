"""The hang handshake between the launcher and the ranks: files in the log folder.

Once the launcher has decided the job hangs, it writes ``hang-request.json``
(:func:`request`). Every rank's watchdog polls for it (:func:`requested`), writes its
evidence (stacks, pending collectives) into its trace and then creates ``hang-ack-<rank>``
(:func:`acknowledge`); the launcher waits for the acknowledgements (:func:`acknowledged`)
before it stops the job. Files rather than signals: a rank blocked inside a collective's C++
call still runs its watchdog thread, and a file needs nothing from the process group. Standard
library only: imported inside every rank.
"""

from __future__ import annotations

import os
import time

from ddpdoctor.trace import schema


def _create(path: str, text: str) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as fh:
        fh.write(text)


def request(logdir: str | os.PathLike[str]) -> None:
    """The launcher asks every rank for its hang evidence."""
    _create(os.path.join(logdir, schema.HANG_REQUEST), f'{{"t": {time.time()}}}\n')


def requested(logdir: str | os.PathLike[str]) -> bool:
    """Whether the launcher has asked for the hang evidence."""
    return os.path.exists(os.path.join(logdir, schema.HANG_REQUEST))


def acknowledge(logdir: str | os.PathLike[str], rank: int) -> None:
    """Rank ``rank`` has written its evidence."""
    _create(os.path.join(logdir, schema.hang_ack(rank)), "ok\n")


def acknowledged(logdir: str | os.PathLike[str], ranks: list[int]) -> list[int]:
    """Those of ``ranks`` that have written their evidence."""
    return [r for r in ranks if os.path.exists(os.path.join(logdir, schema.hang_ack(r)))]
