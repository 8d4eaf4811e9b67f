"""What the rules (:mod:`ddpdoctor.analysis.rules`) and the premises of the causes
(:mod:`ddpdoctor.analysis.premises`) may look at beside a finding: the run, its alignment and
the ranks' endings, with the per-rank facts both ask for, computed once."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.analysis.align import Alignment
from ddpdoctor.analysis.ranks import RankState
from ddpdoctor.analysis.signature import DDP_STEP_LABELS
from ddpdoctor.trace.index import index_of
from ddpdoctor.trace.model import Run, Site


@dataclass
class RuleContext:
    """What the rules may look at; per-rank site sets are computed on first use."""

    run: Run
    alignment: Alignment
    states: dict[int, RankState]
    _ddp_functions: dict[int, set] = field(default_factory=dict)
    _group_sites: dict[tuple[str, int], set] = field(default_factory=dict)

    def ddp_functions(self, rank: int) -> set[tuple]:
        """(file, function) of every function from which ``rank`` issued DDP training-step
        collectives (computed once per rank: a rule asks it of every rank, for every rank)."""
        found = self._ddp_functions.get(rank)
        if found is None:
            found = self._ddp_functions[rank] = {
                (k[0], k[2]) for k in self.alignment.site_keys(rank, DDP_STEP_LABELS)}
        return found

    def group_sites(self, group: str, rank: int) -> set:
        """Source lines (site keys) from which ``rank`` issued collectives in ``group``."""
        key = (group, rank)
        found = self._group_sites.get(key)
        if found is None:
            found = self._group_sites[key] = self.alignment.site_keys(rank, group=group)
        return found

    def ddp_frames(self, rank: int) -> list[Site]:
        """The first user frame of each distinct stack of ``rank``'s DDP training-step
        collectives (the forward and backward lines, with their captured source)."""
        trace = self.run.ranks.get(rank)
        if trace is None:
            return []
        seen: dict[int, Site] = {}
        for c in index_of(trace.collectives).protos:
            if c.label in DDP_STEP_LABELS and c.stack and id(c.stack) not in seen:
                seen[id(c.stack)] = c.stack[0]
        return list(seen.values())

    def bucket_count(self, group: str, rank: int) -> int:
        """How many DDP gradient-bucket all-reduces ``rank`` issued in ``group``."""
        trace = self.run.ranks.get(rank)
        if trace is None:
            return 0
        return sum(1 for c in trace.collectives if c.group == group and c.label == "ddp.bucket")

    def ddp_flags(self) -> dict:
        """The first recorded DDP construction's flags (broadcast_buffers, ...), or {}."""
        for trace in self.run.ranks.values():
            if trace.ddp:
                return trace.ddp[0]
        return {}
