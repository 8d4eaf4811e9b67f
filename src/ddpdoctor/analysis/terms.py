"""Words for collectives: what a recorded collective *is*, in DDP terms a user recognises.

``describe`` turns a label plus bucket/iteration into "DDP gradient bucket 2 of iteration 7";
``op_text`` spells the operation itself ("all_reduce SUM float32[244]"); ``rank_list`` (from
:mod:`ddpdoctor.trace.rank_text`, which the reader's notes share) writes rank sets compactly
("ranks 0-3, 7"). Pure functions, no state.
"""

from __future__ import annotations

import re

from ddpdoctor.trace import ops
from ddpdoctor.trace.ddp_sites import ON_BEHALF, USER
from ddpdoctor.trace.model import Collective, Site, is_internal_file
from ddpdoctor.trace.rank_text import rank_list, rank_numbers  # noqa: F401  (the analysis' words)

# What each recorder label means; "{it}" is " of <the iteration phrase>", "{b}" " <bucket>".
_LABELS: dict[str, str] = {
    "ddp.init": "a DDP construction collective",
    "ddp.init.verify_params": "DDP construction: the parameter-shape check",
    "ddp.init.sync_params": "DDP construction: the parameter and buffer broadcast from rank 0",
    "ddp.buffers": "the DDP buffer broadcast{it}",
    "ddp.bucket": "DDP gradient bucket{b}{it}",
    "ddp.unused_params": "the DDP unused-parameter all-reduce{it}",
    "ddp.rebuild_buckets": "the DDP bucket-rebuild broadcast{it}",
    "syncbn": "a SyncBatchNorm collective{it}",
    "join.notify": "the join 'still training' all-reduce{it}",
    "join.grad_sync": "the join gradient-sync check{it}",
    "join.num_nonjoined": "the join all-reduce counting the ranks still training, from a rank "
                          "that has joined",
    "join.terminate": "the join early-termination notice",
    "join.shadow_bucket": "the join shadow of gradient bucket{b}, from a rank that has joined",
    "join.unused_params": "the join shadow of the unused-parameter all-reduce, from a rank that "
                          "has joined",
    "join.final_model": "the join final-model broadcast",
    "join.find_common_rank": "the join authoritative-rank all-reduce",
    # On the user's behalf (runtime/on_behalf.py); "{api}" is the metric's name.
    "lightning.epoch_sync": "Lightning: epoch-end sync of metric '{api}' (self.log, "
                            "sync_dist=True)",
    "lightning.step_sync": "Lightning: step sync of metric '{api}' (self.log, on_step=True, "
                           "sync_dist=True)",
}

# What to change where a framework issued the collective for a call of the user's.
_ON_BEHALF_ADVICE = {
    label: "Lightning issues this collective for `self.log(..., sync_dist=True)` on every rank "
           "that logged the metric: log it on every rank (no rank test around self.log), or "
           "log it on one rank with rank_zero_only=True and without sync_dist"
    for label in ON_BEHALF}

REDUCING_OPS = ops.REDUCING


def on_behalf_advice(label: str | None) -> str | None:
    """What to change in the user's framework call behind a collective labelled ``label``."""
    return _ON_BEHALF_ADVICE.get(label or "")


def iteration_text(iteration: int | None) -> str:
    """'iteration 7', or 'before the first DDP forward' for iteration 0."""
    if iteration is None:
        return "an unknown iteration"
    if iteration == 0:
        return "setup (before the first DDP forward)"
    return f"iteration {iteration}"


def is_reducing(op: str) -> bool:
    """Whether ``op`` carries a reduce operation."""
    return op in REDUCING_OPS


def is_rooted(op: str) -> bool:
    """Whether ``op`` has a root (src/dst) rank."""
    return op in ops.ROOTED


# Installed packages that issue collectives for the user's calls, by the name the user knows.
_FRAMEWORKS = {"accelerate": "Accelerate", "pytorch_lightning": "Lightning",
               "lightning": "Lightning", "lightning_fabric": "Lightning Fabric",
               "transformers": "Transformers", "deepspeed": "DeepSpeed", "composer": "Composer",
               "ignite": "Ignite", "torchmetrics": "TorchMetrics"}
_PACKAGE = re.compile(r"[/\\](?:site|dist)-packages[/\\]([A-Za-z0-9_]+)")


def framework_call(c: Collective) -> str | None:
    """'Accelerate: gather()' when the user's line called into an installed package that
    issued the collective (the library frame just inside the user's frame); else None."""
    for i, site in enumerate(c.stack):
        if not is_internal_file(site.file):
            if i == 0:
                return None
            found = _PACKAGE.search(c.stack[i - 1].file)
            if found is None:
                return None
            package = found.group(1)
            return f"{_FRAMEWORKS.get(package, package)}: {c.stack[i - 1].function}()"
    return None


def describe(c: Collective) -> str:
    """What the collective is for, e.g. 'DDP gradient bucket 2 of iteration 7', or
    'Accelerate: gather() (its all_gather)' for a library call of the user's."""
    template = _LABELS.get(c.label)
    if template is None:
        name = c.api or c.op
        framework = framework_call(c) if c.label == USER else None
        if framework is not None:
            return f"{framework} (its {c.op})"
        inner = f" (its {c.op})" if c.api and c.api != c.op else ""
        return f"user {name}(){inner}"
    # Without a recorded iteration or bucket (a flight-recorder dump) the phrase says less.
    return template.format(it="" if c.iteration is None else f" of {iteration_text(c.iteration)}",
                           b="" if c.bucket is None else f" {c.bucket}", api=c.api)


def tensor_text(shapes: list[list[int]], dtypes: list[str]) -> str:
    """'float32[244]', 'float32[2, 3] + int64[1]'; '' when there are no tensors."""
    parts = []
    for i, shape in enumerate(shapes[:3]):
        dtype = dtypes[i] if i < len(dtypes) else "?"
        parts.append(f"{dtype}[{', '.join(str(d) for d in shape)}]")
    if len(shapes) > 3:
        parts.append(f"... ({len(shapes)} tensors)")
    return " + ".join(parts)


def op_text(c: Collective) -> str:
    """The operation itself: 'all_reduce SUM float32[244]', 'broadcast int64[1] from 0'."""
    words = [c.op]
    if is_reducing(c.op) and c.reduce_op is not None:
        # ddpdoctor records every reducing op's operator; a flight-recorder dump holds none
        words.append(c.reduce_op)
    tensors = tensor_text(c.shapes, c.dtypes)
    if tensors:
        words.append(tensors)
    if c.root is not None and is_rooted(c.op):
        words.append(f"root {c.root}")
    if c.peer is not None:
        words.append(f"{'to' if c.op == 'send' else 'from'} {c.peer}")
    return " ".join(words)


def site_text(site: Site | None) -> str:
    """'train.py:63 in evaluate()' (file name only), or 'an unknown line'."""
    if site is None:
        return "an unknown line"
    return f"{site.short} in {site.function}()"


def group_text(group: str | None, ranks: list[int] | None = None) -> str:
    """'the default group' or 'group 2 (ranks 0-3)'."""
    if group is None:
        return "no group"
    if group == "0":
        return "the default group"
    return f"group {group} ({rank_list(ranks)})" if ranks else f"group {group}"


def signal_name(code: int) -> str:
    """'SIGKILL' for exit code -9 (Python's convention for a signal death)."""
    import signal

    try:
        return signal.Signals(-code).name
    except (ValueError, TypeError):
        return f"signal {-code}"
