"""The one view the analysis takes of a rank's collectives, whichever way they were read.

The fast reader keeps a rank's collectives as a :class:`~ddpdoctor.trace.compact.CollectiveLog`,
which is a :class:`~ddpdoctor.trace.model.CollectiveIndex` itself. A plain list (traces built
by hand in tests, the record-by-record reader, a flight-recorder dump) gets a
:class:`ListIndex` that computes the same things from the list. :func:`index_of` picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from ddpdoctor.trace import schema
from ddpdoctor.trace.compact import CollectiveLog
from ddpdoctor.trace.model import Collective, CollectiveIndex, GroupPositions, Site
from ddpdoctor.trace.records import MAX_POSITIONS


def index_of(collectives: Sequence[Collective]) -> CollectiveIndex:
    """The :class:`~ddpdoctor.trace.model.CollectiveIndex` of one rank's collectives."""
    if isinstance(collectives, CollectiveLog):
        return collectives
    return ListIndex(collectives)


class ListIndex:
    """A :class:`~ddpdoctor.trace.model.CollectiveIndex` over a list of collectives; its
    positions and prototypes are computed in one pass, the first time they are asked for."""

    def __init__(self, collectives: Sequence[Collective]) -> None:
        self._items = collectives

    @property
    def protos(self) -> Sequence[Collective]:
        return self._built[0]

    def by_group(self) -> dict[str, GroupPositions]:
        return {name: GroupPositions(codes, lst)
                for name, (codes, lst) in self._built[1].items()}

    def p2p(self) -> list[Collective]:
        return [c for c in self._items if not _positioned(c.seq) and c.peer is not None]

    def incomplete(self, window: int) -> list[Collective]:
        return [c for c in self._items[-window:] if c.state != schema.COMPLETED]

    def used_stacks(self) -> list[list[Site]]:
        return list({id(c.stack): c.stack for c in self._items}.values())

    def last_iteration(self, window: int) -> int:
        return max(((c.iteration or 0) for c in self._items[-window:]), default=0)

    @cached_property
    def _built(self) -> tuple[list[Collective],
                              dict[str, tuple[list[int], list[Collective | None]]]]:
        """(prototypes, per group: codes and collectives by position). A seq already seen in
        its group keeps the first collective; one beyond ``MAX_POSITIONS`` is damage, skipped
        (the reader placed every collective it kept; a trace that starts mid-run, another
        node's detail, has None before its first); lost positions in between are None with
        code -1. This loop touches every collective, so the static key is built inline."""
        protos: list[Collective] = []
        keys: dict[tuple, int] = {}
        groups: dict[str, tuple[list[int], list[Collective | None]]] = {}
        last_group = None
        codes: list[int] = []
        lst: list[Collective | None] = []
        for c in self._items:
            shapes, dtypes = c.shapes, c.dtypes
            key = (c.group, c.op, c.label,
                   tuple(shapes[0]) if len(shapes) == 1 else tuple(map(tuple, shapes)),
                   dtypes[0] if len(dtypes) == 1 else tuple(dtypes), c.numel, c.reduce_op,
                   c.root, c.peer, c.api, id(c.stack), c.sends, c.recvs, c.row, c.tag)
            code = keys.get(key)
            if code is None:
                code = keys[key] = len(protos)
                protos.append(c)
            seq = c.seq
            if not _positioned(seq):
                continue
            assert seq is not None
            group = c.group
            if group != last_group:
                codes, lst = groups.setdefault(group, ([], []))
                last_group = group
            n = len(lst)
            if seq != n + 1:
                if seq <= n or seq > MAX_POSITIONS:
                    continue
                lst.extend([None] * (seq - 1 - n))
                codes.extend([-1] * (seq - 1 - n))
            lst.append(c)
            codes.append(code)
        return protos, groups


def _positioned(seq: int | None) -> bool:
    """Whether a collective has a position in its group (point-to-point ops have none)."""
    return seq is not None and seq.__class__ is int and seq >= 1
