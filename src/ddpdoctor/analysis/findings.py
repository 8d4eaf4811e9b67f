"""Findings from the alignment: mismatches, missing collectives, call-site divergences,
group-membership conflicts and cross-group wait cycles.

Each builder turns one :class:`~ddpdoctor.analysis.align.Divergence` (or a wait cycle) into a
:class:`~ddpdoctor.analysis.finding.Finding` whose summary names the ranks, the operations and
their DDP meaning, and whose per-rank details say what every rank of the group was doing.
"""

from __future__ import annotations

from ddpdoctor.analysis.align import Alignment, Divergence, GroupAlignment
from ddpdoctor.analysis.details import collective_detail, elsewhere_detail, where_text
from ddpdoctor.analysis.finding import Finding, RankDetail, Severity
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankState
from ddpdoctor.analysis.signature import LABEL, match_key, path_key
from ddpdoctor.analysis.splits import disagreements
from ddpdoctor.analysis.terms import describe, group_text, op_text, rank_list, site_text
from ddpdoctor.analysis.waits import Wait
from ddpdoctor.trace import schema
from ddpdoctor.trace.model import Collective

_HEADLINES = {
    fk.OP_MISMATCH: "the ranks issued different collectives",
    fk.SHAPE_MISMATCH: "the ranks passed tensors of different shapes",
    fk.DTYPE_MISMATCH: "the ranks passed tensors of different dtypes",
    fk.REDUCE_OP_MISMATCH: "the ranks used different reduce ops",
    fk.ROOT_MISMATCH: "the ranks named different root ranks",
}
_MAX_PARTS = 3


def _position_text(d: Divergence, members: list[int]) -> str:
    if d.p2p:
        return f"point-to-point traffic in {group_text(d.group, members)}"
    return f"collective #{d.seq} of {group_text(d.group, members)}"


def _partitions(d: Divergence) -> list[tuple[list[int], Collective]]:
    """Ranks that issued the same thing, largest first: the same match key, label and line,
    and the same shapes (printed for each part, even where they need not match)."""
    parts: dict[tuple, tuple[list[int], Collective]] = {}
    for r, c in d.at.items():
        if c is None:
            continue
        key = (match_key(c), str(c.shapes), c.label, str(path_key(c) or c.site))
        parts.setdefault(key, ([], c))[0].append(r)
    return sorted(parts.values(), key=lambda p: (-len(p[0]), p[0][0]))


def _issued_text(ranks: list[int], c: Collective, with_op: bool = True) -> str:
    op = f" ({op_text(c)})" if with_op else ""
    return f"{rank_list(ranks)} issued {describe(c)}{op} at {site_text(c.site)}"


def _absent_text(d: Divergence, states: dict[int, RankState]) -> str:
    absent = d.absent
    if not absent:
        return ""
    by_where: dict[str, list[int]] = {}
    for r in absent:
        by_where.setdefault(where_text(states[r]), []).append(r)
    items = list(by_where.items())
    text = "; ".join(f"{rank_list(rs_)} {where_text(states[rs_[0]], len(rs_))}"
                     for _w, rs_ in items[:_MAX_PARTS])
    if len(items) > _MAX_PARTS:
        text += f"; and {len(items) - _MAX_PARTS} more situations"
    return text


def _details(d: Divergence, states: dict[int, RankState]) -> dict[int, RankDetail]:
    out: dict[int, RankDetail] = {}
    for r, c in sorted(d.at.items()):
        out[r] = collective_detail(c) if c is not None else elsewhere_detail(states[r])
    return out


def _mismatch(d: Divergence, g: GroupAlignment | None, states: dict[int, RankState]) -> Finding:
    members = g.members if g else []
    parts = _partitions(d)
    shown = "; but ".join(_issued_text(rs_, c) for rs_, c in parts[:_MAX_PARTS])
    summary = f"At {_position_text(d, members)} {_HEADLINES[d.kind]}: {shown}"
    absent = _absent_text(d, states)
    if absent:
        summary += f"; {absent}"
    return Finding(d.kind, Severity.ERROR, d.group, d.seq, summary + ".", _details(d, states),
                   p2p=d.p2p, t=d.t)


def _missing(d: Divergence, g: GroupAlignment | None, states: dict[int, RankState]) -> Finding:
    members = g.members if g else []
    parts = _partitions(d)
    waiting = any(c is not None and c.state != schema.COMPLETED for c in d.at.values())
    verb = ("waits in" if len(d.issued) == 1 else "wait in") if waiting else "issued"
    first_ranks, c = parts[0]
    issued = [r for r in d.issued]
    if d.p2p:
        what = f"{c.op} {'to' if c.op == 'send' else 'from'} rank {d.absent[0]}"
        summary = (f"{rank_list(issued)} {verb} {what} ({op_text(c)}) at {site_text(c.site)}, "
                   f"which {rank_list(d.absent)} never matched: {_absent_text(d, states)}.")
    else:
        summary = (f"{rank_list(issued)} {verb} {describe(c)} ({op_text(c)}) at "
                   f"{site_text(c.site)}, {_position_text(d, members)}, which "
                   f"{rank_list(d.absent)} never issued: {_absent_text(d, states)}.")
    return Finding(fk.MISSING_COLLECTIVE, Severity.ERROR, d.group, d.seq, summary,
                   _details(d, states),
                   p2p=d.p2p, t=d.t)


def _first_different_frame(issued: list[Collective]) -> int | None:
    """The index of the first recorded frame that differs between ``issued`` (collectives at
    one position) when their first frames agree: a DDP step reached from different callers
    through one line (a helper shared by training and evaluation); else None."""
    paths = [p for p in map(path_key, issued) if p]
    if len(paths) < 2 or len(paths) < len(issued) or len({p[0] for p in paths}) != 1:
        return None
    for i in range(1, min(map(len, paths))):
        if len({p[i] for p in paths}) > 1:
            return i
    return None


def _callsite(d: Divergence, g: GroupAlignment | None,
              states: dict[int, RankState]) -> Finding:
    members = g.members if g else []
    parts = _partitions(d)
    texts = [_issued_text(rs_, c, with_op=False) for rs_, c in parts[:_MAX_PARTS]]
    callers = _first_different_frame([c for _, c in parts])
    if callers is not None:  # one line on every rank: name where each was called from
        why = "from different callers"
        texts = [f"{text}, called from {site_text(c.stack[callers])}"
                 for text, (_, c) in zip(texts, parts)]
    else:
        why = "for different purposes" if d.field == LABEL else "from different source lines"
    shown = "; ".join(texts)
    summary = (f"{_position_text(d, members).capitalize()} matched in op and shape "
               f"({op_text(parts[0][1])}), but the ranks issued it {why}: {shown}.")
    return Finding(fk.CALLSITE_DIVERGENCE, Severity.WARNING, d.group, d.seq, summary,
                   _details(d, states),
                   t=d.t)


def _amounts(c: Collective) -> str:
    """'sends [2, 3] rows, expects [2, 2] rows': what a rank passed to an op of ops.SPLITS."""
    def shown(counts: tuple[int, ...]) -> str:
        if c.row and all(n % c.row == 0 for n in counts):
            return f"{[n // c.row for n in counts]} rows"
        return f"{list(counts)} elements"
    parts = []
    if c.sends is not None and any(c.sends):
        parts.append(f"sends {shown(c.sends)}")
    if c.recvs is not None and any(c.recvs):
        parts.append(f"expects {shown(c.recvs)}")
    return ", ".join(parts) + " (per rank of the group)" if parts else ""


def _split(d: Divergence, g: GroupAlignment | None, states: dict[int, RankState]) -> Finding:
    members = g.members if g else sorted(d.at)
    found = disagreements(d.at, members)
    c = next(c for c in d.at.values() if c is not None)
    shown = "; ".join(x.text() for x in found[:_MAX_PARTS])
    if len(found) > _MAX_PARTS:
        shown += f"; and {len(found) - _MAX_PARTS} more pairs"
    summary = (f"At {_position_text(d, members)} the ranks' split sizes disagree in "
               f"{describe(c)} ({op_text(c)}) at {site_text(c.site)}: {shown}.")
    details = _details(d, states)
    for r, at in d.at.items():
        if at is not None:
            details[r].note = _amounts(at)
    return Finding(fk.SPLIT_MISMATCH, Severity.ERROR, d.group, d.seq, summary, details, t=d.t)


def _tag(d: Divergence, g: GroupAlignment | None, states: dict[int, RankState]) -> Finding:
    (src, s), (dst, r) = [(rank, c) for rank, c in d.at.items() if c is not None]
    members = g.members if g else []
    summary = (f"In {_position_text(d, members)} rank {dst} waits to receive from rank {src} "
               f"with tag {r.tag or 0} at {site_text(r.site)}, but rank {src} sent to rank "
               f"{dst} with tag {s.tag or 0} at {site_text(s.site)}: a receive only matches a "
               f"send of the same tag.")
    details = _details(d, states)
    details[src].note, details[dst].note = f"tag {s.tag or 0}", f"tag {r.tag or 0}"
    return Finding(fk.TAG_MISMATCH, Severity.ERROR, d.group, None, summary, details, p2p=True,
                   t=d.t)


def divergence_finding(d: Divergence, alignment: Alignment,
                       states: dict[int, RankState]) -> Finding:
    """The finding for one first divergence, with the last matched collective as context."""
    g = alignment.groups.get(d.group)
    if d.kind == fk.MISSING_COLLECTIVE:
        f = _missing(d, g, states)
    elif d.kind == fk.CALLSITE_DIVERGENCE:
        f = _callsite(d, g, states)
    elif d.kind == fk.SPLIT_MISMATCH:
        f = _split(d, g, states)
    elif d.kind == fk.TAG_MISMATCH:
        f = _tag(d, g, states)
    else:
        f = _mismatch(d, g, states)
    f.context = {r: collective_detail(c) for r, c in sorted(d.context.items())}
    f.context_seq = d.seq - 1 if d.seq and d.context else None
    return f


def group_mismatch_finding(g: GroupAlignment, states: dict[int, RankState]) -> Finding:
    """Ranks recorded different member lists for one group name."""
    views: dict[tuple, list[int]] = {}
    for r, members in sorted(g.membership.items()):
        views.setdefault(tuple(members), []).append(r)
    shown = "; ".join(f"{rank_list(rs_)} with {rank_list(list(m)) if m else 'no record of it'}"
                      for m, rs_ in views.items())
    summary = (f"The ranks disagree on who is in group {g.name}: {shown}. The new_group() "
               f"calls ran in different orders or with different rank lists on different "
               f"ranks.")
    details: dict[int, RankDetail] = {}
    t = float("inf")
    for r in sorted(g.membership):
        first = g.at(r, 1)
        if first is not None:
            details[r] = collective_detail(first)
            t = min(t, first.t)
        elif r in states:
            details[r] = elsewhere_detail(states[r])
    return Finding(fk.GROUP_MISMATCH, Severity.ERROR, g.name, None, summary, details, t=t)


def cycle_finding(cycle: list[Wait], alignment: Alignment) -> Finding:
    """Ranks each blocked in a group the next one has not reached: a deadlock."""
    steps = []
    details: dict[int, RankDetail] = {}
    for w in cycle:
        c = w.collective
        where = (f"{group_text(c.group, alignment.members(c.group))}, #{c.seq}"
                 if c.seq is not None else f"{c.op} with rank {w.on}")
        steps.append(f"rank {w.rank} waits in {describe(c)} ({where}) at {site_text(c.site)} "
                     f"for rank {w.on}")
        details[w.rank] = collective_detail(c)
    groups = sorted({w.collective.group for w in cycle})
    where = f"across groups {', '.join(groups)}" if len(groups) > 1 else \
        f"inside {group_text(groups[0], alignment.members(groups[0]))}"
    summary = f"Deadlock {where}: " + "; ".join(steps) + "."
    first = cycle[0].collective
    return Finding(fk.WAIT_CYCLE, Severity.ERROR, first.group, first.seq, summary, dict(sorted(
        details.items())), t=max(w.collective.t for w in cycle))
