"""Rules that recognise the known causes (``knowledge/causes.yaml``) in a diagnosis.

Each rule looks at one finding together with the aligned traces, the ranks' endings and the
recorded DDP flags, and returns evidence sentences when its cause explains the finding (None
otherwise). :data:`RULES` is tried in order; the first match wins, so the more specific
patterns come first (a crash explains a missing collective before anything else does; a join
collective beats uneven inputs; a collective the source shows under ``if rank == 0:`` and a
DDP forward from a function other ranks never ran DDP from beat uneven inputs). Where
the script is readable here, :mod:`ddpdoctor.analysis.source` settles what the trace cannot:
whether a collective sits under a rank test, or after the training loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from ddpdoctor.analysis import premises, source
from ddpdoctor.analysis.details import blocked_text, ended_children_texts, thread_error_texts
from ddpdoctor.analysis.finding import POSITION_KINDS, Finding, RankDetail
from ddpdoctor.analysis.finding import FindingKind as fk
from ddpdoctor.analysis.ranks import RankStatus
from ddpdoctor.analysis.rule_context import RuleContext
from ddpdoctor.analysis.signature import DDP_STEP_LABELS, site_key
from ddpdoctor.analysis.terms import group_text, on_behalf_advice, rank_list, site_text
from ddpdoctor.knowledge import catalog
from ddpdoctor.trace.ddp_sites import BUCKET, is_user_call


def _absent(f: Finding) -> list[int]:
    return [r for r, d in f.ranks.items() if d.op is None]


def _labels(f: Finding) -> set[str]:
    return {d.label for d in f.issued().values() if d.label}


def _rank_test(d: RankDetail) -> str | None:
    """'train.py:44 `if rank == 0:`' when a frame of ``d``'s stack sits in such a block."""
    for site in d.stack or ([d.site] if d.site else []):
        found = source.rank_condition(site)
        if found is not None:
            line, text = found
            return f"{site.file_name}:{line} `{text}`"
    return None


def _after_loop(d: RankDetail, rank: int, ctx: RuleContext) -> bool:
    """Whether a user collective sits after the training loop (less indented than the DDP
    forward in the same function). Without the source, a barrier is taken to be the classic
    synchronisation after the loop and a data-carrying collective not."""
    if d.site is None:
        return False
    mine = source.indent(d.site)
    for site in ctx.ddp_frames(rank):
        if site.file_name == d.site.file_name and site.function == d.site.function:
            theirs = source.indent(site)
            if mine is not None and theirs is not None:
                return mine < theirs
    return mine is None and d.op == "barrier"


# What an exception says when the machine has no GPU, and when DDP's construction check finds
# that the ranks' models differ (torch.distributed.utils._verify_param_shape_across_processes).
_NO_GPU = re.compile(r"not compiled with CUDA|no CUDA GPUs are available|found no NVIDIA driver"
                     r"|ProcessGroupNCCL is only supported with GPUs|no GPUs found"
                     r"|CUDA driver initialization failed|CUDA is not available"
                     r"|requires CUDA support"  # torch.cuda.Stream, Event on a CPU build
                     r"|has no attribute '_cuda_"  # torch.cuda.* on a CPU-only build of torch
                     r"|doesn't have NCCL built in|NCCL is not available"
                     r"|(needs|requires) (a )?GPUs?\b", re.I)
# NCCL refuses two ranks of one communicator on one GPU (ncclInvalidUsage).
_SHARED_GPU = re.compile(r"Duplicate GPU detected|both on CUDA device", re.I)
_MODEL_MISMATCH = re.compile(r"appears not to match|DDP expects same model across all ranks",
                             re.I)


def _exceptions(f: Finding, ctx: RuleContext) -> Iterator[tuple[int, str]]:
    """(rank, message) of the ranks of a primary crash that raised."""
    if f.kind != fk.RANK_CRASHED or f.follow_on:
        return
    for r in f.ranks:
        s = ctx.states.get(r)
        if s is not None and s.status == RankStatus.EXCEPTION and s.trace is not None:
            yield r, str((s.trace.exception or {}).get("message", ""))


def _first_line(message: str) -> str:
    return (message.strip().splitlines() or [""])[0][:300]


def _cpu_mode(ctx: RuleContext, rank: int) -> bool:
    trace = ctx.states[rank].trace
    return trace is not None and trace.cpu_mode


def _cuda_failures(f: Finding, ctx: RuleContext, cpu_mode: bool) -> list[str] | None:
    """The ranks that failed on touching CUDA, when they ran in CPU mode or not as asked."""
    hits = [(r, m) for r, m in _exceptions(f, ctx)
            if _NO_GPU.search(m) and _cpu_mode(ctx, r) == cpu_mode]
    if not hits:
        return None
    r, message = hits[0]
    where = ctx.states[r].crash_site
    at = f" at {site_text(where)}" if where else ""
    return [f"{rank_list([h[0] for h in hits])} failed{at}: {_first_line(message)}"]


def _no_gpu(f: Finding, ctx: RuleContext) -> list[str] | None:
    evidence = _cuda_failures(f, ctx, cpu_mode=False)
    return evidence and evidence + [
        "this machine has no usable GPU; `ddpdoctor run --cpu` runs the script on the CPU"]


def _cpu_mode_unmapped(f: Finding, ctx: RuleContext) -> list[str] | None:
    evidence = _cuda_failures(f, ctx, cpu_mode=True)
    return evidence and evidence + [
        "the job ran with --cpu: this use of CUDA is one CPU mode does not map"]


def _shared_gpu(f: Finding, ctx: RuleContext) -> list[str] | None:
    hits = [(r, m) for r, m in _exceptions(f, ctx) if _SHARED_GPU.search(m)]
    if not hits:
        return None
    line = next((ln.strip() for ln in hits[0][1].splitlines() if _SHARED_GPU.search(ln)),
                _first_line(hits[0][1]))
    return [f"NCCL refused {rank_list([h[0] for h in hits])}: {line[:300]}"]


def _ddp_init_mismatch(f: Finding, ctx: RuleContext) -> list[str] | None:
    hits = [(r, m) for r, m in _exceptions(f, ctx) if _MODEL_MISMATCH.search(m)]
    if not hits:
        return None
    r, message = hits[0]
    return [f"DDP's construction check failed on {rank_list([h[0] for h in hits])}: "
            f"{_first_line(message)}"]


# -- rules ----------------------------------------------------------------------------------
def _rank_crashed(f: Finding, ctx: RuleContext) -> list[str] | None:
    if f.kind == fk.RANK_CRASHED and not f.follow_on:
        return []
    if f.kind == fk.MISSING_COLLECTIVE:
        absent = _absent(f)
        if absent and all(ctx.states[r].crashed and not ctx.states[r].torn_down
                          for r in absent):
            return [f"{rank_list(absent)} crashed before issuing it"]
    return None


def _blocked_outside_collectives(f: Finding, ctx: RuleContext) -> list[str] | None:
    """The rank the others waited for was outside collectives in its own code until the
    launcher tore it down (a dead producer thread, a lock): where it was, and what died."""
    if f.kind != fk.MISSING_COLLECTIVE:
        return None
    absent = _absent(f)
    if not absent or not all(ctx.states[r].torn_down for r in absent):
        return None
    evidence = []
    for r in absent:
        evidence.append(f"rank {r} {blocked_text(ctx.states[r])}")
        evidence.extend(thread_error_texts(ctx.states[r]))
        evidence.extend(ended_children_texts(ctx.states[r]))
    return evidence


def _stuck_in_user_code(f: Finding, ctx: RuleContext) -> list[str] | None:
    """The rank the launcher found idle at one place: the threads of it that died."""
    if f.kind != fk.RANK_STUCK:
        return None
    return [text for r in f.ranks if r in ctx.states
            for text in thread_error_texts(ctx.states[r]) + ended_children_texts(ctx.states[r])]


def _cycle_groups(f: Finding) -> list[str] | None:
    """The groups a wait cycle's ranks are blocked in (None for another finding)."""
    if f.kind != fk.WAIT_CYCLE:
        return None
    return sorted({d.group for d in f.ranks.values() if d.group is not None})


def _group_order_inversion(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A wait cycle (its premise, two groups or more, is checked with the others')."""
    groups = _cycle_groups(f)
    if groups is None:
        return None
    return [f"the ranks are blocked in groups {', '.join(groups)}"]


def _p2p_peer_mismatch(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A wait cycle (premises: one group, every rank in a send or a recv)."""
    groups = _cycle_groups(f)
    if not groups:
        return None
    waits = "; ".join(f"rank {r} in {d.op}" + (f" at {site_text(d.site)}" if d.site else "")
                      for r, d in sorted(f.ranks.items()))
    return [f"one group ({group_text(groups[0])}), point-to-point ops only: {waits}"]


def _collective_inside_join(f: Finding, ctx: RuleContext) -> list[str] | None:
    if f.kind not in POSITION_KINDS:
        return None
    issued = f.issued()
    user = [r for r, d in issued.items() if is_user_call(d.label)]
    joined = [r for r, d in issued.items() if d.label and d.label.startswith("join.")]
    if not user or not joined:
        return None
    d = issued[user[0]]
    return [f"{rank_list(user)} called {d.op} at {site_text(d.site)} while "
            f"{rank_list(joined)} ran the join protocol ({issued[joined[0]].label})"]


def _ddp_position(f: Finding) -> tuple[dict[int, RankDetail], list[int]] | None:
    """(ranks with a DDP step collective here, the other ranks) when no join is involved."""
    if f.kind not in POSITION_KINDS:
        return None
    labels = _labels(f)
    if any(label.startswith("join.") for label in labels):
        return None
    ddp = {r: d for r, d in f.issued().items() if d.label in DDP_STEP_LABELS}
    if not ddp:
        return None
    return ddp, [r for r in f.ranks if r not in ddp]


def _function_of(d: RankDetail) -> tuple | None:
    key = site_key(d.site) if d.site is not None else None
    return (key[0], key[2]) if key is not None else None


def _rank_conditional_ddp_forward(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A DDP collective issued from a function the other ranks never ran DDP from (seed 000's
    ``evaluate()``), or one the source shows under ``if rank == 0:``."""
    found = _ddp_position(f)
    if found is None:
        return None
    ddp, _others = found
    lacking: dict[tuple, list[int]] = {}  # (file, function) -> ranks never running DDP there
    for r, d in ddp.items():
        key = site_key(d.site)
        if key is None:
            continue
        test = _rank_test(d)
        function = (key[0], key[2])
        if function not in lacking:  # once per function, not per rank: 1024 ranks agree
            # A rank that is in that function here itself (it called something else there
            # first) says nothing about where DDP runs.
            lacking[function] = [o for o in f.ranks if ctx.states[o].trace is not None
                                 and function not in ctx.ddp_functions(o)
                                 and _function_of(f.ranks[o]) != function]
        strangers = [o for o in lacking[function] if o != r]
        if not strangers and not test:
            continue
        if strangers:
            evidence = [f"rank {r} ran a DDP forward/backward at {site_text(d.site)}, a "
                        f"function from which {rank_list(strangers)} never ran one"]
        else:
            evidence = [f"rank {r} ran a DDP forward/backward at {site_text(d.site)}"]
        if test:
            evidence.append(f"it runs under {test}")
        if d.label == BUCKET:
            evidence.append(f"rank {r}'s collective is a gradient bucket: its extra DDP step "
                            "ran a backward, a training step on some ranks only")
        flags = ctx.ddp_flags()
        # A model without buffers broadcasts none (pytorch/examples' ddp/example.py); traces
        # that do not say how many it had are taken to have some.
        if flags.get("broadcast_buffers") and flags.get("buffers") != 0:
            evidence.append("broadcast_buffers=True: every DDP forward broadcasts the "
                            "module buffers, even under torch.no_grad()")
        return evidence
    return None


def _bucket_meets_user(f: Finding) -> tuple[int, RankDetail, int, RankDetail] | None:
    """(rank, detail) of a gradient bucket and of a user collective meeting at a mismatch."""
    if f.kind not in (fk.SHAPE_MISMATCH, fk.OP_MISMATCH, fk.DTYPE_MISMATCH):
        return None
    issued = f.issued()
    bucket = next(((r, d) for r, d in issued.items() if d.label == "ddp.bucket"), None)
    user = next(((r, d) for r, d in issued.items() if is_user_call(d.label)), None)
    if bucket is None or user is None:
        return None
    return bucket[0], bucket[1], user[0], user[1]


def _rank_dependent_no_sync(f: Finding, ctx: RuleContext) -> list[str] | None:
    """In the same DDP iteration one rank all-reduced its gradients and another did not."""
    found = _bucket_meets_user(f)
    if found is None:
        return None
    b, bd, u, ud = found
    if bd.iteration is None or bd.iteration != ud.iteration:
        return None
    return [f"in iteration {bd.iteration} rank {b} all-reduced its gradients at "
            f"{site_text(bd.site)} while rank {u}'s backward of that iteration synchronised "
            f"nothing: it ran under no_sync() (or with require_backward_grad_sync off) and went "
            f"on to {ud.op} at {site_text(ud.site)}"]


def _skipped_collective(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A rank is one DDP iteration ahead because it skipped a collective it issues in other
    iterations (a rank-local ``continue``, a NaN check, ``if loss is None``)."""
    found = _bucket_meets_user(f)
    if found is None or f.group is None:
        return None
    b, bd, u, ud = found
    key = site_key(ud.site)
    if bd.iteration is None or ud.iteration is None or bd.iteration <= ud.iteration or \
            key is None or key not in ctx.group_sites(f.group, b) or _after_loop(ud, u, ctx):
        return None
    return [f"rank {b} issued the collective at {site_text(ud.site)} in earlier iterations "
            f"but skipped it in iteration {ud.iteration}, and went on to the gradient "
            f"all-reduce of iteration {bd.iteration}"]


def _counts(ranks: set[int], ctx: RuleContext) -> str:
    """'rank 0: 5, rank 1: 6' or 'ranks 0-8, 10-15: 3; rank 9: 2'."""
    by_count: dict[int, list[int]] = {}
    for r in sorted(ranks):
        by_count.setdefault(ctx.states[r].iterations, []).append(r)
    if all(len(rs_) == 1 for rs_ in by_count.values()):
        return ", ".join(f"rank {r}: {ctx.states[r].iterations}" for r in sorted(ranks))
    return "; ".join(f"{rank_list(rs_)}: {n}" for n, rs_ in by_count.items())


def _uneven_inputs(f: Finding, ctx: RuleContext) -> list[str] | None:
    found = _ddp_position(f)
    if found is not None:
        ddp, others = found
        longest = max((d.iteration or 0) for d in ddp.values())
        short = [o for o in others if ctx.states[o].trace is not None]
        for o in short:
            d = f.ranks[o]
            if d.op is not None and is_user_call(d.label) and not _after_loop(d, o, ctx):
                return None  # a collective inside the loop body: rank-conditional, not uneven
        if short and all(ctx.states[o].iterations < longest for o in short):
            return [f"DDP iterations per rank: {_counts(set(ddp) | set(short), ctx)}"]
        if short and f.group is not None and all(d.iteration is None for d in ddp.values()):
            # No iterations recorded (a flight-recorder dump): count the gradient all-reduces.
            counts = {r: ctx.bucket_count(f.group, r) for r in set(ddp) | set(short)}
            if min(counts[r] for r in ddp) > max(counts[o] for o in short):
                return ["DDP gradient all-reduces per rank: " + ", ".join(
                    f"rank {r}: {n}" for r, n in sorted(counts.items()))]
        if not short and len({d.iteration for d in ddp.values()}) > 1:
            return ["the ranks were in different DDP iterations at this collective"]
        return None
    if f.kind != fk.MISSING_COLLECTIVE or f.group is None:
        return None
    absent = _absent(f)
    if not absent or not all(ctx.states[r].status == RankStatus.FINISHED for r in absent):
        return None
    for d in f.issued().values():
        key = site_key(d.site)
        if key is None or any(key not in ctx.group_sites(f.group, r) for r in absent):
            return None
    return [f"{rank_list(absent)} ran the same line fewer times and finished"]


def _collective_under_rank_test(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A user collective on some ranks that the source shows inside ``if rank == 0:`` (met
    by another collective, or by a DDP collective of the same op with other shapes)."""
    issued = f.issued()
    meets_ddp = f.kind in (fk.SHAPE_MISMATCH, fk.DTYPE_MISMATCH) and \
        len({d.label for d in issued.values()}) > 1
    if f.kind not in (fk.OP_MISMATCH, fk.MISSING_COLLECTIVE, fk.CALLSITE_DIVERGENCE) and \
            not meets_ddp:
        return None
    for r, d in issued.items():
        if is_user_call(d.label):
            test = _rank_test(d)
            if test:
                return [f"rank {r} called {d.op} at {site_text(d.site)}, under {test}"]
    return None


def _skipped_user_collective(f: Finding, ctx: RuleContext) -> list[str] | None:
    """Premises: a user collective that some ranks issued here and the others did not (they
    issued something else, or nothing), no rank test around it, and the others had issued it
    from the same line before: no `if rank == 0:` keeps them from it, so each rank decided on
    its own data. (Two lines that differ in shape too: one rank's statistics met another's
    gradients, not a tensor sized by the rank.)"""
    if f.kind not in (fk.OP_MISMATCH, fk.MISSING_COLLECTIVE, fk.CALLSITE_DIVERGENCE,
                      fk.SHAPE_MISMATCH, fk.DTYPE_MISMATCH) or f.group is None:
        return None
    user = {r: d for r, d in f.issued().items() if is_user_call(d.label)}
    if not user or any(_rank_test(d) for d in user.values()):
        return None
    for r, d in sorted(user.items()):
        key = site_key(d.site)
        rest = [o for o, od in sorted(f.ranks.items())
                if o != r and (od.op is None or site_key(od.site) != key)]
        if key is not None and rest and all(key in ctx.group_sites(f.group, o) for o in rest):
            return [f"{rank_list(rest)} had issued {d.op} at {site_text(d.site)} before, so "
                    f"no rank test keeps {'it' if len(rest) == 1 else 'them'} from it; here "
                    f"rank {r} issued it and {rank_list(rest)} did not"]
    return None


def _rank_conditional_collective(f: Finding, ctx: RuleContext) -> list[str] | None:
    if f.kind not in (fk.OP_MISMATCH, fk.MISSING_COLLECTIVE, fk.CALLSITE_DIVERGENCE):
        return None
    issued = f.issued()
    user = {r: d for r, d in issued.items() if is_user_call(d.label)}
    if not user:
        return None
    without = [r for r in f.ranks if r not in user]
    # Ranks by the call they made: (op, site) -> ranks, in rank order.
    calls: dict[tuple[str | None, str], list[int]] = {}
    for r, d in sorted(user.items()):
        calls.setdefault((d.op, site_text(d.site)), []).append(r)
    if len(calls) > 1:  # each rank made a call of its own: name each
        return ["; ".join(f"{rank_list(rs_)} called {op} at {where}"
                          for (op, where), rs_ in calls.items())]
    if without:
        (op, where), rs_ = next(iter(calls.items()))
        return [f"{rank_list(rs_)} called {op} at {where}; {rank_list(without)} did not call "
                f"it there"]
    return None


def _rank_dependent_shape(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A shape mismatch (premises: the script's own calls, shapes that differ)."""
    return [] if f.kind == fk.SHAPE_MISMATCH else None


def _rank_dependent_dtype(f: Finding, ctx: RuleContext) -> list[str] | None:
    """A dtype mismatch (premises: the script's own calls, one shape, other dtypes)."""
    issued = f.issued()
    if f.kind != fk.DTYPE_MISMATCH:
        return None
    by_dtype: dict[str, list[int]] = {}
    for r, d in sorted(issued.items()):
        by_dtype.setdefault(",".join(d.dtypes) or "?", []).append(r)
    return ["; ".join(f"{rank_list(rs_)} passed {dtype}" for dtype, rs_ in by_dtype.items())
            + " tensors of the same shape"]


def _ddp_model_mismatch(f: Finding, ctx: RuleContext) -> list[str] | None:
    if f.kind not in (fk.SHAPE_MISMATCH, fk.DTYPE_MISMATCH):
        return None
    labels = _labels(f)
    if labels and all(lb.startswith("ddp.") for lb in labels):
        what = "size" if f.kind == fk.SHAPE_MISMATCH else "dtype"
        return [f"the DDP collectives ({', '.join(sorted(labels))}) differ in {what} between "
                f"ranks"]
    return None


def _broadcast_root_mismatch(f: Finding, ctx: RuleContext) -> list[str] | None:
    return [] if f.kind == fk.ROOT_MISMATCH else None


def _rank_dependent_reduce_op(f: Finding, ctx: RuleContext) -> list[str] | None:
    return [] if f.kind == fk.REDUCE_OP_MISMATCH else None


Rule = Callable[[Finding, RuleContext], "list[str] | None"]


def _kind(kind: str) -> Rule:
    """A rule for a finding kind that has only one cause (what the kind's finding says is the
    evidence)."""
    return lambda f, ctx: [] if f.kind == kind else None


RULES: list[tuple[str, Rule]] = [
    ("gloo_teardown_abort", _kind(fk.TEARDOWN_ABORT)),
    ("rank_stuck_in_user_code", _stuck_in_user_code),
    ("rank_never_initialised", _kind(fk.INIT_INCOMPLETE)),
    ("cpu_mode_unmapped", _cpu_mode_unmapped),
    ("no_gpu", _no_gpu),
    ("shared_gpu", _shared_gpu),
    ("ddp_model_mismatch", _ddp_init_mismatch),
    ("rank_crashed", _rank_crashed),
    ("rank_blocked_outside_collectives", _blocked_outside_collectives),
    ("p2p_peer_mismatch", _p2p_peer_mismatch),
    ("group_order_inversion", _group_order_inversion),
    ("collective_inside_join", _collective_inside_join),
    ("rank_conditional_collective", _collective_under_rank_test),
    ("rank_conditional_ddp_forward", _rank_conditional_ddp_forward),
    ("rank_dependent_no_sync", _rank_dependent_no_sync),
    ("data_dependent_skip", _skipped_collective),
    ("uneven_inputs", _uneven_inputs),
    ("data_dependent_skip", _skipped_user_collective),
    ("rank_conditional_collective", _rank_conditional_collective),
    ("rank_dependent_shape", _rank_dependent_shape),
    ("rank_dependent_dtype", _rank_dependent_dtype),
    ("ddp_model_mismatch", _ddp_model_mismatch),
    ("broadcast_root_mismatch", _broadcast_root_mismatch),
    ("rank_dependent_split_sizes", _kind(fk.SPLIT_MISMATCH)),
    ("p2p_tag_mismatch", _kind(fk.TAG_MISMATCH)),
    ("rank_dependent_reduce_op", _rank_dependent_reduce_op),
]


def recognise(f: Finding, ctx: RuleContext) -> tuple[str | None, list[str]]:
    """The id of the first cause whose rule matches ``f``, with its evidence."""
    if f.cause is not None:
        return f.cause, f.evidence
    holes = [r for r in f.ranks if r in ctx.states and ctx.states[r].unrecorded_call
             and f.ranks[r].op is None]
    if holes:
        # A rank the finding says issued nothing here was inside a torch.distributed call
        # the record does not hold: any cause would rest on a premise the evidence denies.
        return None, [f"rank {r} was inside {ctx.states[r].unrecorded_call} at the hang, a call "
                      f"ddpdoctor's record does not hold: what it waited for there is not "
                      f"known, so no cause is given" for r in holes]
    refuted: list[str] = []
    for cause_id, rule in RULES:
        evidence = rule(f, ctx)
        if evidence is None:
            continue
        cause = catalog.get(cause_id)
        against = premises.denied(cause.premises if cause else (), f, ctx)
        if against:
            # The pattern is there, but the story behind it is not: the next rule may fit.
            refuted.append(f"not {cause_id}: it needs that {against[0]}, and the record "
                           f"shows otherwise")
            continue
        advice = {on_behalf_advice(d.label) for d in f.issued().values()} - {None}
        return cause_id, evidence + sorted(a for a in advice if a)
    return None, refuted
