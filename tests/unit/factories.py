"""Builders of hand-made traces for the analysis tests: no torch, no processes.

A :class:`TraceBuilder` plays one rank: it numbers collectives per group like the recording
process group does (``seq``; ``p2p_seq`` for send/recv), counts DDP iterations like the
recorder (one per DDP forward or join shadow iteration), and issues the exact collective
sequences torch 2.13 DDP issues on gloo (checked against real traces): construction, forward
(buffer broadcast, bucket rebuild on iteration 2, join notifications), backward (bucket
all-reduces, the ``find_unused_parameters`` int32 used-map), and the joined rank's shadows.
"""

from __future__ import annotations

import os

from ddpdoctor.runtime import source_capture
from ddpdoctor.trace.model import Collective, Group, RankTrace, Run, Site

SCRIPT = "/work/job/train.py"
FWD_LINE, BWD_LINE, JOIN_LINE, INIT_LINE = 20, 21, 18, 12


class Clock:
    """A rank's time source: each call advances one millisecond."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def tick(self) -> float:
        self.now += 0.001
        return self.now


class TraceBuilder:
    """One rank's trace, built call by call."""

    def __init__(self, rank: int, world: int = 2, file: str = SCRIPT,
                 clock: Clock | None = None) -> None:
        self.rank = rank
        self.world = world
        self.file = file
        self.clock = clock or Clock(1000.0)
        self.iteration = 0
        self.bucket = 0
        self._seq: dict[str, int] = {}
        self._p2p: dict[str, int] = {}
        self._id = 0
        self.trace = RankTrace(rank=rank, path=f"rank-{rank}.jsonl",
                               process={"world_size": world, "rank": rank})
        self.trace.groups["0"] = Group("0", "default_pg", list(range(world)))

    # -- primitives --------------------------------------------------------------------------
    def site(self, line: int, function: str = "main", file: str | None = None) -> Site:
        """A frame as the rank records it: with its source captured when the file exists."""
        path = file or self.file
        got = source_capture.capture(path, line) if os.path.isfile(path) else {}
        return Site(path, line, function, text=got.get("text", ""), indent=got.get("indent"),
                    blocks=tuple(tuple(b) for b in got.get("blocks", ())))

    def new_group(self, name: str, ranks: list[int]) -> TraceBuilder:
        if self.rank in ranks:
            self.trace.groups[name] = Group(name, "undefined", list(ranks))
        return self

    def coll(self, op: str, label: str = "user", *, group: str = "0",
             shapes: list[list[int]] | None = None, dtypes: list[str] | None = None,
             reduce_op: str | None = None, root: int | None = None, peer: int | None = None,
             bucket: int | None = None, line: int = 30, function: str = "main",
             file: str | None = None, state: str = "completed", api: str | None = None,
             t: float | None = None) -> Collective:
        """Issue one collective (or send/recv when ``peer`` is given)."""
        if shapes is None:
            shapes = [] if op == "barrier" else [[1]]
        if dtypes is None:
            dtypes = ["float32"] * len(shapes)
        if reduce_op is None and op == "all_reduce" and label in ("user", "ddp.bucket"):
            reduce_op = "SUM"
        numel = 0
        for shape in shapes:
            n = 1
            for d in shape:
                n *= d
            numel += n
        self._id += 1
        seq = p2p_seq = None
        if peer is None:
            seq = self._seq[group] = self._seq.get(group, 0) + 1
        else:
            p2p_seq = self._p2p[group] = self._p2p.get(group, 0) + 1
        if api is None and label == "user":
            api = op
        c = Collective(rank=self.rank, id=self._id, group=group, seq=seq, op=op, label=label,
                       shapes=shapes, dtypes=dtypes, numel=numel, reduce_op=reduce_op,
                       root=root, peer=peer, p2p_seq=p2p_seq, api=api, bucket=bucket,
                       iteration=self.iteration, t=t if t is not None else self.clock.tick(),
                       state=state, stack=[self.site(line, function, file)])
        self.trace.collectives.append(c)
        return c

    def user(self, op: str = "all_reduce", **kw) -> TraceBuilder:
        self.coll(op, "user", **kw)
        return self

    # -- DDP ---------------------------------------------------------------------------------
    def ddp_init(self, *, params: int = 6, numel: int = 276, line: int = INIT_LINE,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False,
                 buffers: bool = True) -> TraceBuilder:
        """DDP construction: parameter-shape check (all-gather + broadcast), state broadcast."""
        self.coll("all_gather", "ddp.init.verify_params", shapes=[[1]], dtypes=["int64"],
                  line=line)
        self.coll("broadcast", "ddp.init.verify_params", shapes=[[params * 3]],
                  dtypes=["int64"], root=0, line=line)
        self.coll("broadcast", "ddp.init.sync_params", shapes=[[numel]], root=0, line=line)
        if buffers:
            self.coll("broadcast", "ddp.init.sync_params", shapes=[[1]], dtypes=["int64"],
                      root=0, line=line)
        self.trace.ddp.append({"kind": "ddp_init", "index": len(self.trace.ddp),
                               "module": "Net", "broadcast_buffers": broadcast_buffers,
                               "buffers": 2 if buffers else 0,
                               "find_unused_parameters": find_unused_parameters,
                               "group": "0", "site": {"file": self.file, "line": line,
                                                      "function": "main"}})
        return self

    def forward(self, *, buffers: bool = True, join: bool = False, rebuild: bool | None = None,
                line: int = FWD_LINE, function: str = "main", authority: int = 0,
                grad: bool = True) -> TraceBuilder:
        """A DDP forward (``_pre_forward``) on a rank that has not joined."""
        self.iteration += 1
        self.bucket = 0
        if join:
            self.coll("all_reduce", "join.notify", reduce_op="SUM", line=line,
                      function=function)
        if rebuild is None:
            rebuild = grad and self.iteration == 2
        if rebuild:
            self.coll("broadcast", "ddp.rebuild_buckets", shapes=[[7]], dtypes=["int32"],
                      root=0, line=line, function=function)
            self.coll("broadcast", "ddp.rebuild_buckets", shapes=[[1]], dtypes=["int32"],
                      root=0, line=line, function=function)
        if buffers:
            root = 0
            if join:
                self.coll("all_reduce", "join.find_common_rank", dtypes=["int64"],
                          reduce_op="MAX", line=line, function=function)
                root = authority
            self.coll("broadcast", "ddp.buffers", shapes=[[32]], root=root, line=line,
                      function=function)
            self.coll("broadcast", "ddp.buffers", shapes=[[1]], dtypes=["int64"], root=root,
                      line=line, function=function)
        if join:
            self.coll("all_reduce", "join.grad_sync", reduce_op="SUM", line=line,
                      function=function)
        return self

    def backward(self, buckets: tuple[int, ...] = (244,), *, unused: int | None = None,
                 line: int = BWD_LINE, function: str = "main",
                 state: str = "completed") -> TraceBuilder:
        """The Reducer's gradient bucket all-reduces (+ the used-parameter map)."""
        for numel in buckets:
            self.coll("all_reduce", "ddp.bucket", shapes=[[numel]], reduce_op="SUM",
                      bucket=self.bucket, line=line, function=function, state=state)
            self.bucket += 1
        if unused is not None:
            self.coll("all_reduce", "ddp.unused_params", shapes=[[unused]], dtypes=["int32"],
                      reduce_op="SUM", line=line, function=function)
        return self

    def step(self, buckets: tuple[int, ...] = (244,), **kw) -> TraceBuilder:
        """One training iteration: forward then backward."""
        unused = kw.pop("unused", None)
        self.forward(**kw)
        return self.backward(buckets, unused=unused)

    def train(self, iterations: int, buckets: tuple[int, ...] = (244,), **kw) -> TraceBuilder:
        for _ in range(iterations):
            self.step(buckets, **kw)
        return self

    # -- join ----------------------------------------------------------------------------------
    def join_shadow(self, buckets: tuple[int, ...] = (244,), *, buffers: bool = True,
                    unused: int | None = None, authority: int = 1, rebuild: bool = False,
                    line: int = JOIN_LINE) -> TraceBuilder:
        """One iteration of a joined rank shadowing the others (``_DDPJoinHook.main_hook``);
        ``rebuild`` when the buckets were not rebuilt yet on this rank."""
        self.coll("all_reduce", "join.num_nonjoined", reduce_op="SUM", line=line)
        self.iteration += 1
        self.bucket = 0
        if rebuild:
            self.coll("broadcast", "ddp.rebuild_buckets", shapes=[[7]], dtypes=["int32"],
                      root=0, line=line)
            self.coll("broadcast", "ddp.rebuild_buckets", shapes=[[1]], dtypes=["int32"],
                      root=0, line=line)
        if buffers:
            self.coll("all_reduce", "join.find_common_rank", dtypes=["int64"], reduce_op="MAX",
                      line=line)
            self.coll("broadcast", "ddp.buffers", shapes=[[32]], root=authority, line=line)
            self.coll("broadcast", "ddp.buffers", shapes=[[1]], dtypes=["int64"],
                      root=authority, line=line)
        self.coll("all_reduce", "join.grad_sync", reduce_op="SUM", line=line)
        for numel in buckets:
            self.coll("all_reduce", "join.shadow_bucket", shapes=[[numel]], reduce_op="SUM",
                      bucket=self.bucket, line=line)
            self.bucket += 1
        if unused is not None:  # recorded without a reduce op: c10d's default (SUM)
            self.coll("all_reduce", "join.unused_params", shapes=[[unused]], dtypes=["int32"],
                      line=line)
        return self

    def join_end(self, *, last_joiner: int = 1, numel: int = 276,
                 line: int = JOIN_LINE) -> TraceBuilder:
        """Leaving ``with model.join():``: no rank left training; final model broadcast."""
        self.coll("all_reduce", "join.num_nonjoined", reduce_op="SUM", line=line)
        self.coll("all_reduce", "join.find_common_rank", dtypes=["int64"], reduce_op="MAX",
                  line=line)
        self.coll("broadcast", "join.final_model", shapes=[[numel]], root=last_joiner,
                  line=line)
        return self

    # -- endings -----------------------------------------------------------------------------
    def finish(self) -> TraceBuilder:
        self.trace.exit = {"kind": "exit", "t": self.clock.tick(), "status": "finished"}
        return self

    def raise_(self, type_: str = "ValueError", message: str = "boom", line: int = 40,
               function: str = "main", internal: bool = False,
               t: float | None = None) -> TraceBuilder:
        """An exception escaped the script at ``line`` (inside torch when ``internal``)."""
        frames = [{"file": self.file, "line": line, "function": function}]
        if internal:
            frames.append({"file": "/usr/lib/python3.11/site-packages/torch/distributed/"
                                   "distributed_c10d.py", "line": 5356, "function": "barrier"})
        self.trace.exception = {"kind": "exception", "t": t or self.clock.tick(),
                                "type": type_, "message": message, "frames": frames}
        self.trace.exit = {"kind": "exit", "t": self.clock.tick(), "status": "exception"}
        return self

    def sys_exit(self, code: int = 1) -> TraceBuilder:
        """The script called sys.exit(code) with a non-zero code."""
        self.trace.exit = {"kind": "exit", "t": self.clock.tick(), "status": "failed",
                           "code": code}
        return self

    def fail_last(self) -> TraceBuilder:
        """The last collective failed (its peer went away)."""
        self.trace.collectives[-1].state = "failed"
        return self

    def pend_last(self) -> TraceBuilder:
        """The last collective never completed."""
        self.trace.collectives[-1].state = "pending"
        return self

    def build(self) -> RankTrace:
        return self.trace


def make_run(*builders: TraceBuilder | RankTrace, world_size: int | None = None,
             exit_codes: dict[int, int] | None = None, stopped_for_hang: bool = False,
             notes: list[str] | None = None) -> Run:
    """A run of the given ranks (world size: the largest given, or ``world_size``)."""
    traces = [b.build() if isinstance(b, TraceBuilder) else b for b in builders]
    ranks = {t.rank: t for t in traces}
    size = world_size or max((t.world_size or 0) for t in traces) or max(ranks) + 1
    return Run(ranks=ranks, world_size=size, notes=list(notes or []),
               exit_codes=dict(exit_codes or {}), stopped_for_hang=stopped_for_hang)


def ranks(world: int) -> list[TraceBuilder]:
    """``world`` builders, each with its own clock from the same start: ranks that issue the
    same number of collectives get about the same times, as ranks in lockstep do."""
    return [TraceBuilder(r, world) for r in range(world)]


def healthy_ddp(world: int = 2, iterations: int = 3, **kw) -> list[TraceBuilder]:
    """Every rank: DDP construction, ``iterations`` training steps, finished."""
    bs = ranks(world)
    for b in bs:
        b.ddp_init().train(iterations, **kw).finish()
    return bs
