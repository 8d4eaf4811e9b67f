"""Runs the user's job, watches it, and stops it on a hang; never leaves a process behind.

While the job runs the launcher reads the ranks' progress blocks
(:mod:`ddpdoctor.launch.monitor`); when a hang rule fires it asks every rank for its stacks
(the ``hang-request.json`` handshake of :mod:`ddpdoctor.trace.schema`), waits briefly for
the answers, then ends every process of the job. In a job of several nodes node 0's launcher
decides for all, through the job's store (:mod:`ddpdoctor.launch.coordination`). At the end
it writes ``job.json``: why it stopped the job, for ``diff`` to read later.
"""

from __future__ import annotations

import codecs
import json
import os
import select
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpdoctor.analysis.digest import node_digest
from ddpdoctor.launch import coordination, end_story, proctree
from ddpdoctor.launch.command import build_command, build_env, run_id
from ddpdoctor.launch.errors import UsageError
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.launch.options import RunOptions
from ddpdoctor.launch.wake import Wake
from ddpdoctor.runtime import env as rank_env
from ddpdoctor.runtime.env import Launcher
from ddpdoctor.runtime.stderr_tail import pseudo_terminal
from ddpdoctor.trace import handshake, padding, schema
from ddpdoctor.trace.progress_block import WAITED
from ddpdoctor.trace.reader import write_ring_tails
from ddpdoctor.trace.schema import Stop


@dataclass
class JobResult:
    """How the job ended."""

    exit_code: int
    logdir: str
    duration: float
    hang: bool = False
    stop: Stop | None = None  # why the job was stopped (analysis/hang_rules.py)
    reason: str = ""  # the same, in words
    interrupted: bool = False
    killed: list[int] = field(default_factory=list)
    acks: list[int] = field(default_factory=list)
    nnodes: int = 1  # nodes of the job (torchrun's --nnodes, its maximum)
    unwatched: str = ""  # why hangs across nodes were not watched, if they were not
    released: bool = False  # torchrun's agent was ended at its exit barrier (_ExitBarrier)


class _Signals:
    """Turns SIGINT/SIGTERM of ddpdoctor into a flag the watch loop acts on."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}  # what signal.signal returned: handlers

    def __enter__(self) -> _Signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, _frame: object) -> None:
        self.received = signum

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


FIRST_STATUS = 1.5  # seconds before the first progress update


# Seconds between two reads of the ranks' progress blocks. On a 2-core VM a process that
# wakes after a second of sleep pays milliseconds of CPU for a poll with its caches cold
# (bench/RESULTS.md, session 37), so the launcher sleeps long while every rank makes
# progress: the ranks wake it when one starts to wait (launch/wake.py), and it then polls
# fast while some rank is blocked, or has a collective pending and has issued none for
# WAITED seconds, so that a provable deadlock is called within 2 s and a stuck rank at its
# timeout (bench/hang_latency.py). Without that FIFO, and on several nodes (whose digests
# the others read), it polls at POLL_RUNNING.
POLL_IDLE = 2.0
POLL_RUNNING = 1.0
POLL_WAITING = 0.1


class _JobEnd:
    """A sleep between two polls that ends as soon as the job's process does, so the report
    follows at once, or a rank wakes the launcher (``wake``): ``select`` on a pidfd where
    Linux has one (no wake-ups in between; Popen's own wait polls up to 20 times a second),
    else ``Popen.wait``."""

    def __init__(self, proc: subprocess.Popen, wake: Wake | None = None) -> None:
        self._proc = proc
        self._fd: int | None = None
        self._wake = wake
        try:
            self._fd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
            return
        self._closer = weakref.finalize(self, os.close, self._fd)

    @property
    def wakes(self) -> bool:
        """Whether a rank that starts to wait ends the sleep."""
        return self._fd is not None and self._wake is not None

    def wait(self, seconds: float) -> None:
        if self._fd is not None:
            if self._wake is None:
                select.select([self._fd], [], [], seconds)
                return
            ready, _, _ = select.select([self._fd, self._wake.fd], [], [], seconds)
            if self._wake.fd in ready:
                self._wake.drain()
            return
        try:
            self._proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self._fd is not None:
            self._closer()


# Seconds torchrun's agent may wait at its exit barrier once every other node's job has ended.
EXIT_BARRIER_GRACE = 3.0
RELEASED = ("torchrun's agent on this node waited at its exit barrier (up to 300 s) for the "
            "other nodes' agents, whose jobs had all ended (an agent whose ranks failed, one "
            "aborting in teardown included, skips it): ddpdoctor ended it, with the exit code "
            "torchrun gives when that wait runs out, 0")


class _ExitBarrier:
    """torchrun's agent, once its workers have all exited with 0, waits at its exit barrier for
    every node's agent (``exit_barrier_timeout``, 300 s). An agent whose workers failed skips
    it and ends, so one rank of another node aborting in teardown holds this node for the full
    300 s with nothing left to wait for. Once the agent has written its workers' exit codes
    (``exits-<pid>.json``, all 0) and every other node's job has ended (the store's ``ended``
    count), no agent can join the barrier any more: after :data:`EXIT_BARRIER_GRACE` seconds
    the agent is ended."""

    def __init__(self, logdir: Path, agent: int, coord: coordination.Coordinator) -> None:
        self._codes = logdir / f"{schema.EXITS_PREFIX}{agent}.json"
        self._coord = coord
        self._since: float | None = None

    def nobody_comes(self, progress: JobProgress, now: float) -> bool:
        if self._since is None:
            if not self._succeeded(len(progress.ranks)):
                return False
            self._since = now
        return now - self._since >= EXIT_BARRIER_GRACE and self._coord.others_ended()

    def _succeeded(self, ranks: int) -> bool:
        if not ranks or not self._codes.exists():
            return False
        try:
            written = json.loads(self._codes.read_text(encoding="utf-8"))
            # The agent's latest workers: after a torchrun restart, the failed attempt's
            # codes stay in exit_codes.
            codes = written.get("latest", written.get("exit_codes"))
        except (OSError, ValueError, AttributeError):
            return False
        return isinstance(codes, dict) and len(codes) >= ranks and \
            all(code == 0 for code in codes.values())


def _someone_waits(progress: JobProgress, now: float) -> bool:
    """Whether some rank waits: blocked, or in a collective (``init_process_group``
    included) for WAITED seconds since it last issued one."""
    return any(p.blocked or (p.waiting and now - max(
        p.last_issue, min(q.seen for q in p.pending.values())) >= WAITED)
        for p in progress.live())


def _pump_terminal(fd: int, sink: Callable[[str, bool], None]) -> threading.Thread:
    """Forward what the job writes to its pseudo-terminal, as it arrives, to ``sink``."""
    def run() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: every process that had the terminal has ended
                break
            if not data:
                break
            sink(decoder.decode(data), False)
        sink(decoder.decode(b"", final=True), False)
        os.close(fd)

    thread = threading.Thread(target=run, name="ddpdoctor-output", daemon=True)
    thread.start()
    return thread


def run_job(opts: RunOptions, logdir: Path,
            on_status: Callable[[JobProgress, str], None] | None = None,
            on_output: Callable[[str, bool], None] | None = None,
            terminal: int | None = None) -> JobResult:
    """Run the job to its end, or stop it on a hang or a signal; never leaves a process.
    ``on_output``: the job's output goes through it instead of straight to ddpdoctor's own
    stdout and stderr, as written on a pseudo-terminal of the size of ``terminal`` (a
    terminal's file descriptor), where the ranks see a terminal as they would without
    ddpdoctor (``isatty()``, colours, ``\r`` progress bars)."""
    cmd = build_command(opts)
    run = run_id(opts)
    environ = build_env(opts, logdir, run)
    wake = Wake.create()
    if wake is not None:
        environ[rank_env.WAKE] = wake.path
    coord = coordination.for_job(opts.torchrun, run) if opts.launcher == Launcher.TORCHRUN else None
    proctree.become_subreaper()
    progress = JobProgress(str(logdir))
    started = time.time()
    result = JobResult(exit_code=0, logdir=str(logdir), duration=0.0,
                       nnodes=opts.torchrun.nnodes_max if opts.launcher == Launcher.TORCHRUN else 1)
    with _Signals() as signals:
        master: int | None = None
        out: int | None = None
        if on_output is not None:
            master, out = pseudo_terminal(terminal if terminal is not None else 2)
        try:
            proc = subprocess.Popen(cmd, env=environ, stdout=out, stderr=out)
        except OSError as exc:
            if master is not None and out is not None:
                os.close(master)
                os.close(out)
            if wake is not None:
                wake.close()
            raise UsageError(f"cannot start {cmd[0]}: {exc.strerror}") from None
        pumps = []
        if master is not None and out is not None and on_output is not None:
            os.close(out)  # the job's processes hold the terminal now
            pumps.append(_pump_terminal(master, on_output))
        if coord is not None:
            coord.start()
        next_status = started + min(FIRST_STATUS, opts.status_every)
        job_end = _JobEnd(proc, wake)
        barrier = _ExitBarrier(logdir, proc.pid, coord) if coord is not None else None
        running = POLL_IDLE if job_end.wakes and result.nnodes == 1 else POLL_RUNNING
        running = min(running, opts.status_every)  # the live view's redraws
        while proc.poll() is None:
            job_end.wait(POLL_WAITING if _someone_waits(progress, time.time()) else running)
            now = time.time()
            progress.poll(now)
            if signals.received is not None:
                result.interrupted = True
                break
            named: tuple[int, ...] = ()
            if coord is not None:
                world = coord.watch(progress.ranks, opts.hang_timeout, opts.stuck_timeout, now)
                verdict, progress.reason, named = world.stop, world.reason, world.named
            elif result.nnodes > 1:
                # This node's ranks alone cannot tell a hang from a rank busy on another node.
                verdict = None
            else:
                verdict = progress.verdict(opts.hang_timeout, opts.stuck_timeout, now)
            if verdict is not None:
                result.hang, result.stop, result.reason = True, verdict, progress.reason
                if on_status:
                    on_status(progress, "hang")
                result.acks = _collect_evidence(logdir, progress, proc)
                if coord is not None:
                    # Every node gets the named ranks' details before any node's ranks go
                    # (and the others' fail on the lost connection).
                    coord.exchange(list(named), progress.paths(), logdir)
                break
            if barrier is not None and barrier.nobody_comes(progress, now):
                result.released = True
                break
            if on_status and now >= next_status:
                on_status(progress, "status")
                next_status = now + opts.status_every
        job_end.close()
        if wake is not None:
            wake.close()
        if coord is not None and not result.hang:
            progress.poll()
            coord.finish(node_digest(progress.ranks, time.time()))
        if proc.poll() is None:
            result.killed = _stop(proc, opts, logdir)
        try:
            proc.wait(timeout=opts.grace + 5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pump in pumps:
            pump.join(2.0)
        # Workers that outlived their parent (re-parented to us): end them too, but not what
        # a rank detached into a session of its own (the user's daemons).
        leftovers = proctree.descendants(os.getpid())
        if leftovers:
            users = proctree.detached(leftovers, {proc.pid, *progress.pids()})
            result.killed += proctree.terminate([p for p in leftovers if p not in users], 1.0)
        proctree.reap()
    progress.poll()
    if coord is not None and not result.hang and coord.node is not None:
        # No verdict stopped the job: the nodes tell each other where it failed first.
        local = progress.paths()
        coord.end.tell(coord.node, end_story.story_ranks(logdir, local), local, logdir)
    progress.close(remove=True)
    if result.nnodes > 1 and (coord is None or coord.node is None):
        result.unwatched = (
            "hangs across nodes were not watched: this node could not reach the job's "
            "rendezvous store" + (f" ({coord.error})" if coord and coord.error else
                                  " (a rendezvous backend other than static or c10d)")
            + "; `ddpdoctor diff` with every node's log folder still compares the ranks")
    padding.trim(str(logdir))  # traces of ranks killed before they closed them
    write_ring_tails(logdir)  # and the lines their writers had not written yet
    result.exit_code = 0 if result.released else proc.returncode
    result.duration = time.time() - started
    write_job_record(logdir, result)
    return result


def write_job_record(logdir: Path, result: JobResult) -> None:
    """What only the launcher knows, for ``diff`` to read later: why it stopped the job."""
    record = {"stopped": result.stop, "reason": result.reason,
              "interrupted": result.interrupted, "exit_code": result.exit_code,
              "nnodes": result.nnodes, "unwatched": result.unwatched,
              "notes": [RELEASED] if result.released else []}
    try:
        with open(os.open(logdir / schema.JOB_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w", encoding="utf-8") as fh:
            json.dump(record, fh)
    except OSError:
        pass


def _stop(proc: subprocess.Popen, opts: RunOptions, logdir: Path) -> list[int]:
    """End the job: the ranks get SIGTERM, then SIGKILL after the grace period.

    torchrun's agent is ours, not the user's: it is killed outright, so that it does not print
    its own traceback over the diagnosis, as is an agent inside a launch command of the
    user's; its workers live in their own sessions and are re-parented to us, found through
    the snapshot taken first.
    """
    workers = proctree.descendants(proc.pid)
    if opts.launcher == Launcher.TORCHRUN:
        proctree.signal_all([proc.pid], signal.SIGKILL)
        return proctree.terminate(workers, opts.grace, exclude=proc.pid)
    everyone = [proc.pid, *workers]
    agents = _agents(logdir, everyone) if opts.launcher == Launcher.COMMAND else []
    if agents:  # torchrun agents in a launch command of the user's (accelerate launch)
        proctree.signal_all(agents, signal.SIGKILL)
    return proctree.terminate([p for p in everyone if p not in agents], opts.grace,
                              exclude=proc.pid)


def _agents(logdir: Path, workers: list[int]) -> list[int]:
    """The torchrun agents among ``workers`` (they named themselves in the log folder)."""
    named = set()
    for path in logdir.glob(f"{schema.AGENT_PREFIX}*"):
        pid = path.name[len(schema.AGENT_PREFIX):]
        if pid.isdigit():
            named.add(int(pid))
    return [p for p in workers if p in named]


def _collect_evidence(logdir: Path, progress: JobProgress, proc: subprocess.Popen,
                      wait: float = 5.0) -> list[int]:
    """Ask every rank for its stacks and wait for their answers; returns the ranks that did."""
    handshake.request(logdir)
    expected = [r for r, p in progress.ranks.items() if p.status == schema.RUNNING]
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        acked = handshake.acknowledged(logdir, expected)
        if len(acked) == len(expected) or proc.poll() is not None:
            return acked
        time.sleep(0.05)
    return handshake.acknowledged(logdir, expected)
