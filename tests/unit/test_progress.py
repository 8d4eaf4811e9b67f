"""The launcher's hang rules on hand-written trace lines: busy is not waiting, provable
mismatches are called at once, a stuck rank needs its own timeout, a cut trace blinds nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ddpdoctor.analysis.hang_rules import SETTLE
from ddpdoctor.launch.job import _someone_waits
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.runtime.progress import ProgressBlock
from ddpdoctor.trace import schema
from ddpdoctor.trace.progress_block import WAITED
from ddpdoctor.trace.schema import Stop

HANG, DEADLOCK, STUCK = Stop.HANG, Stop.DEADLOCK, Stop.STUCK

T0 = 1000.0


class Rank:
    """Appends one rank's records to its trace file and keeps its progress block, as the
    writer would (the block through the rank's own ProgressBlock)."""

    def __init__(self, folder: Path, rank: int, world: int = 2) -> None:
        self.path = folder / f"rank-{rank}.jsonl"
        self.rank, self.id = rank, 0
        self.seq: dict[str, int] = {}
        self.sites: dict[tuple, int] = {}
        self.block = ProgressBlock(str(self.path), schema.header(rank, "r", 0))
        self.running: dict[int, dict] = {}  # what the block lists as still running
        self.completed = 0
        self._write({**schema.header(rank, "r", 0)},
                    {"kind": "process_start", "rank": rank, "world_size": world, "pid": 1},
                    {"kind": "stack", "id": 0, "frames": [self.frame]})

    @property
    def frame(self) -> dict:
        return {"file": "t.py", "line": 5 + self.rank, "function": "f"}

    def _write(self, *records: dict) -> None:
        with open(self.path, "a") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
        for rec in records:
            if rec.get("kind") == "collective":
                inline = {k: v for k, v in rec.items() if k not in ("stack", "t", "rank")}
                self._issued({**inline, "frames": [self.frame]})
            else:
                self.block.note(rec)

    def _issued(self, rec: dict) -> None:
        self.running[rec["id"]] = rec
        if rec.get("seq") is not None:
            self.seq[rec["group"]] = rec["seq"]
        self._tell()

    def _tell(self) -> None:
        last = self.running[max(self.running)] if self.running else {}
        self.block.progressed(self.id, self.completed, 1,
                              f"{last.get('op', '')} ({last.get('label', '')})", None,
                              dict(self.seq), [json.dumps(r) for r in self.running.values()],
                              len(self.running))

    def coll(self, op: str = "all_reduce", shape: int = 4, group: str = "0") -> int:
        self.id += 1
        seq = self.seq.get(group, 0) + 1
        static = {"group": group, "op": op, "label": "user", "shapes": [[shape]],
                  "dtypes": ["float32"], "numel": shape}
        site = self.sites.get((group, op, shape))
        lines = []
        if site is None:  # its static part, once (format 9)
            site = self.sites[(group, op, shape)] = len(self.sites)
            lines.append({"kind": "site", "id": site, **static, "stack": 0})
        line = {"id": self.id, "kind": "collective", "seq": seq, "iteration": 1, "site": site}
        with open(self.path, "a") as fh:
            fh.write("".join(json.dumps(rec) + "\n" for rec in (*lines, line)))
        self._issued({**line, **static, "frames": [self.frame]})
        return self.id

    def done(self, *pending: int) -> None:
        self._write({"kind": "done", "t": T0, "upto": self.id, "pending": list(pending)})
        for cid in [c for c in self.running if c not in pending]:
            del self.running[cid]
            self.completed += 1
        self._tell()

    def activity(self, t: float, cpu_rate: float, function: str = "save",
                 io_rate: int | None = 0, **extra: object) -> None:
        rec = {"kind": "activity", "t": t, "quiet_since": T0, "cpu": 1.0,
               "cpu_rate": cpu_rate, "pending": 0,
               "frames": [{"file": "t.py", "line": 88, "function": function}], **extra}
        if io_rate is not None:
            rec["io_rate"] = io_rate
        self._write(rec)


def _job(tmp_path: Path) -> tuple[JobProgress, Rank, Rank]:
    return JobProgress(str(tmp_path)), Rank(tmp_path, 0), Rank(tmp_path, 1)


def test_a_busy_rank_keeps_the_job_alive(tmp_path: Path) -> None:
    """Rank 0 saves a checkpoint (or downloads a data set): no CPU to speak of, but it writes;
    rank 1 waits in a barrier meanwhile. That is never stopped."""
    job, r0, r1 = _job(tmp_path)
    r0.coll(), r1.coll()
    r0.done(), r1.done()
    r1.coll("barrier", 0)  # rank 1 waits in a barrier; rank 0 saves a checkpoint
    job.poll(T0)
    r0.activity(T0 + 5, 0.0, io_rate=40_000_000)
    job.poll(T0 + 5)
    for later in (T0 + 100, T0 + 1000):
        assert job.verdict(30, None, later) is None
    assert "busy" in job.rank_line(job.ranks[0], T0 + 100)
    assert "save() at t.py:88" in job.rank_line(job.ranks[0], T0 + 100)
    assert "waiting" in job.rank_line(job.ranks[1], T0 + 100)


def test_a_busy_rank_that_issues_its_collective_is_progress_not_a_hang(tmp_path: Path) -> None:
    """Seen in the suite under load: rank 0 came back from a 7.5 s checkpoint and issued the
    barrier rank 1 had waited in all along; until its completion was read, both ranks looked
    like waiting and nothing had completed for 7.5 s, and the job was stopped as hung."""
    job, r0, r1 = _job(tmp_path)
    r0.coll(), r1.coll()
    r0.done(), r1.done()
    r1.coll("barrier", 0)
    job.poll(T0)
    r0.activity(T0 + 7, 1.0)
    job.poll(T0 + 7)
    assert job.verdict(2.5, None, T0 + 7) is None
    r0.coll("barrier", 0)  # the checkpoint is done: rank 0 joins the barrier
    job.poll(T0 + 7.5)
    assert job.verdict(2.5, None, T0 + 7.6) is None
    # Both then really wait, with nothing completing: that is a hang after the timeout.
    assert job.verdict(2.5, None, T0 + 10.1) == HANG


def test_every_rank_waiting_for_the_timeout_is_a_hang(tmp_path: Path) -> None:
    job, r0, r1 = _job(tmp_path)
    r0.coll("barrier", 0)
    r1._write({"kind": "collective", "id": 1, "rank": 1, "seq": None, "p2p_seq": 1,
               "iteration": 1, "t": T0, "state": "pending", "group": "0", "op": "recv",
               "label": "user", "shapes": [[1]], "dtypes": ["float32"], "numel": 1,
               "stack": 0, "peer": 0})
    job.poll(T0)
    assert job.verdict(30, None, T0 + 29) is None
    assert job.verdict(30, None, T0 + 31) == HANG


def test_collectives_that_cannot_match_are_a_deadlock_without_the_timeout(
        tmp_path: Path) -> None:
    job, r0, r1 = _job(tmp_path)
    r0.coll("barrier", 0)
    r1.coll("all_reduce", 740)
    job.poll(T0)
    # Until the watchdogs confirm that both main threads are idle, nothing is proven.
    assert job.verdict(30, None, T0 + 1) is None
    r0.activity(T0 + 1, 0.0, "barrier")
    r1.activity(T0 + 1, 0.0, "backward")
    job.poll(T0 + 1)
    assert job.verdict(30, None, T0 + 1) is None  # held for SETTLE seconds first
    assert job.verdict(30, None, T0 + 1.01 + SETTLE) == DEADLOCK


def test_matching_collectives_in_flight_are_no_deadlock(tmp_path: Path) -> None:
    job, r0, r1 = _job(tmp_path)
    r0.coll("all_reduce", 4)
    r1.coll("all_reduce", 4)
    r0.activity(T0 + 1, 0.0)
    r1.activity(T0 + 1, 0.0)
    job.poll(T0 + 1)
    assert job.verdict(30, None, T0 + 5) is None


def test_a_rank_computing_with_a_collective_pending_is_busy(tmp_path: Path) -> None:
    job, r0, r1 = _job(tmp_path)
    r0.coll("barrier", 0)
    r1.coll("all_reduce", 740)
    r0.activity(T0 + 1, 0.0)
    r1.activity(T0 + 1, 0.95)  # an async all-reduce in flight while it computes
    job.poll(T0 + 1)
    assert job.verdict(30, None, T0 + 2) is None
    assert job.verdict(30, None, T0 + 40) is None


def test_a_rank_idle_at_one_place_is_stuck_after_its_own_timeout(tmp_path: Path) -> None:
    job, r0, r1 = _job(tmp_path)
    r1.coll("barrier", 0)
    for k in range(1, 12):
        r0.activity(T0 + k, 0.0, "wait_for_lock")
        job.poll(T0 + k)
    assert job.verdict(30, 20, T0 + 11) is None
    assert job.verdict(30, 10, T0 + 11) == STUCK
    assert "wait_for_lock() at t.py:88" in job.reason


def test_a_rank_whose_trace_is_cut_is_never_taken_for_waiting(tmp_path: Path) -> None:
    job, r0, r1 = _job(tmp_path)
    r0.coll(), r1.coll()
    job.poll(T0)
    assert job.verdict(30, None, T0 + 31) == HANG
    (tmp_path / "cut").mkdir()
    job, r0, r1 = _job(tmp_path / "cut")
    Path(schema.cut_marker(str(r0.path))).write_bytes(b"")
    r0.coll(), r1.coll()
    job.poll(T0)
    job.poll(T0)
    assert job.verdict(30, None, T0 + 31) is None


def _blocked_rank_job(tmp_path: Path, **activity: object) -> tuple[JobProgress, Rank, Rank]:
    """Rank 1 waits in a barrier; rank 0, outside collectives, reports ``activity``."""
    job, r0, r1 = _job(tmp_path)
    r0.coll(), r1.coll()
    r0.done(), r1.done()
    r1.coll("barrier", 0)
    job.poll(T0)
    r0.activity(T0 + 1, function="get", **activity)  # type: ignore[arg-type]
    r0.activity(T0 + 2, function="get", **activity)  # type: ignore[arg-type]
    job.poll(T0 + 2)
    return job, r0, r1


def test_a_blocked_rank_everyone_waits_for_is_stopped_at_the_hang_timeout(
        tmp_path: Path) -> None:
    """No CPU, no I/O, the same place (a queue whose producer died): at --hang-timeout, not
    at --stuck-timeout, since every other rank waits for it."""
    job, _r0, _r1 = _blocked_rank_job(tmp_path, cpu_rate=0.0, io_rate=10, call="queue.get()")
    assert job.verdict(30, 600, T0 + 20) is None
    assert job.rank_line(job.ranks[0], T0 + 20) == "blocked 19s in queue.get() in get() at t.py:88"
    assert job.verdict(30, 600, T0 + 33) == STUCK
    assert "rank 0 stayed in queue.get() in get() at t.py:88" in job.reason


def test_a_rank_that_computes_or_reads_is_never_the_blocker(tmp_path: Path) -> None:
    for activity in ({"cpu_rate": 0.5}, {"cpu_rate": 0.0, "io_rate": 5_000_000}):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        job, _r0, _r1 = _blocked_rank_job(folder, **activity)
        assert job.verdict(30, 600, T0 + 500) is None, activity
        assert "busy" in job.rank_line(job.ranks[0], T0 + 500)


def test_a_stack_inside_torch_distributed_with_nothing_recorded_is_no_wait(
        tmp_path: Path) -> None:
    """Four ranks on a loaded machine inside DDP's construction (a store-based barrier, which
    is no collective): every stack is in torch.distributed, nothing is pending, each rank uses
    a fifth of a core. Where every group is recorded, that is a hole in the record, not a
    hang; only a rank with an unrecorded group (flight-recorder mode) is taken to wait."""
    job = JobProgress(str(tmp_path))
    ranks = [Rank(tmp_path, r, world=4) for r in range(4)]
    for t in (T0 + 1, T0 + 2):
        for r in ranks:
            r.activity(t, 0.2, function="__init__", in_collective=True)
    job.poll(T0 + 2)
    assert job.verdict(8, None, T0 + 60) is None
    assert "does not record" in job.rank_line(job.ranks[0], T0 + 60)
    for r in ranks:
        r.activity(T0 + 3, 0.2, function="__init__", in_collective=True, unrecorded=True)
    job.poll(T0 + 3)
    assert job.verdict(8, None, T0 + 60) == HANG


def test_a_first_activity_record_without_an_io_figure_is_no_evidence_of_idling(
        tmp_path: Path) -> None:
    """The watchdog's first record after a collective has no I/O rate yet (it needs two
    readings): a rank writing a checkpoint at no CPU must not read as blocked from it."""
    job, r0, r1 = _job(tmp_path)
    r1.coll("barrier", 0)
    r0.activity(T0 + 1, 0.0, "save", io_rate=None)
    job.poll(T0 + 1)
    assert job.ranks[0].still_since is None
    r0.activity(T0 + 2, 0.0, "save", io_rate=20_000_000)
    job.poll(T0 + 2)
    assert job.ranks[0].still_since is None and job.verdict(2.5, None, T0 + 10) is None


def test_the_launcher_polls_fast_once_a_rank_has_issued_nothing_for_a_while(
        tmp_path: Path) -> None:
    """A collective still pending because the rank's writer reports completions only every
    half second is no wait while the rank keeps issuing; one pending with nothing issued
    since for WAITED seconds is (and so is init_process_group)."""
    job, r0, r1 = _job(tmp_path)
    r0._write({"kind": "init", "t": T0, "state": "pending"})
    job.poll(T0)
    assert not _someone_waits(job, T0 + WAITED / 2)
    assert _someone_waits(job, T0 + WAITED + 0.01)  # waiting in init_process_group
    r0._write({"kind": "init", "t": T0, "state": "completed"})
    r0.coll(), r1.coll()  # issued at T0 + 1, not yet reported complete
    job.poll(T0 + 1)
    r0.coll(), r1.coll()  # the next step's, issued 0.4 s later
    job.poll(T0 + 1.4)
    assert not _someone_waits(job, T0 + 1.4 + WAITED / 2)  # the first pending 0.55 s
    assert _someone_waits(job, T0 + 1.4 + WAITED + 0.01)


class _EveryoneElseEnded:
    """The store's view of the other nodes: all of their jobs have ended."""

    def others_ended(self) -> bool:
        return True


def test_the_exit_barrier_release_reads_the_agents_latest_workers(tmp_path: Path) -> None:
    # torchrun --max-restarts: attempt 0's workers failed, attempt 1's all succeeded. The
    # agent's file keeps attempt 0's codes (the report maps them to ranks); the release must
    # judge attempt 1 alone, else the agent waits out torchrun's whole exit barrier.
    from ddpdoctor.launch.job import EXIT_BARRIER_GRACE, _ExitBarrier
    from ddpdoctor.runtime import exit_codes

    job, _r0, _r1 = _job(tmp_path)
    job.poll(T0)
    agent = os.getpid()  # exit_codes writes this process's file, as the agent does its own
    exits = tmp_path / f"{schema.EXITS_PREFIX}{agent}.json"

    def released(now: float) -> bool:
        barrier = _ExitBarrier(tmp_path, agent, _EveryoneElseEnded())  # type: ignore[arg-type]
        return barrier.nobody_comes(job, now) or barrier.nobody_comes(
            job, now + EXIT_BARRIER_GRACE)

    exit_codes._write(str(tmp_path), {100: 1, 101: -15})  # attempt 0
    assert not released(T0)
    exit_codes._write(str(tmp_path), {200: 0, 201: 0})  # attempt 1
    written = json.loads(exits.read_text())
    assert written["exit_codes"] == {"100": 1, "101": -15, "200": 0, "201": 0}
    assert written["latest"] == {"200": 0, "201": 0}
    assert released(T0 + 10)
    # A file written before "latest" existed is judged on every code, as before.
    exits.write_text(json.dumps({"exit_codes": written["exit_codes"]}))
    assert not released(T0 + 20)


def test_a_rank_still_since_its_first_activity_record_is_stuck_a_timeout_after_it(
        tmp_path: Path) -> None:
    """The first activity record after a collective has no I/O figure (it needs two readings);
    when the next finds the rank idle at the same place, it has been still since the first:
    the stuck verdict comes a timeout after that one, not after the second (issue 56: the
    report at the hang timeout + 1 s)."""
    job, r0, r1 = _job(tmp_path)
    r0.coll(), r1.coll()
    r0.done(), r1.done()
    r1.coll()  # rank 1 waits in the next step's all-reduce; rank 0 sleeps in its own code
    job.poll(T0)
    r0.activity(T0 + 0.4, 0.0, "sleep", io_rate=None)
    job.poll(T0 + 0.5)
    r0.activity(T0 + 1.4, 0.0, "sleep")
    job.poll(T0 + 1.5)
    assert job.ranks[0].still_since == T0 + 0.4
    assert job.verdict(5, None, T0 + 5.3) is None
    assert job.verdict(5, None, T0 + 5.45) == STUCK
    # Busy in between (the first record's CPU): still only from the second.
    (tmp_path / "busy").mkdir()
    job2, a0, a1 = _job(tmp_path / "busy")
    a0.coll(), a1.coll()
    a0.done(), a1.done()
    a1.coll()
    job2.poll(T0)
    a0.activity(T0 + 0.4, 0.9, "sleep", io_rate=None)
    a0.activity(T0 + 1.4, 0.0, "sleep")
    job2.poll(T0 + 1.5)
    assert job2.ranks[0].still_since == T0 + 1.4
