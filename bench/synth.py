"""Synthetic DDP traces at scale, written in the real trace format: ``python bench/synth.py``.

``python bench/synth.py OUT --ranks 256 --collectives 50000`` writes ``OUT/rank-<N>.jsonl`` for
every rank, byte for byte as :mod:`ddpdoctor.runtime.writer` writes them (the same key order,
spacing and number formats; ``tests/unit/test_synth.py`` checks the lines against the writer).
Each rank runs a DDP-like job:

* construction: the parameter-shape check (all-gather + broadcast) and the parameter sync;
* iteration 1: the buffer broadcasts (float32 running stats + int64 counter) and one gradient
  bucket; iteration 2: the two bucket-rebuild broadcasts, then :data:`BUCKETS` buckets per
  iteration from there on;
* a user ``all_reduce`` (loss logging, AVG) every :data:`LOG_EVERY` iterations; every
  :data:`PENDING_EVERY` iterations the first bucket is still running at the next ``done``
  record (every :data:`DONE_EVERY` collectives, as the writer's completion batches), so its
  completion arrives with the one after, as on a real rank;
* one injected divergence: rank ``--diverge-rank`` alone evaluates through the DDP wrapper
  once, about ``--diverge-at`` of the way through (seed 000's story). Its two extra buffer
  broadcasts come from ``evaluate()``; from then on it is two collectives ahead of every other
  rank, ends blocked in its last two (pending, no ``exit`` record), while the others finish.

Ranks other than the diverging one record identical collective sequences (their times and
ranks, in their own records, differ), which is what a real job of identical ranks looks
like.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path

from ddpdoctor.trace import schema
from ddpdoctor.trace.identical import class_lines
from ddpdoctor.trace.shared_ref import SharedRef

SCRIPT = "/work/job/train.py"
BUCKETS = 5
LOG_EVERY = 100
PENDING_EVERY = 50
DONE_EVERY = 45  # collectives between two ``done`` records (the writer batches completions)
BUCKET_SIZES = [272_448, 264_192, 263_168, 262_656, 140_800]
FIRST_BUCKET = sum(BUCKET_SIZES)
PARAMS = FIRST_BUCKET + 1024 + 3

# Call stacks as the labeller records them: (file, line, function), first the user's frame.
_MAIN = (SCRIPT, 88, "main")
_MOD = (SCRIPT, 92, "<module>")
STACKS = {
    "init": ((SCRIPT, 41, "main"), _MOD),
    "fwd": ((SCRIPT, 57, "train_step"), _MAIN, _MOD),
    "bwd": ((SCRIPT, 58, "train_step"), _MAIN, _MOD),
    "log": ((SCRIPT, 63, "log_loss"), _MAIN, _MOD),
    "eval": ((SCRIPT, 71, "evaluate"), _MAIN, _MOD),
}


@dataclass(frozen=True)
class Op:
    """The static part of one collective (what the writer caches per distinct collective)."""

    op: str
    label: str
    shapes: tuple
    dtypes: tuple
    stack: str
    reduce_op: str | None = None
    root: int | None = None
    api: str | None = None
    group: str = "0"


def static_json(op: Op, stack_id: int) -> str:
    """The static fields of a site record, exactly as ``TraceWriter._static_fields``."""
    numel = 0
    for shape in op.shapes:
        n = 1
        for d in shape:
            n *= d
        numel += n
    out = {"group": op.group, "op": op.op, "label": op.label,
           "shapes": [list(s) for s in op.shapes], "dtypes": list(op.dtypes), "numel": numel,
           "stack": stack_id}
    if op.reduce_op is not None:
        out["reduce_op"] = op.reduce_op
    for name in ("api", "root"):
        value = getattr(op, name)
        if value is not None:
            out[name] = value
    return json.dumps(out)[1:-1]


def site_line(site_id: int, static: str) -> str:
    """A site record (format 9), exactly as ``TraceWriter._write_site`` writes it."""
    return f'{{"kind": "{schema.SITE}", "id": {site_id}, {static}}}'


def site_ref(site_id: int) -> str:
    """How a collective line names its site (its last field)."""
    return f'"{schema.SITE_REF}": {site_id}'


def collective_line(cid: int, seq: int, iteration: int, bucket: int | None, ref: str) -> str:
    """One collective line, exactly as ``TraceWriter.write_at`` formats it (``ref``: what
    :func:`site_ref` gives)."""
    extra = "" if bucket is None else f', "bucket": {bucket}'
    return (f'{{"id": {cid}, "kind": "collective", "seq": {seq}, '
            f'"iteration": {iteration}, {ref}{extra}}}')


BUF_F = Op("broadcast", "ddp.buffers", ((1024,),), ("float32",), "fwd", root=0)
BUF_I = Op("broadcast", "ddp.buffers", ((1,),), ("int64",), "fwd", root=0)
EVAL_F = Op("broadcast", "ddp.buffers", ((1024,),), ("float32",), "eval", root=0)
EVAL_I = Op("broadcast", "ddp.buffers", ((1,),), ("int64",), "eval", root=0)
REBUILD = (Op("broadcast", "ddp.rebuild_buckets", ((BUCKETS + 4,),), ("int32",), "fwd", root=0),
           Op("broadcast", "ddp.rebuild_buckets", ((BUCKETS,),), ("int32",), "fwd", root=0))
INIT = (Op("all_gather", "ddp.init.verify_params", ((1,),), ("int64",), "init"),
        Op("broadcast", "ddp.init.verify_params", ((22,),), ("int64",), "init", root=0),
        Op("broadcast", "ddp.init.sync_params", ((PARAMS,),), ("float32",), "init", root=0),
        Op("broadcast", "ddp.init.sync_params", ((1,),), ("int64",), "init", root=0))
FIRST = Op("all_reduce", "ddp.bucket", ((FIRST_BUCKET,),), ("float32",), "bwd", reduce_op="SUM")
BUCKET_OPS = tuple(Op("all_reduce", "ddp.bucket", ((n,),), ("float32",), "bwd", reduce_op="SUM")
                   for n in BUCKET_SIZES)
LOG = Op("all_reduce", "user", ((1,),), ("float32",), "log", reduce_op="AVG", api="all_reduce")


def schedule(n: int, diverge: bool, diverge_at: float,
             log: Op = LOG) -> list[tuple[Op, int, int | None]]:
    """(op, iteration, bucket) of a rank's first ``n`` collectives (``n + 2`` when it diverges:
    the evaluation adds two)."""
    out: list[tuple[Op, int, int | None]] = [(op, 0, None) for op in INIT]
    out += [(BUF_F, 1, None), (BUF_I, 1, None), (FIRST, 1, 0)]
    out += [(REBUILD[0], 2, None), (REBUILD[1], 2, None)]
    iteration = 2
    eval_at = int(n * diverge_at) if diverge else -1
    evaluated = False
    while len(out) < n:
        out += [(BUF_F, iteration, None), (BUF_I, iteration, None)]
        out += [(op, iteration, b) for b, op in enumerate(BUCKET_OPS)]
        if iteration % LOG_EVERY == 0:
            out.append((log, iteration, None))
        iteration += 1
        if not evaluated and 0 <= eval_at <= len(out):
            # the DDP forward of evaluate(): a forward, so the iteration count moves on
            out += [(EVAL_F, iteration, None), (EVAL_I, iteration, None)]
            iteration += 1
            evaluated = True
    return out[:n + 2] if diverge else out[:n]


def rank_lines(rank: int, world: int, n: int, run_id: str, diverge: bool,
               diverge_at: float, t0: float, blank: bool = False,
               block: tuple[str, range] | None = None) -> list[str]:
    """Every line of one rank's trace file; ``blank``: its collective, stack and site lines left
    empty, as in a member file (format 8); ``block``: the rank logs its loss in a group of
    its own block of ranks (name, ranks) instead of the default group."""
    lines = [json.dumps(schema.header(rank, run_id, 0))]
    lines.append(json.dumps({
        "kind": schema.PROCESS_START, "t": t0, "rank": rank, "local_rank": rank % 8,
        "world_size": world, "host": f"node{rank // 8}", "pid": 10_000 + rank,
        "torch": "2.13.0+cpu", "python": "3.11.7", "backend": "gloo",
        "argv": [SCRIPT], "env": {"RANK": str(rank), "WORLD_SIZE": str(world)}}))
    lines.append(json.dumps({"kind": schema.GROUP, "t": t0, "group": "0", "desc": "default_pg",
                             "ranks": list(range(world)), "size": world, "group_rank": rank,
                             "backend": "gloo"}))
    if block is not None:
        lines.append(json.dumps({"kind": schema.GROUP, "t": t0, "group": block[0],
                                 "desc": "undefined", "ranks": list(block[1]),
                                 "size": len(block[1]), "group_rank": rank - block[1][0],
                                 "backend": "gloo"}))
    stack_ids: dict[str, int] = {}
    statics: dict[Op, str] = {}
    sched = schedule(n, diverge, diverge_at,
                     LOG if block is None else dataclasses.replace(LOG, group=block[0]))
    t = t0 + 1.0 + rank * 1e-5
    ddp_logged = False
    still: list[int] = []  # ids the next ``done`` record lists as running
    late: list[int] = []  # slow buckets issued since the last ``done`` record
    issued: list[float] = []  # issue times since the last ``done`` record
    seqs: dict[str, int] = {}  # per group, its last sequence number
    for cid, (op, iteration, bucket) in enumerate(sched, start=1):
        static = statics.get(op)
        if static is None:
            sid = stack_ids.get(op.stack)
            if sid is None:
                sid = stack_ids[op.stack] = len(stack_ids)
                frames = [{"file": f, "line": ln, "function": fn} for f, ln, fn in STACKS[op.stack]]
                lines.append("" if blank else
                             json.dumps({"kind": schema.STACK, "id": sid, "frames": frames}))
            lines.append("" if blank else site_line(len(statics), static_json(op, sid)))
            static = statics[op] = site_ref(len(statics))
        if not ddp_logged and iteration == 1:
            lines.append(json.dumps({
                "kind": schema.DDP_INIT, "t": t, "index": 0, "module": "Net",
                "broadcast_buffers": True, "find_unused_parameters": False,
                "bucket_cap_mb": 1.0, "static_graph": False, "gradient_as_bucket_view": False,
                "parameters": 12, "buffers": 3, "device_ids": [], "group": "0",
                "site": {"file": SCRIPT, "line": 41, "function": "main"}}))
            ddp_logged = True
        t += 0.0011
        last = diverge and cid > len(sched) - 2
        seq = seqs[op.group] = seqs.get(op.group, 0) + 1
        lines.append("" if blank else
                     collective_line(cid, seq, iteration, bucket, static))
        issued.append(round(t, 6))
        if last or (bucket == 0 and iteration % PENDING_EVERY == 0):
            late.append(cid)
        if cid % DONE_EVERY == 0 or cid == len(sched):
            still = [i for i in still if diverge and i > len(sched) - 2] + late
            late = []
            lines.append(json.dumps({"kind": schema.DONE, "t": round(t + 0.0005, 6),
                                     "upto": cid, "pending": still,
                                     schema.ISSUED: [[cid - len(issued) + 1, issued[0],
                                                      [round((t - issued[0]) * 1e6)
                                                       for t in issued]]]}))
            issued = []
    if still and not diverge:
        lines.append(json.dumps({"kind": schema.DONE, "t": round(t + 0.001, 6),
                                 "upto": len(sched), "pending": []}))
    if not diverge:
        lines.append(json.dumps({"kind": schema.EXIT, "t": t + 0.5, "status": "finished",
                                 "code": 0}))
    return lines


def generate(out: str | os.PathLike, ranks: int, collectives: int, diverge_rank: int | None = None,
             diverge_at: float = 0.6, run_id: str = "synth") -> dict:
    """Write ``ranks`` trace files of ``collectives`` collectives each into ``out``.

    Returns what was written: files, bytes, collective records, the diverging rank and the
    sequence number of its first extra collective."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    if diverge_rank is None:
        diverge_rank = ranks // 3
    t0 = 1_790_000_000.0
    total = 0
    first_extra = None
    for rank in range(ranks):
        diverge = rank == diverge_rank
        lines = rank_lines(rank, ranks, collectives, run_id, diverge, diverge_at, t0)
        data = ("\n".join(lines) + "\n").encode()
        (path / schema.trace_filename(rank)).write_bytes(data)
        total += len(data)
        if diverge:
            sched = schedule(collectives, True, diverge_at)
            first_extra = next(i for i, (op, _, _) in enumerate(sched, start=1) if op is EVAL_F)
    return {"files": ranks, "bytes": total, "collectives": ranks * collectives,
            "diverge_rank": diverge_rank, "diverge_seq": first_extra}


def generate_nodes(out: str | os.PathLike, nodes: int, per_node: int, collectives: int,
                   diverge_rank: int | None = None, diverge_at: float = 0.6,
                   run_id: str = "synth", share: bool = True, classes: int = 1,
                   on_node: Callable[[int], None] | None = None) -> dict:
    """Write ``nodes`` folders ``node-<K>`` of ``per_node`` ranks each, as ``ddpdoctor run``
    leaves them once each node's job has ended: with ``share``, every rank whose collective
    lines are those of the node's first such rank is a member file of that rank's
    (:mod:`ddpdoctor.trace.shared_lines`; ``tests/unit/test_shared_lines.py`` checks the bytes
    are what it writes). ``classes``: the ranks fall in that many behaviour classes, blocks of
    whole nodes, each logging its loss in a group of its own block (as tensor- or pipeline-
    parallel groups do). Returns what :func:`generate` returns, and the member files."""
    ranks = nodes * per_node
    size = -(-nodes // classes) * per_node  # ranks in a block
    blocks: list[tuple[str, range] | None] = [None] if classes <= 1 else \
        [(str(j + 1), range(j * size, min(ranks, (j + 1) * size))) for j in range(classes)]
    if diverge_rank is None:
        diverge_rank = ranks // 2
    t0 = 1_790_000_000.0
    total = members = whole = 0
    refs: dict[int, SharedRef] = {}  # per block, the class of its ranks but the diverging
    for node in range(nodes):
        folder = Path(out) / f"node-{node}"
        folder.mkdir(parents=True, exist_ok=True)
        holder = None
        # In the order share_lines reads a folder: by file name (rank-10 before rank-8).
        for rank in sorted(range(node * per_node, (node + 1) * per_node),
                           key=schema.trace_filename):
            diverge = rank == diverge_rank
            j = rank // size if classes > 1 else 0
            block = blocks[j]
            if share and holder is not None and not diverge:
                lines = rank_lines(rank, ranks, collectives, run_id, False, diverge_at, t0,
                                   blank=True, block=block)
                ref = SharedRef(holder, *astuple(refs[j])[1:])
                data = ("\n".join(lines) + "\n").encode() + ref.line()
                members += 1
                whole += len(data) - len(ref.line()) - ref.lines + ref.length
            else:
                lines = rank_lines(rank, ranks, collectives, run_id, diverge, diverge_at, t0,
                                   block=block)
                data = ("\n".join(lines) + "\n").encode()
                if share and not diverge and holder is None:
                    holder = schema.trace_filename(rank)
                    if j not in refs:
                        common, _ = class_lines(data, data.find(b"\n") + 1)
                        refs[j] = SharedRef(holder, common.count(b"\n"), len(common),
                                            zlib.crc32(common))
                whole += len(data)
            (folder / schema.trace_filename(rank)).write_bytes(data)
            total += len(data)
        if on_node is not None:
            on_node(node)
    block = blocks[diverge_rank // size if classes > 1 else 0]
    sched = schedule(collectives, True, diverge_at,
                     LOG if block is None else dataclasses.replace(LOG, group=block[0]))
    default = [op for op, _, _ in sched if op.group == "0"]  # its sequence numbers
    first_extra = default.index(EVAL_F) + 1
    return {"files": ranks, "bytes": total, "collectives": ranks * collectives,
            "diverge_rank": diverge_rank, "diverge_seq": first_extra, "members": members,
            "whole_bytes": whole}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="folder to write rank-<N>.jsonl into")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--collectives", type=int, default=50_000, help="per rank")
    parser.add_argument("--diverge-rank", type=int, default=None,
                        help="the rank that evaluates alone (default: ranks // 3; with "
                             "--nodes, the middle rank)")
    parser.add_argument("--diverge-at", type=float, default=0.6)
    parser.add_argument("--classes", type=int, default=1,
                        help="with --nodes: behaviour classes, blocks of whole nodes that log "
                             "their loss in a group of their own")
    parser.add_argument("--nodes", type=int, default=0,
                        help="write this many node folders (node-<K>) of --ranks ranks each, "
                             "as ddpdoctor run leaves them: identical ranks as member files")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if args.nodes:
        info = generate_nodes(args.out, args.nodes, args.ranks, args.collectives,
                              args.diverge_rank, args.diverge_at, classes=args.classes)
    else:
        info = generate(args.out, args.ranks, args.collectives, args.diverge_rank,
                        args.diverge_at)
    print(f"wrote {info['files']} traces, {info['bytes'] / 1e6:.1f} MB, "
          f"{info['bytes'] / info['collectives']:.0f} bytes per collective, "
          f"divergence on rank {info['diverge_rank']} at #{info['diverge_seq']} "
          f"({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
