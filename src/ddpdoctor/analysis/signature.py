"""Per-collective signatures and the pairwise comparison of two collectives.

A collective's *match key* (:func:`match_key`) holds what every rank must agree on (op,
shapes, dtypes, element count, reduce op, root); its *full key* adds what only should agree
(label and source line). Full keys are interned to small ints, so whole per-rank sequences
compare at C speed and ranks with identical sequences are compared once.
:func:`hard_difference` names the first field of the match key that differs between two
collectives at the same position, :func:`soft_difference` the code they came from, knowing
which differences are legitimate (join shadows, ops whose per-rank sizes may differ).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ddpdoctor.analysis.terms import is_reducing
from ddpdoctor.trace import ops
from ddpdoctor.trace.model import Collective, Site

# Ops whose input sizes legitimately differ per rank (uneven splits): compare dtypes only.
FREE_SHAPE_OPS = ops.UNEVEN

# Label pairs that legitimately meet at one position: a joined rank's shadow of the others'
# DDP collectives (torch.distributed.algorithms.join and DDP's _DDPJoinHook).
COMPATIBLE_LABELS = frozenset({
    frozenset({"join.shadow_bucket", "ddp.bucket"}),
    frozenset({"join.unused_params", "ddp.unused_params"}),
    frozenset({"join.num_nonjoined", "join.notify"}),
    frozenset({"join.terminate", "join.notify"}),
})

# Labels only a joined rank issues, from the join context manager's __exit__: the source line
# of these is the ``with model.join():`` line, and DDP collectives issued from that same line
# on that rank (buffer broadcast, bucket rebuild) are join shadows too.
JOIN_EXIT_LABELS = frozenset({"join.num_nonjoined", "join.terminate", "join.shadow_bucket",
                              "join.unused_params", "join.final_model"})

# Labels of the collectives a DDP training step issues (forward and backward). torch's code
# issues them, so their first user frame is where the user called the model (or backward):
# one line for training and evaluation alike when both go through a shared helper (a
# Trainer's ``_run_batch``). For these the whole recorded call path is compared.
DDP_STEP_LABELS = frozenset({"ddp.buffers", "ddp.bucket", "ddp.unused_params",
                             "ddp.rebuild_buckets", "syncbn"})

SiteKey = tuple[str, int, str]

# The differences :func:`hard_difference` and :func:`soft_difference` name.
OP, SHAPE, DTYPE, REDUCE_OP, ROOT, LABEL, CALLSITE = (
    "op", "shape", "dtype", "reduce_op", "root", "label", "callsite")


def site_key(site: Site | None) -> SiteKey | None:
    """A source line compared across ranks: file *name*, line, function (paths may differ per
    node, e.g. different home folders)."""
    if site is None:
        return None
    return (site.file_name, site.line, site.function)


def path_key(c: Collective) -> tuple[SiteKey | None, ...] | None:
    """The call path of a DDP step collective (the site key of each recorded frame,
    innermost first); None for any other collective, whose first frame says where it is."""
    if c.label not in DDP_STEP_LABELS or not c.stack:
        return None
    return tuple(map(site_key, c.stack))


class Matchable(Protocol):
    """What the match key reads: a recorded :class:`~ddpdoctor.trace.model.Collective`, or a
    saved schedule's entry (``analysis/schedule.py``)."""

    @property
    def op(self) -> str: ...
    @property
    def shapes(self) -> Sequence[Sequence[int]]: ...
    @property
    def numel(self) -> int: ...
    @property
    def dtypes(self) -> Sequence[str]: ...
    @property
    def reduce_op(self) -> str | None: ...
    @property
    def root(self) -> int | None: ...


def reduce_op_of(c: Matchable) -> str | None:
    """The reduce op, with the c10d default (SUM) filled in where the caller passed none."""
    if c.reduce_op is None and is_reducing(c.op):
        return "SUM"
    return c.reduce_op


# Positions in a full key (see Interner.full_id).
KEY_LABEL, KEY_SITE = 6, 7


class Interner:
    """Maps full keys of collectives to small ints (``keys`` maps them back), caching site
    keys per stack object.

    A full key is ``(op, shapes, dtypes, numel, reduce_op, root, label, site_key, path_key)``
    with shapes and dtypes as tuples (a lone tensor's shape and dtype unwrapped) and the reduce
    op defaulted (:func:`reduce_op_of`); :func:`ddpdoctor.analysis.align.full_key` builds it.
    """

    def __init__(self) -> None:
        self.ids: dict[tuple, int] = {}
        self.keys: list[tuple] = []
        self.site_cache: dict[int, tuple[list, SiteKey | None]] = {}

    def site(self, c: Collective) -> SiteKey | None:
        """The site key of ``c.site`` (the user's line: past any library frames before it),
        cached per stack object."""
        stack = c.stack
        hit = self.site_cache.get(id(stack))
        if hit is not None and hit[0] is stack:
            return hit[1]
        key = site_key(c.site)
        self.site_cache[id(stack)] = (stack, key)
        return key


# The fields of a match key, in its order: what every member of a group must agree on.
MATCH_FIELDS = (OP, SHAPE, DTYPE, REDUCE_OP, ROOT)


def match_key(c: Matchable) -> tuple:
    """What every member must agree on, the one definition of it: op, shapes and element
    count (not for ops whose sizes may differ per rank), dtypes, reduce op (the default
    filled in) and root. Two collectives at one position whose keys differ can never match
    (alignment, the launcher's deadlock proof and the node digests all compare these); a
    saved schedule's entry is the same collective as a run's when their groups, labels and
    match keys are equal."""
    shapes = None if c.op in FREE_SHAPE_OPS else (tuple(map(tuple, c.shapes)), c.numel)
    return (c.op, shapes, tuple(c.dtypes), reduce_op_of(c), c.root)


def hard_difference(a: Collective, b: Collective) -> str | None:
    """The first field of the match key that differs (:data:`MATCH_FIELDS`), or None."""
    if a.op != b.op:
        return OP
    for name, x, y in zip(MATCH_FIELDS, match_key(a), match_key(b)):
        if x != y:
            return name
    return None


def soft_difference(a: Collective, b: Collective, join_sites: dict[int, set]) -> str | None:
    """``label`` or ``callsite`` when two matching collectives came from different code.

    ``join_sites`` maps a rank to the source lines of its join-exit collectives: a DDP
    collective issued from such a line is a joined rank's shadow and matches any line.
    """
    if a.label != b.label:
        if frozenset((a.label, b.label)) in COMPATIBLE_LABELS:
            return None
        return LABEL
    if a.label.startswith("join."):
        return None  # the same join step, from the forward on one rank and __exit__ on another
    sa, sb = site_key(a.site), site_key(b.site)
    if sa is None or sb is None:
        return None
    if sa in join_sites.get(a.rank, ()) or sb in join_sites.get(b.rank, ()):
        return None
    if sa != sb or path_key(a) != path_key(b):  # a DDP step reached from different callers
        return CALLSITE
    return None

