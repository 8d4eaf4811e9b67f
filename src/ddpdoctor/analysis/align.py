"""Alignment: line the ranks' collectives up per process group and find the first divergence.

Within a group every member issues collectives in the same order, so the group's sequence
number (``seq``) is the position. Each rank's sequence in a group becomes a list of interned
signature ids (:mod:`ddpdoctor.analysis.signature`); ranks whose lists are identical form one
class and are compared once, and two classes are compared in C-speed chunks, so only the few
positions that actually differ are examined field by field. Per group the first *error*
(a field that must match does not, or some members never issued the collective) and the first
*warning* before it (matching collectives issued from different code) are kept; the cascade
after the first error is not reported. Point-to-point operations (``seq`` is None) are paired
per (sender, receiver) in ``p2p_seq`` order.

Every rank is read through its :class:`~ddpdoctor.trace.model.CollectiveIndex`: its few
distinct static parts are interned, its per-position codes mapped to ids at C speed (one
shared list for all ranks whose codes are identical), and a rank read by the fast reader is
decoded only at the positions examined.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpdoctor.analysis.finding import FindingKind
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.signature import (
    DTYPE,
    JOIN_EXIT_LABELS,
    KEY_LABEL,
    KEY_SITE,
    LABEL,
    OP,
    REDUCE_OP,
    ROOT,
    SHAPE,
    Interner,
    hard_difference,
    match_key,
    path_key,
    reduce_op_of,
    site_key,
    soft_difference,
)
from ddpdoctor.analysis.splits import first_split_mismatch
from ddpdoctor.trace.index import index_of
from ddpdoctor.trace.model import Collective, Run
from ddpdoctor.trace.records import is_p2p

DEFAULT_GROUP = "0"
_CHUNK = 512

_KIND_OF_FIELD: dict[str, FindingKind] = {
    OP: fk.OP_MISMATCH, SHAPE: fk.SHAPE_MISMATCH, DTYPE: fk.DTYPE_MISMATCH,
    REDUCE_OP: fk.REDUCE_OP_MISMATCH, ROOT: fk.ROOT_MISMATCH, LABEL: fk.CALLSITE_DIVERGENCE,
    "callsite": fk.CALLSITE_DIVERGENCE}


@dataclass
class Divergence:
    """The first place where the members of a group stop agreeing.

    ``at`` maps every traced member to its collective at this position, or None when it never
    issued one; ``context`` holds the last matched collective before it, per rank.
    """

    kind: FindingKind
    group: str
    seq: int | None
    at: dict[int, Collective | None]
    field: str
    context: dict[int, Collective] = dataclasses.field(default_factory=dict)
    p2p: bool = False

    @property
    def issued(self) -> list[int]:
        return [r for r, c in self.at.items() if c is not None]

    @property
    def absent(self) -> list[int]:
        return [r for r, c in self.at.items() if c is None]

    @property
    def t(self) -> float:
        times = [c.t for c in self.at.values() if c is not None]
        return min(times) if times else math.inf


@dataclass
class GroupAlignment:
    """One process group: its members, their aligned sequences and first divergences."""

    name: str
    members: list[int]
    sequences: dict[int, Sequence[Collective | None]]
    classes: list[list[int]] = field(default_factory=list)
    first_error: Divergence | None = None
    first_warning: Divergence | None = None
    membership: dict[int, list[int]] = field(default_factory=dict)

    def length(self, rank: int) -> int:
        """How many collectives ``rank`` issued in this group (its highest seq)."""
        return len(self.sequences.get(rank, ()))

    def at(self, rank: int, seq: int) -> Collective | None:
        seq_list = self.sequences.get(rank, ())
        return seq_list[seq - 1] if 0 < seq <= len(seq_list) else None


@dataclass
class Alignment:
    """Every group's alignment, the point-to-point pairings, and the join-exit lines."""

    groups: dict[str, GroupAlignment]
    p2p: list[Divergence] = field(default_factory=list)
    pairs: dict[tuple[str, int, int], tuple[list[Collective], list[Collective]]] = \
        field(default_factory=dict)
    join_sites: dict[int, set] = field(default_factory=dict)
    ids: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    keys: list[tuple] = field(default_factory=list)
    _distinct: dict[int, tuple[list[int], set[int]]] = field(default_factory=dict, repr=False)

    def _distinct_ids(self, ids: list[int]) -> set[int]:
        """``set(ids)``, computed once per list (ranks with identical sequences share one)."""
        hit = self._distinct.get(id(ids))
        if hit is None or hit[0] is not ids:
            hit = self._distinct[id(ids)] = (ids, set(ids))
        return hit[1]

    def site_keys(self, rank: int, labels: frozenset[str] | None = None,
                  group: str | None = None) -> set:
        """Source lines (site keys) of ``rank``'s collectives, optionally only those with one
        of ``labels`` or in ``group``: from the interned ids, at C speed."""
        out = set()
        keys = self.keys
        for name, per_rank in self.ids.items():
            if group is not None and name != group:
                continue
            for fid in self._distinct_ids(per_rank.get(rank, [])):
                if fid >= 0:
                    key = keys[fid]
                    if labels is None or key[KEY_LABEL] in labels:
                        out.add(key[KEY_SITE])
        out.discard(None)
        return out

    def divergences(self) -> list[Divergence]:
        """All first divergences: per group error and earlier warning, then point-to-point."""
        out: list[Divergence] = []
        for g in self.groups.values():
            out.extend(d for d in (g.first_warning, g.first_error) if d is not None)
        return out + self.p2p

    def members(self, group: str) -> list[int]:
        g = self.groups.get(group)
        return g.members if g else []


# -- building -------------------------------------------------------------------------------
def _collect(run: Run, interner: Interner) -> tuple[dict, dict, dict, dict]:
    """Per group and rank: the collectives by position and their interned ids; per group and
    rank the point-to-point ops; per rank the source lines of its join-exit collectives.

    Work is per distinct static part of a rank (its prototypes), not per collective: their
    per-position codes are mapped to interned ids at C speed, and ranks whose codes are the
    same list (identical ranks read by the fast reader) share one id list.
    """
    seqs: dict[str, dict[int, Sequence[Collective | None]]] = {}
    ids: dict[str, dict[int, list[int]]] = {}
    p2p: dict[str, dict[int, list[Collective]]] = {}
    join_sites: dict[int, set] = {}
    table = interner.ids
    shared: dict[tuple, tuple[list[int], list[int]]] = {}
    for rank, trace in run.ranks.items():
        index = index_of(trace.collectives)
        to_id: list[int] = []
        for proto in index.protos:
            key = full_key(proto, interner.site(proto))
            fid = table.get(key)
            if fid is None:
                fid = table[key] = len(table)
                interner.keys.append(key)
            to_id.append(fid)
            if proto.label in JOIN_EXIT_LABELS and not is_p2p(proto):
                sk = site_key(proto.site)
                if sk is not None:
                    join_sites.setdefault(rank, set()).add(sk)
        to_id.append(-1)  # code -1 (a position whose line was lost) maps to id -1
        for name, positions in index.by_group().items():
            codes = positions.codes
            memo = (id(codes), tuple(to_id))
            hit = shared.get(memo)
            if hit is None or hit[0] is not codes:
                hit = shared[memo] = (codes, list(map(to_id.__getitem__, codes)))
            seqs.setdefault(name, {})[rank] = positions.collectives
            ids.setdefault(name, {})[rank] = hit[1]
        for c in index.p2p():
            p2p.setdefault(c.group, {}).setdefault(rank, []).append(c)
    return seqs, ids, p2p, join_sites


def full_key(c: Collective, site: tuple | None) -> tuple:
    """The interned full key of ``c`` (see :class:`~ddpdoctor.analysis.signature.Interner`)."""
    shapes, dtypes = c.shapes, c.dtypes
    return (c.op, tuple(shapes[0]) if len(shapes) == 1 else tuple(map(tuple, shapes)),
            dtypes[0] if len(dtypes) == 1 else tuple(dtypes), c.numel, reduce_op_of(c),
            c.root, c.label, site, path_key(c))


def _memberships(run: Run, names: set[str]) -> dict[str, dict[int, list[int]]]:
    """Per group: each rank's recorded member list."""
    views: dict[str, dict[int, list[int]]] = {}
    ordered: dict[int, tuple[list[int], list[int]]] = {}  # ranks share equal lists (reader)
    for rank, trace in run.ranks.items():
        for name, group in trace.groups.items():
            if group.ranks:
                known = ordered.get(id(group.ranks))
                if known is None:
                    known = ordered[id(group.ranks)] = (group.ranks, sorted(group.ranks))
                views.setdefault(name, {})[rank] = known[1]
    for name in names:
        views.setdefault(name, {})
    return views


def _consensus(name: str, views: dict[int, list[int]], run: Run, users: set[int]) -> list[int]:
    if views:
        lists = {id(v): v for v in views.values()}  # most ranks share one list
        counts: Counter[tuple[int, ...]] = Counter()
        for i, n in Counter(id(v) for v in views.values()).items():
            counts[tuple(lists[i])] += n
        return list(counts.most_common(1)[0][0])
    if name == DEFAULT_GROUP:
        return list(range(run.world_size))
    return sorted(users)


def _next_diff(a: list[int], b: list[int], i: int, n: int) -> int:
    """First index >= i where ``a`` and ``b`` differ, comparing in chunks at C speed."""
    while i < n:
        j = min(i + _CHUNK, n)
        if a[i:j] != b[i:j]:
            for k in range(i, j):
                if a[k] != b[k]:
                    return k
        i = j
    return n


def _scan(ref: list[int], other: list[int], ref_seq: Sequence[Collective | None],
          other_seq: Sequence[Collective | None], join_sites: dict[int, set],
          stop: int) -> tuple[float, float]:
    """(first error index, first warning index) of ``other`` against ``ref``; inf if none."""
    n = min(len(ref), len(other), stop)
    err = warn = math.inf
    i = 0
    while True:
        i = _next_diff(ref, other, i, n)
        if i >= n:
            break
        a, b = ref_seq[i], other_seq[i]
        if a is not None and b is not None:
            if hard_difference(a, b):
                err = i
                break
            if warn == math.inf and soft_difference(a, b, join_sites):
                warn = i
        i += 1
    if err == math.inf and len(ref) != len(other) and min(len(ref), len(other)) < stop:
        err = min(len(ref), len(other))
    return err, warn


def _position(g: GroupAlignment, index: int, traced: list[int]) -> dict[int, Collective | None]:
    """Every traced member's collective at ``index``; members with a gap there are left out."""
    at: dict[int, Collective | None] = {}
    for r in traced:
        lst = g.sequences.get(r, [])
        if index < len(lst):
            if lst[index] is not None:
                at[r] = lst[index]
        else:
            at[r] = None
    return at


def _classify(g: GroupAlignment, index: int, traced: list[int], join_sites: dict[int, set],
              want_error: bool) -> Divergence | None:
    """Name what differs at ``index`` across all traced members."""
    at = _position(g, index, traced)
    present = {r: c for r, c in at.items() if c is not None}
    if not present:
        return None
    parts: dict[tuple, list[int]] = {}
    for r, c in present.items():
        parts.setdefault(match_key(c), []).append(r)
    ordered = sorted(parts.values(), key=lambda rs: (-len(rs), rs[0]))
    ref = present[ordered[0][0]]
    kind: FindingKind | None = None
    field_name: str | None = None
    if len(ordered) > 1:
        field_name = hard_difference(ref, present[ordered[1][0]]) or OP
        kind = _KIND_OF_FIELD[field_name]
    elif len(present) < len(at):
        kind, field_name = fk.MISSING_COLLECTIVE, "missing"
    elif not want_error:
        for c in present.values():
            soft = soft_difference(ref, c, join_sites)
            if soft:
                kind, field_name = fk.CALLSITE_DIVERGENCE, soft
                break
    if kind is None or field_name is None:
        return None
    context: dict[int, Collective] = {}
    if index > 0:
        context = {r: c for r, c in _position(g, index - 1, traced).items() if c is not None}
    return Divergence(kind, g.name, index + 1, at, field_name, context)


def _align_group(g: GroupAlignment, ids: dict[int, list[int]], traced: list[int],
                 join_sites: dict[int, set]) -> None:
    # Group ranks by identical id sequences: bucket by a hash of the sequence (no copy is
    # kept), then confirm with a C-speed list comparison against the bucket's first rank.
    buckets: dict[tuple[int, int], list[list[int]]] = {}
    by_object: dict[int, list[int]] = {}  # ranks sharing one id list need no hashing
    empty: list[int] = []
    for r in traced:
        seq_ids = ids.get(r, empty)
        cls = by_object.get(id(seq_ids))
        if cls is not None:
            cls.append(r)
            continue
        bucket = buckets.setdefault((len(seq_ids), hash(tuple(seq_ids))), [])
        for cls in bucket:
            if ids.get(cls[0], empty) == seq_ids:
                cls.append(r)
                break
        else:
            cls = [r]
            bucket.append(cls)
        by_object[id(seq_ids)] = cls
    classes = [cls for bucket in buckets.values() for cls in bucket]
    g.classes = sorted(classes, key=lambda rs: (-len(rs), rs[0]))
    if len(g.classes) < 2:
        return
    ref_rank = g.classes[0][0]
    ref_ids, ref_seq = ids.get(ref_rank, []), g.sequences.get(ref_rank, [])
    err = warn = math.inf
    for cls in g.classes[1:]:
        r = cls[0]
        e, w = _scan(ref_ids, ids.get(r, []), ref_seq, g.sequences.get(r, []), join_sites,
                     int(min(err, 1 << 62)))
        err, warn = min(err, e), min(warn, w)
    if err != math.inf:
        g.first_error = _classify(g, int(err), traced, join_sites, want_error=True)
    if warn < err:
        g.first_warning = _classify(g, int(warn), traced, join_sites, want_error=False)


def _align_p2p(name: str, ops: dict[int, list[Collective]], members: list[int],
               pairs: dict) -> Divergence | None:
    """Pair sends with receives per (src, dst) in order; the earliest mismatch or orphan."""
    def global_rank(group_rank: int | None) -> int:
        if group_rank is None:  # never for a recorded send or recv
            return -1
        return members[group_rank] if 0 <= group_rank < len(members) else group_rank

    mine: dict[tuple[int, int], tuple[list, list]] = {}
    for rank, lst in ops.items():
        for c in sorted(lst, key=lambda c: (c.p2p_seq or 0, c.id)):
            if c.op == "send":
                mine.setdefault((rank, global_rank(c.peer)), ([], []))[0].append(c)
            elif c.op == "recv":
                mine.setdefault((global_rank(c.peer), rank), ([], []))[1].append(c)
    first: Divergence | None = None
    for (src, dst), (sends, recvs) in mine.items():
        pairs[(name, src, dst)] = (sends, recvs)
        found = _pair_mismatch(name, src, dst, sends, recvs)
        if found is not None:
            found.p2p = True
            if first is None or found.t < first.t:
                first = found
    return first


def _pair_mismatch(name: str, src: int, dst: int, sends: list[Collective],
                   recvs: list[Collective]) -> Divergence | None:
    """The first mismatch between ``src``'s sends to ``dst`` and ``dst``'s receives from
    ``src``: a send and a receive meet when their tags agree, in order within a tag (as the
    backends match them). Sizes differ; a receive waits for a tag no send used; or one side
    has ops the other never matched."""
    by_tag: dict[int, tuple[list[Collective], list[Collective]]] = {}
    for c in sends:
        by_tag.setdefault(c.tag or 0, ([], []))[0].append(c)
    for c in recvs:
        by_tag.setdefault(c.tag or 0, ([], []))[1].append(c)
    left_sends: list[Collective] = []
    left_recvs: list[Collective] = []
    for tag_sends, tag_recvs in by_tag.values():
        for s, r in zip(tag_sends, tag_recvs):
            if s.shapes != r.shapes or s.numel != r.numel:
                return Divergence(fk.SHAPE_MISMATCH, name, None, {src: s, dst: r}, SHAPE)
            if s.dtypes != r.dtypes:
                return Divergence(fk.DTYPE_MISMATCH, name, None, {src: s, dst: r}, DTYPE)
        k = min(len(tag_sends), len(tag_recvs))
        left_sends += tag_sends[k:]
        left_recvs += tag_recvs[k:]
    if not left_sends and not left_recvs:
        return None
    send = min(left_sends, key=lambda c: c.id) if left_sends else None
    recv = min(left_recvs, key=lambda c: c.id) if left_recvs else None
    if send is not None and recv is not None:  # each waits for the other under another tag
        return Divergence(fk.TAG_MISMATCH, name, None, {src: send, dst: recv}, "tag")
    return Divergence(fk.MISSING_COLLECTIVE, name, None, {src: send, dst: recv}, "missing")


def _check_splits(run: Run, g: GroupAlignment, traced: list[int]) -> None:
    """An all_to_all, gather or scatter whose amounts disagree before the group's first error
    becomes that error (its tensors are not compared: they differ by design)."""
    found = first_split_mismatch(run, g, g.first_error.seq if g.first_error else None)
    if found is None:
        return
    seq, at = found
    context = {r: c for r, c in _position(g, seq - 2, traced).items() if c is not None} \
        if seq > 1 else {}
    g.first_error = Divergence(fk.SPLIT_MISMATCH, g.name, seq, at, "splits", context)
    if g.first_warning is not None and (g.first_warning.seq or 0) >= seq:
        g.first_warning = None


def align(run: Run) -> Alignment:
    """Align every process group of ``run`` and find each group's first divergence."""
    interner = Interner()
    seqs, ids, p2p, join_sites = _collect(run, interner)
    views = _memberships(run, set(seqs) | set(p2p))
    result = Alignment(groups={}, join_sites=join_sites, ids=ids, keys=interner.keys)
    for name in sorted(views, key=lambda n: (len(n), n)):
        users = set(seqs.get(name, {})) | set(p2p.get(name, {}))
        members = _consensus(name, views[name], run, users)
        g = GroupAlignment(name, members, seqs.get(name, {}))
        distinct = {tuple(v) for v in {id(v): v for v in views[name].values()}.values()}
        strays = users - set(members)
        if len(distinct) > 1 or strays:
            g.membership = dict(views[name])
            for r in strays:
                g.membership.setdefault(r, [])
        traced = [r for r in members if r in run.ranks]
        _align_group(g, ids.get(name, {}), traced, join_sites)
        _check_splits(run, g, traced)
        if name in p2p:
            d = _align_p2p(name, p2p[name], members, result.pairs)
            if d is not None:
                result.p2p.append(d)
        result.groups[name] = g
    return result
