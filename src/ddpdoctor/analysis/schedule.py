"""The collective schedule of a job: what it issues at start-up and in one training iteration.

``ddpdoctor schedule save LOGDIR schedule.yaml`` keeps it; ``ddpdoctor schedule compare`` and
``ddpdoctor run --expect-schedule`` fail when a change adds, removes or reshapes a collective
(an all-reduce added to the training loop, a changed gradient-bucket layout, a new group).

A schedule has two parts per rank, both lists of collectives in issue order, each entry
``group``, ``op``, ``label``, ``shapes``, ``dtypes``, ``reduce_op`` and ``root`` (the last two
where set; compared: the group, the label and the match key, ``signature.match_key``) and
``at`` (the source line, ``file:line`` with the file's base name: shown, never compared):

* ``init``: everything issued before the first DDP forward (DDP construction included);
* ``iteration``: everything issued during one steady-state iteration: DDP iteration 2, the
  first with the bucket layout DDP settles on after its rebuild (iteration 1 when the run had
  only one). Whatever the script issues between two forwards belongs to the iteration before.

Ranks with identical schedules share one entry. Save and compare runs of the same command
(e.g. the same ``--max-steps``): a run cut shorter than the saved iteration differs. Pure
functions on a loaded :class:`~ddpdoctor.trace.model.Run`; YAML through ``yaml.safe_dump`` /
``yaml.safe_load``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ddpdoctor.analysis import yamlfile
from ddpdoctor.analysis.signature import match_key, reduce_op_of
from ddpdoctor.analysis.terms import rank_list
from ddpdoctor.trace.basics import numel
from ddpdoctor.trace.model import Collective, Run

FORMAT = "ddpdoctor-schedule"
# 2: entries carry ``reduce_op`` and ``root`` (a version 1 file is compared without them)
VERSION = 2
STEADY_ITERATION = 2
SECTIONS = ("init", "iteration")


class ScheduleError(Exception):
    """A schedule file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Entry:
    """One collective of a schedule."""

    group: str
    op: str
    label: str
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    at: str = ""  # where it was issued (file base name:line); informative, not compared
    reduce_op: str | None = None
    root: int | None = None

    @property
    def numel(self) -> int:
        return numel(self.shapes)

    @property
    def key(self) -> tuple:
        """What a comparison looks at: where in the job (group, label) and what every rank
        must agree on (the match key)."""
        return (self.group, self.label, match_key(self))

    def options(self) -> str:
        """'reduce op SUM, root 0': the reduce op and root it has, '' for none."""
        reduce = reduce_op_of(self)
        return ", ".join(([f"reduce op {reduce}"] if reduce else [])
                         + ([f"root {self.root}"] if self.root is not None else []))

    def tensors(self) -> str:
        """'float32[410]', 'int32[1] + int32[7]', '' without tensors."""
        return " + ".join(f"{d}[{', '.join(str(n) for n in s)}]"
                          for s, d in zip(self.shapes, self.dtypes))

    def text(self) -> str:
        """'all_reduce ddp.bucket float32[410]', with '(group 1)' outside the default group."""
        tensors = self.tensors()
        group = "" if self.group == "0" else f" (group {self.group})"
        return f"{self.op} {self.label}" + (f" {tensors}" if tensors else "") + group


@dataclass
class RankSchedule:
    """The schedule of one or more ranks that issued exactly the same collectives."""

    ranks: list[int]
    init: list[Entry] = field(default_factory=list)
    iteration: list[Entry] = field(default_factory=list)

    def section(self, name: str) -> list[Entry]:
        return self.init if name == "init" else self.iteration


@dataclass
class Schedule:
    """A job's collective schedule."""

    world_size: int
    iteration: int | None  # which DDP iteration ``iteration`` lists (None: no DDP forward)
    version: int = VERSION  # of the file it was read from
    groups: dict[str, list[int]] = field(default_factory=dict)  # group name -> member ranks
    ranks: list[RankSchedule] = field(default_factory=list)

    def of_rank(self, rank: int) -> RankSchedule | None:
        return next((r for r in self.ranks if rank in r.ranks), None)


# -- from a run ------------------------------------------------------------------------------
def _entry(c: Collective) -> Entry:
    site = c.site
    at = site.short if site else ""
    return Entry(group=c.group, op=c.op, label=c.label,
                 shapes=tuple(tuple(int(n) for n in s) for s in c.shapes),
                 dtypes=tuple(str(d) for d in c.dtypes), at=at, reduce_op=c.reduce_op,
                 root=c.root)


def steady_iteration(run: Run) -> int | None:
    """The iteration a schedule lists: 2 when the run got that far, else 1, else None."""
    # A rank's DDP iteration only grows: its last collectives carry its highest.
    reached = max((c.iteration or 0 for t in run.ranks.values() for c in t.collectives[-64:]),
                  default=0)
    reached = max([reached] + [int((t.exit or {}).get("steps") or 0)
                               for t in run.ranks.values()])
    if reached <= 0:
        return None
    return min(reached, STEADY_ITERATION)


def from_run(run: Run) -> Schedule:
    """The schedule of a loaded run (every rank's traces)."""
    it = steady_iteration(run)
    groups: dict[str, list[int]] = {}
    per_rank: list[tuple[int, list[Entry], list[Entry]]] = []
    for rank in sorted(run.ranks):
        trace = run.ranks[rank]
        for name, group in trace.groups.items():
            if name not in groups:  # a copy per group, not per rank (16,384 ranks share one)
                groups[name] = list(group.ranks)
        init, steady = [], []
        last = it or 0
        for c in trace.collectives:
            iteration = c.iteration or 0
            if iteration > last:
                break  # a rank's DDP iteration only grows: the rest is later iterations
            if iteration == 0:
                init.append(_entry(c))
            elif iteration == it:
                steady.append(_entry(c))
        per_rank.append((rank, init, steady))
    merged: list[RankSchedule] = []
    for rank, init, steady in per_rank:
        keys = ([e.key for e in init], [e.key for e in steady])
        same = next((m for m in merged if ([e.key for e in m.init],
                                           [e.key for e in m.iteration]) == keys), None)
        if same is not None:
            same.ranks.append(rank)
        else:
            merged.append(RankSchedule([rank], init, steady))
    return Schedule(world_size=run.world_size, iteration=it,
                    groups=dict(sorted(groups.items(), key=lambda kv: _group_order(kv[0]))),
                    ranks=merged)


def _group_order(name: str) -> tuple:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


# -- YAML ------------------------------------------------------------------------------------
def _entry_dict(e: Entry) -> dict[str, Any]:
    out: dict[str, Any] = {"group": e.group, "op": e.op, "label": e.label,
                           "shapes": [list(s) for s in e.shapes], "dtypes": list(e.dtypes)}
    if e.reduce_op is not None:
        out["reduce_op"] = e.reduce_op
    if e.root is not None:
        out["root"] = e.root
    if e.at:
        out["at"] = e.at
    return out


def _flow(value: Any) -> str:
    """``value`` as one line of YAML (flow style), through ``yaml.safe_dump``."""
    return yamlfile.dump(value, default_flow_style=True, width=1 << 30,
                         sort_keys=False).strip()


def to_yaml(schedule: Schedule) -> str:
    """The schedule as a YAML document, one collective per line (read by ``yaml.safe_load``)."""
    head = {"format": FORMAT, "version": VERSION, "world_size": schedule.world_size,
            "iteration": schedule.iteration}
    lines = ["# ddpdoctor collective schedule: the collectives the job issues before its first",
             "# DDP forward (init) and during one steady-state DDP iteration. Check a run with",
             "#   ddpdoctor run --expect-schedule FILE ...",
             "#   ddpdoctor schedule compare FILE LOGDIR",
             yamlfile.dump(head, sort_keys=False).rstrip(),
             "groups: " + _flow({name: list(ranks) for name, ranks in schedule.groups.items()}),
             "schedules:" + ("" if schedule.ranks else " []")]
    for r in schedule.ranks:
        lines.append(f"- ranks: {_flow(list(r.ranks))}")
        for name in SECTIONS:
            entries = r.section(name)
            lines.append(f"  {name}:" + ("" if entries else " []"))
            lines.extend(f"  - {_flow(_entry_dict(e))}" for e in entries)
    return "\n".join(lines) + "\n"


def _parse_entry(raw: Any, where: str) -> Entry:
    if not isinstance(raw, dict):
        raise ScheduleError(f"{where}: expected a mapping with group, op, label, shapes, dtypes")
    try:
        shapes = tuple(tuple(int(n) for n in s) for s in raw.get("shapes") or [])
        dtypes = tuple(str(d) for d in raw.get("dtypes") or [])
        reduce_op, root = raw.get("reduce_op"), raw.get("root")
        return Entry(group=str(raw["group"]), op=str(raw["op"]), label=str(raw["label"]),
                     shapes=shapes, dtypes=dtypes, at=str(raw.get("at") or ""),
                     reduce_op=None if reduce_op is None else str(reduce_op),
                     root=None if root is None else int(root))
    except KeyError as exc:
        raise ScheduleError(f"{where}: missing {exc.args[0]!r}") from None
    except (TypeError, ValueError):
        raise ScheduleError(f"{where}: shapes must be lists of integers, root an integer") \
            from None


def from_yaml(text: str, source: str = "schedule") -> Schedule:
    """Parse a schedule written by :func:`to_yaml`; raises :class:`ScheduleError`."""
    try:
        data = yamlfile.load(text, source)
    except ValueError as exc:
        raise ScheduleError(str(exc)) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ScheduleError(f"{source}: not a ddpdoctor schedule (written by "
                            f"'ddpdoctor schedule save')")
    version = data.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ScheduleError(f"{source}: schedule version {version!r}; this ddpdoctor reads "
                            f"version {VERSION} and older")
    try:
        world = int(data.get("world_size") or 0)
        it = data.get("iteration")
        it = None if it is None else int(it)
        groups = {str(k): [int(r) for r in v] for k, v in (data.get("groups") or {}).items()}
    except (TypeError, ValueError, AttributeError):
        raise ScheduleError(f"{source}: bad world_size, iteration or groups") from None
    ranks = []
    for i, raw in enumerate(data.get("schedules") or []):
        if not isinstance(raw, dict) or not isinstance(raw.get("ranks"), list):
            raise ScheduleError(f"{source}: schedules[{i}] needs a list of ranks")
        entry = RankSchedule([int(r) for r in raw["ranks"]])
        for name in SECTIONS:
            items = raw.get(name) or []
            if not isinstance(items, list):
                raise ScheduleError(f"{source}: schedules[{i}].{name} must be a list")
            entry.section(name).extend(_parse_entry(e, f"{source}: schedules[{i}].{name}[{j}]")
                                       for j, e in enumerate(items))
        ranks.append(entry)
    return Schedule(world_size=world, iteration=it, groups=groups, ranks=ranks, version=version)


def load(path: str | Path) -> Schedule:
    """Read a schedule file; raises :class:`ScheduleError` with one line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScheduleError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ScheduleError(f"{path}: not a text file") from None
    return from_yaml(text, str(path))


def save(schedule: Schedule, path: str | Path) -> None:
    """Write a schedule file; raises :class:`ScheduleError` with one line."""
    try:
        Path(path).write_text(to_yaml(schedule), encoding="utf-8")
    except OSError as exc:
        raise ScheduleError(f"cannot write {path}: {exc.strerror or exc}") from None


# -- comparing -------------------------------------------------------------------------------
def _where(section: str, iteration: int | None) -> str:
    return "init" if section == "init" else f"iteration {iteration}"


def _section_diff(expected: list[Entry], actual: list[Entry], label: str) -> list[str]:
    lines: list[str] = []
    matcher = difflib.SequenceMatcher(a=[e.key for e in expected], b=[e.key for e in actual],
                                      autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old, new = expected[i1:i2], actual[j1:j2]
        # The same collectives with other tensors, pairwise from the start: reshaped.
        paired = 0
        while (tag == "replace" and paired < min(len(old), len(new))
               and (old[paired].group, old[paired].op, old[paired].label)
               == (new[paired].group, new[paired].op, new[paired].label)):
            a, b = old[paired], new[paired]
            at = f"  ({b.at})" if b.at else ""
            if a.tensors() != b.tensors():
                lines.append(f"{label} #{j1 + paired + 1}: reshaped {a.text()} -> "
                             f"{b.tensors() or 'no tensors'}{at}")
            else:  # the same tensors: its reduce op or root changed
                lines.append(f"{label} #{j1 + paired + 1}: {a.text()}: "
                             f"{a.options() or 'defaults'} -> {b.options() or 'defaults'}{at}")
            paired += 1
        for k, e in enumerate(old[paired:], start=paired):
            lines.append(f"{label} #{i1 + k + 1}: removed {e.text()}"
                         + (f"  (was {e.at})" if e.at else ""))
        for k, e in enumerate(new[paired:], start=paired):
            lines.append(f"{label} #{j1 + k + 1}: added {e.text()}"
                         + (f"  ({e.at})" if e.at else ""))
    return lines


def _without_options(schedule: Schedule) -> Schedule:
    """The schedule with every entry's reduce op and root left out (as version 1 saved it)."""
    ranks = [RankSchedule(r.ranks, *([replace(e, reduce_op=None, root=None) for e in
                                      r.section(name)] for name in SECTIONS))
             for r in schedule.ranks]
    return replace(schedule, ranks=ranks)


def compare(expected: Schedule, actual: Schedule) -> list[str]:
    """How ``actual`` differs from ``expected``, one line each; empty when it does not.

    Positions (``#n``) count collectives within the section, 1-based, in the actual run
    (in the expected schedule for a removed one). Ranks that differ the same way share lines.
    """
    out: list[str] = []
    if expected.world_size != actual.world_size:
        out.append(f"world size: {expected.world_size} expected, {actual.world_size} in this run")
    if expected.iteration != actual.iteration:
        reached = ("no DDP iteration" if actual.iteration is None
                   else f"only iteration {actual.iteration}")
        out.append(f"the schedule lists iteration {expected.iteration}; this run reached "
                   f"{reached} (compare runs of the same command, e.g. the same --max-steps)")
    for name in sorted(set(expected.groups) | set(actual.groups), key=_group_order):
        want, got = expected.groups.get(name), actual.groups.get(name)
        if want is None:
            out.append(f"group {name}: added (ranks {got})")
        elif got is None:
            out.append(f"group {name}: removed (was ranks {want})")
        elif sorted(want) != sorted(got):
            out.append(f"group {name}: ranks {want} expected, {got} in this run")
    if expected.version < 2:  # its entries hold no reduce op or root: not compared
        actual = _without_options(actual)
    by_diff: dict[tuple[str, ...], list[int]] = {}
    ranks = sorted({r for s in actual.ranks for r in s.ranks}
                   | {r for s in expected.ranks for r in s.ranks})
    for rank in ranks:
        want_s, got_s = expected.of_rank(rank), actual.of_rank(rank)
        if want_s is None or got_s is None:
            why = "not in the saved schedule" if want_s is None else "no trace in this run"
            by_diff.setdefault((why,), []).append(rank)
            continue
        lines: list[str] = []
        for section in SECTIONS:
            label = _where(section, actual.iteration if section != "init" else None)
            lines += _section_diff(want_s.section(section), got_s.section(section), label)
        if lines:
            by_diff.setdefault(tuple(lines), []).append(rank)
    for diff, rs_ in by_diff.items():
        out.append(f"{rank_list(rs_)}:")
        out.extend(f"  {line}" for line in diff[:40])
        if len(diff) > 40:
            out.append(f"  ... and {len(lines) - 40} more differences")
    return out
