"""The diagnosis of a job that is gone, from the logs it left (``ddpdoctor diff`` of a folder of
logs: torchrun's ``--log-dir``, a Slurm ``*.out``): what each rank wrote last, in the
backend's own words, turned into the same :class:`~ddpdoctor.analysis.report.Report`.

Read per rank (the ``[rankN]:`` prefix torchrun puts on a rank's lines, or the rank's folder
in torchrun's log folder):

* its last Python traceback: a rank that raised something other than a transport error is the
  crash the others waited for (``rank_crashed``, at the traceback's user line);
* NCCL's watchdog: ``WorkNCCL(SeqNum=S, OpType=OP, NumelIn=N, ...) ran for ... before timing
  out`` and ``[PG G Rank R] ... at work: S, last enqueued NCCL work: E``: every rank that timed
  out waited in collective S of group G; a rank whose last enqueued work there is below S
  never issued it (``missing_collective``, the rank the others waited for); two ranks timed out
  at one S with another op or size is a mismatch there;
* gloo's ``Timed out waiting ...ms for recv operation``: the rank waited (gloo names no
  collective and no peer).

Logs name no source line of a collective: the report says so, and what would name it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ddpdoctor.analysis import report as rp
from ddpdoctor.analysis.attach import cause_finding
from ddpdoctor.analysis.finding import Finding, RankDetail
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankStatus
from ddpdoctor.analysis.report import RankSummary, Report
from ddpdoctor.analysis.terms import rank_list
from ddpdoctor.analysis.tracebacks import RaisedError, last_error, own_lines, prefixed_ranks
from ddpdoctor.trace.job_logs import LogFile

_WATCHDOG = re.compile(r"WorkNCCL\(SeqNum=(\d+), OpType=(\w+)(?:, NumelIn=(\d+))?")
_WORK = re.compile(r"\[PG (?:ID )?([^\s\]]+)[^\]]*? Rank (\d+)\] (?:Exception \(either an error "
                   r"or timeout\) detected by watchdog at work|Timeout at NCCL work): (\d+), "
                   r"last enqueued NCCL work: (-?\d+)")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")
NO_LINE = ("the logs name no source line of a collective: `ddpdoctor attach` on a job that "
           "still runs, or `ddpdoctor run`, names each rank's line")


@dataclass
class RankLog:
    """What one rank's lines say."""

    rank: int
    error: RaisedError | None = None
    timeouts: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # pg -> seq, op, n
    enqueued: dict[str, int] = field(default_factory=dict)  # pg -> last enqueued work
    gloo_timeout: str = ""


def _rank_text(logs: list[LogFile]) -> dict[int, str]:
    texts: dict[int, list[str]] = {}
    for log in logs:
        ranks = prefixed_ranks(log.text)
        for rank in ranks:
            texts.setdefault(rank, []).append(own_lines(log.text, rank))
        if not ranks and log.rank is not None:
            texts.setdefault(log.rank, []).append(log.text)
    return {rank: "\n".join(parts) for rank, parts in texts.items()}


def read_ranks(logs: list[LogFile]) -> dict[int, RankLog]:
    """Each rank's facts, from every log file given."""
    out: dict[int, RankLog] = {}
    for rank, text in sorted(_rank_text(logs).items()):
        r = RankLog(rank, error=last_error(text))
        ops = {int(m.group(1)): (m.group(2), m.group(3) or "") for m in _WATCHDOG.finditer(text)}
        for m in _WORK.finditer(text):
            pg, seq, enqueued = m.group(1), int(m.group(3)), int(m.group(4))
            op, numel = ops.get(seq, ("?", ""))
            r.timeouts[pg] = (seq, op, numel)
            r.enqueued[pg] = enqueued
        gloo = _GLOO_TIMEOUT.search(text)
        if gloo:
            r.gloo_timeout = gloo.group(0)
        out[rank] = r
    return out


def diagnose_logs(logs: list[LogFile]) -> Report:
    """The report of a finished (dead) job from its logs."""
    ranks = read_ranks(logs)
    notes: list[str] = []
    findings = _findings(ranks, notes)
    if not any(d.site for f in findings for d in f.ranks.values()):
        notes.append(NO_LINE)
    summaries = [RankSummary(rank=r.rank, status=_status(r),
                             detail=r.error.text if r.error else _waited(r))
                 for r in ranks.values()]
    if not ranks:
        notes.insert(0, "no rank's lines were found in these logs ([rankN]: prefixes, or "
                        "torchrun's attempt_N/<rank>/ files)")
    verdict = rp.verdict_of(findings, {}) if findings else rp.Verdict.INCOMPLETE
    return Report(verdict=verdict, world_size=max(ranks, default=-1) + 1, ranks=summaries,
                  findings=findings, notes=notes)


def _status(r: RankLog) -> RankStatus:
    if r.error is not None:
        return RankStatus.EXCEPTION
    return RankStatus.HUNG if r.timeouts or r.gloo_timeout else RankStatus.UNFINISHED


def _waited(r: RankLog) -> str:
    if r.timeouts:
        return "; ".join(f"timed out in collective {seq} ({op}) of group {pg}"
                         for pg, (seq, op, _n) in sorted(r.timeouts.items()))
    return r.gloo_timeout


def _detail(r: RankLog) -> RankDetail:
    state = "exception" if r.error else ("pending" if r.timeouts or r.gloo_timeout
                                         else "running")
    return RankDetail(rank=r.rank, site=r.error.site if r.error else None, state=state,
                      note=r.error.text if r.error else _waited(r))


def _findings(ranks: dict[int, RankLog], notes: list[str]) -> list[Finding]:
    details = {r.rank: _detail(r) for r in ranks.values()}
    crashed = [r for r in ranks.values() if r.error is not None and not r.error.comm]
    if crashed:
        first = crashed[0]
        summary = (f"{rank_list([r.rank for r in crashed])} raised "
                   f"{first.error.text if first.error else ''}; the other ranks' errors and "
                   f"timeouts follow from it")
        return [cause_finding(fk.RANK_CRASHED, summary, details, "rank_crashed")]
    for pg in sorted({pg for r in ranks.values() for pg in r.timeouts}):
        timed = {r.rank: r.timeouts[pg] for r in ranks.values() if pg in r.timeouts}
        seq = max(s for s, _op, _n in timed.values())
        at = {rank: t for rank, t in timed.items() if t[0] == seq}
        kinds = {(op, n) for _s, op, n in at.values()}
        if len(kinds) > 1:
            ops = {op for op, _n in kinds}
            spread = "; ".join(f"rank {rank}: {op} of {n or '?'} elements"
                               for rank, (_s, op, n) in sorted(at.items()))
            kind = fk.OP_MISMATCH if len(ops) > 1 else fk.SHAPE_MISMATCH
            summary = (f"in collective {seq} of group {pg} the ranks timed out in different "
                       f"collectives ({spread})")
            return [cause_finding(kind, summary, details, None, group=pg, seq=seq)]
        # Behind: its own last enqueued work in this group is below seq, or it wrote nothing
        # of waiting anywhere (a rank of another group only, it would have timed out there).
        behind = [r.rank for r in ranks.values() if r.rank not in at and (
            (pg in r.enqueued and r.enqueued[pg] < seq)
            or not (r.timeouts or r.error or r.gloo_timeout))]
        if behind:
            op = next(iter(kinds))[0]
            summary = (f"{rank_list(sorted(at))} timed out in collective {seq} ({op}) of group "
                       f"{pg}, which {rank_list(behind)} never issued: the others waited for "
                       f"{'it' if len(behind) == 1 else 'them'}")
            return [cause_finding(fk.MISSING_COLLECTIVE, summary, details, None, group=pg,
                                  seq=seq)]
        notes.append(f"every rank that wrote NCCL's watchdog lines timed out in collective "
                     f"{seq} of group {pg}: the rank that did not reach it left no line here")
    if any(r.gloo_timeout for r in ranks.values()):
        quiet = [r.rank for r in ranks.values() if not r.gloo_timeout and r.error is None]
        notes.append("gloo timed out on " + rank_list(
            [r.rank for r in ranks.values() if r.gloo_timeout]) + " (gloo names no collective"
            " or peer)" + (f"; {rank_list(quiet)} wrote no timeout: look there first"
                           if quiet else ""))
    return []
