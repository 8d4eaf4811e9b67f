"""The real trace writer driven by hand: DDP-like ranks without torch or processes.

:func:`writer_job` plays a job of several ranks through :class:`TraceWriter` (the writer each
rank runs), with gradient buckets that are sometimes still running at a completion batch
(their completion arrives with a later ``done`` record), a logging all-reduce every 50 steps,
one rank that evaluates through DDP alone (seed 000: its two surplus collectives at the end
never complete, since no peer enters them) and, optionally, a second group and point-to-point
ops.
"""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.runtime.writer import TraceWriter
from ddpdoctor.trace import schema

SCRIPT = "/job/train.py"
FWD = ((SCRIPT, 20, "step"), (SCRIPT, 40, "main"))
BWD = ((SCRIPT, 21, "step"), (SCRIPT, 40, "main"))
LOG = ((SCRIPT, 25, "log"), (SCRIPT, 40, "main"))
EVAL = ((SCRIPT, 30, "evaluate"), (SCRIPT, 41, "main"))
BUCKETS = (4096, 2048, 1024)


class _Future:
    def value(self) -> None:
        return None


class _Work:
    """A c10d Work stand-in that completes when told to."""

    def __init__(self, done: bool = True) -> None:
        self.done = done

    def is_completed(self) -> bool:
        return self.done

    def get_future(self) -> _Future:
        return _Future()


class WriterRank:
    """One rank's recorder, reduced to what the writer sees."""

    def __init__(self, path: Path, rank: int, world: int, max_bytes: int | None) -> None:
        self.writer = TraceWriter(str(path), schema.header(rank, "cap-test", 0), rank,
                                  interval=3600, max_bytes=max_bytes)
        self.writer.put({"kind": schema.PROCESS_START, "t": 1.0, "rank": rank, "pid": 100 + rank,
                         "world_size": world})
        self.writer.put({"kind": schema.GROUP, "t": 1.0, "group": "0", "desc": "default_pg",
                         "ranks": list(range(world)), "size": world, "group_rank": rank})
        self.seqs: dict[str, int] = {}
        self.p2p_seq = self.id = 0
        self.t = 1000.0 + rank * 1e-4
        self.iteration = 0
        self.late: list[_Work] = []

    def coll(self, op: str, label: str, numel: int, stack: tuple, *, dtype: str = "float32",
             reduce_op: str | None = None, root: int | None = None, bucket: int | None = None,
             done: bool = True, api: str | None = None, group: str = "0",
             peer: int | None = None, meta: tuple = (), never: bool = False) -> None:
        """One collective (a send/recv when ``peer`` is given), numbered as the recording
        process group numbers it; ``meta``: split sizes or a tag, as the recording group
        passes them; ``never``: it never completes (no peer entered it)."""
        self.id += 1
        self.t += 0.001
        if peer is None:
            seq = self.seqs[group] = self.seqs.get(group, 0) + 1
            p2p_seq = None
        else:
            self.p2p_seq += 1
            seq, p2p_seq = None, self.p2p_seq
        site = self.writer.site(group, op, label, api, (((numel,), f"torch.{dtype}"),),
                                reduce_op, root, peer, stack, meta)
        cid = self.writer.write_at(site, seq, p2p_seq, bucket, self.iteration, self.t)
        assert cid == self.id
        work = _Work(done and not never)
        self.writer.returned(cid, work)
        if not done and not never:
            self.late.append(work)

    def forward(self, stack: tuple = FWD) -> None:
        self.iteration += 1
        self.coll("broadcast", "ddp.buffers", 64, stack, root=0)
        self.coll("broadcast", "ddp.buffers", 1, stack, dtype="int64", root=0)

    def backward(self, pending_first: bool = False, never_last: int = 0) -> None:
        """DDP's bucket all-reduces; the last ``never_last`` of them never complete."""
        for b, n in enumerate(BUCKETS):
            self.coll("all_reduce", "ddp.bucket", n, BWD, reduce_op="SUM", bucket=b,
                      done=not (pending_first and b == 0),
                      never=b >= len(BUCKETS) - never_last)

    def drain(self) -> None:
        with self.writer._lock:
            self.writer._settle()
        for work in self.late:
            work.done = True
        self.late.clear()


def writer_job(folder: Path, max_bytes: int | None, world: int = 3, iterations: int = 400,
               eval_rank: int | None = 1, eval_at: int = 300, hang: bool = False,
               extras: bool = False) -> Path:
    """A DDP-like job on ``world`` ranks; ``eval_rank`` alone evaluates once (seed 000).
    ``extras``: every 10 steps an all-reduce and an all_to_all_single (with its split sizes)
    on a second group of ranks 0 and 1, and a send from rank 0 to rank 1 (tagged)."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = [WriterRank(folder / f"rank-{r}.jsonl", r, world, max_bytes) for r in range(world)]
    if extras:
        for r in ranks[:2]:
            r.writer.put({"kind": schema.GROUP, "t": 1.0, "group": "1", "desc": "undefined",
                          "ranks": [0, 1], "size": 2, "group_rank": r.writer.rank})
    for r in ranks:
        r.coll("broadcast", "ddp.init.sync_params", 9000, FWD[1:], root=0)
    for it in range(1, iterations + 1):
        for r in ranks:
            r.forward()
            # The rank that evaluated through DDP issued two collectives more than its peers:
            # its last two never complete (no peer enters them), as in a real job.
            surplus = 2 if it == iterations and eval_at <= it and r.writer.rank == eval_rank \
                else 0
            r.backward(pending_first=it % 37 == 0, never_last=surplus)
            if it % 50 == 0:
                r.coll("all_reduce", "user", 1, LOG, reduce_op="AVG", api="all_reduce")
            if it == eval_at and r.writer.rank == eval_rank:
                r.forward(EVAL)
            if extras and it % 10 == 0 and r.writer.rank < 2:
                r.coll("all_reduce", "user", 8, LOG, reduce_op="SUM", group="1",
                       api="all_reduce")
                # rows to / from ranks 0 and 1: what one sends the other expects
                rows = tuple(n * 4 for n in ((2, it % 3) if r.writer.rank == 0 else (it % 3, 1)))
                r.coll("all_to_all_single", "user", sum(rows), LOG, group="1",
                       api="all_to_all_single",
                       meta=(("sends", rows), ("recvs", rows), ("row", 4)))
                r.coll("send" if r.writer.rank == 0 else "recv", "user", 4, LOG,
                       peer=1 - r.writer.rank, api="send" if r.writer.rank == 0 else "recv",
                       meta=(("tag", 7),))
            if it % 5 == 0:
                r.drain()
    for r in ranks:
        r.drain()
        if hang and r.writer.rank == eval_rank:
            r.coll("all_reduce", "ddp.bucket", 77, BWD, reduce_op="SUM", bucket=0, done=False)
            r.writer.flush()  # the watchdog's flush when the hang is detected
            r.writer.close([])  # and no exit record
        else:
            r.writer.close([{"kind": schema.EXIT, "t": r.t + 1, "status": "finished",
                             "code": 0}])
    if hang:  # the launcher stopped the job (a trace with no ending is otherwise cut)
        (folder / schema.JOB_FILE).write_text('{"stopped": "hang", "reason": "", "nnodes": 1}')
    return folder


