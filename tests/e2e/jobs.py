"""Helpers for end-to-end tests: run ``ddpdoctor`` on real gloo jobs, leave no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ddpdoctor.trace.model import Run
from ddpdoctor.trace.reader import load_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


@dataclass
class Job:
    """A finished ``ddpdoctor`` invocation."""

    returncode: int
    stdout: str
    stderr: str
    logdir: Path
    report: dict | None

    def run(self) -> Run:
        return load_run([str(self.logdir)])


def job_processes(logdir: Path) -> list[int]:
    """Pids of live processes started for the job writing to ``logdir`` (by environment)."""
    needle = f"DDPDOCTOR_LOGDIR={logdir}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                environ = fh.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        if needle in environ and b") Z" not in stat:
            found.append(int(name))
    return found


def kill_job_processes(logdir: Path) -> list[int]:
    pids = job_processes(logdir)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def ddpdoctor(*args: str, timeout: float = 120, cwd: Path | None = None,
              env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the ddpdoctor CLI as a user would (``python -m ddpdoctor``)."""
    return subprocess.run([sys.executable, "-m", "ddpdoctor", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd or REPO,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def run_job(tmp_path: Path, script: Path | str, *script_args: str, options: tuple = (),
            timeout: float = 120, hang_timeout: float = 5, env: dict | None = None) -> Job:
    """``ddpdoctor run`` SCRIPT with a JSON report; asserts no process of the job survives."""
    logdir = tmp_path / "logs"
    report_path = tmp_path / "report.json"
    args = ["run", "--logdir", str(logdir), "--json", str(report_path),
            "--hang-timeout", str(hang_timeout), "--grace", "2", *options, str(script),
            *script_args]
    try:
        proc = ddpdoctor(*args, timeout=timeout, env=env)
    finally:
        leftovers = kill_job_processes(logdir)
    assert not leftovers, f"processes of the job outlived ddpdoctor: {leftovers}"
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return Job(proc.returncode, proc.stdout, proc.stderr, logdir, report)


class BackgroundJob:
    """``ddpdoctor run`` started in the background, to be signalled while the job runs."""

    def __init__(self, tmp_path: Path, script: Path, options: tuple = (),
                 script_args: tuple = ()) -> None:
        self.logdir = tmp_path / "logs"
        self.report_path = tmp_path / "report.json"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(self.logdir),
             "--json", str(self.report_path), "--grace", "2", "--hang-timeout", "5", *options,
             str(script), *script_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
        self.stderr = ""

    def wait_for_collectives(self, rank: int, count: int, timeout: float = 60) -> dict:
        """Wait until ``rank`` recorded ``count`` collectives; returns its process_start."""
        path = self.logdir / f"rank-{rank}.jsonl"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.2)
            text = path.read_text() if path.exists() else ""
            if text.count('"collective"') >= count:
                return next(json.loads(line) for line in reversed(text.splitlines())
                            if '"process_start"' in line)
        raise AssertionError(f"rank {rank} did not record {count} collectives in {timeout}s")

    def finish(self, timeout: float = 60) -> int:
        """Wait for ddpdoctor to end; returns its exit code."""
        _out, self.stderr = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def __enter__(self) -> BackgroundJob:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        leftovers = kill_job_processes(self.logdir)
        assert not leftovers, f"processes of the job outlived ddpdoctor: {leftovers}"


# A terminal of this size, as ddpdoctor sees one (rich reads both variables): what it prints
# last must fit its screen.
TERMINAL = {"FORCE_COLOR": "1", "COLUMNS": "80"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def last_screen(text: str, rows: int = 30, cols: int = 80) -> str:
    """What the last screen of a ``rows`` x ``cols`` terminal shows of ``text`` written to it:
    colours dropped, long lines wrapped, the cursor's empty line at the bottom."""
    shown: list[str] = []
    for line in _ANSI.sub("", text).splitlines():
        shown += [line[i:i + cols] for i in range(0, max(len(line), 1), cols)]
    return "\n".join(shown[-(rows - 1):])


def marker_line(path: Path, marker: str) -> int:
    """Line number of the line carrying ``# ddpdoctor: <marker>`` in an example."""
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# ddpdoctor: {marker}"):
            return number
    raise AssertionError(f"marker {marker!r} not in {path}")


class PlainJob:
    """A job started as a user starts it, without ddpdoctor (plain torchrun, ``python`` for a
    script that spawns its own workers, or one process per rank with its environment set, as
    srun does), for ``ddpdoctor attach`` to read. Its output goes to ``output.txt``; on exit
    every process of it is killed by pid, and none may survive."""

    def __init__(self, tmp_path: Path, script: Path, *args: str, nproc: int = 2,
                 launcher: str = "torchrun", torchrun: tuple[str, ...] = ()) -> None:
        from ddpdoctor.launch.command import free_port

        self.output = tmp_path / f"output{abs(hash(torchrun))}.txt"
        self.nproc = nproc
        out = self.output.open("wb")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.procs: list[subprocess.Popen] = []
        if launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   *(torchrun or ("--master-port", str(free_port()))), str(script), *args]
            self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True))
        elif launcher == "python":
            self.procs.append(subprocess.Popen([sys.executable, str(script), *args], stdout=out,
                                               stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True))
        else:  # "env": one process per rank, as srun starts them
            port = str(free_port())
            for rank in range(nproc):
                rank_env = {**env, "RANK": str(rank), "WORLD_SIZE": str(nproc),
                            "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                            "MASTER_PORT": port}
                self.procs.append(subprocess.Popen(
                    [sys.executable, str(script), *args], stdout=out, stderr=subprocess.STDOUT,
                    env=rank_env, start_new_session=True))
        out.close()

    def pids(self) -> list[int]:
        """Every live process of the job (the launchers and all their descendants)."""
        from ddpdoctor.launch.proctree import alive, descendants

        found = [p.pid for p in self.procs if p.poll() is None]
        for p in self.procs:
            found += descendants(p.pid)
        return sorted({pid for pid in found if alive(pid)})

    def rank_pids(self) -> list[int]:
        from ddpdoctor.launch.discover import find_jobs

        return [r.pid for job in find_jobs(self.pids()) for r in job.ranks]

    def wait_until_still(self, ranks: int | None = None, timeout: float = 60) -> list[int]:
        """Wait until ``ranks`` rank processes (default: nproc) exist and none used CPU for a
        second (the job has hung); returns their pids."""
        from ddpdoctor.launch.spy import counters

        wanted = self.nproc if ranks is None else ranks
        deadline = time.monotonic() + timeout
        before: dict[int, float | None] = {}
        while time.monotonic() < deadline:
            pids = self.rank_pids()
            now = {pid: counters(pid)[0] for pid in pids}
            if len(pids) == wanted and before.keys() == now.keys() and all(
                    now[p] is not None and before[p] is not None and now[p] - before[p] < 0.03
                    for p in pids):
                return pids
            before = now
            time.sleep(1.0)
        raise AssertionError(f"the job did not settle: {self.output.read_text()[-2000:]}")

    def __enter__(self) -> PlainJob:
        return self

    def __exit__(self, *_exc: object) -> None:
        for _ in range(3):
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            time.sleep(0.2)
        from ddpdoctor.launch.proctree import alive

        left = [pid for pid in self.pids() if alive(pid)]
        assert not left, f"processes of the job survived: {left}"


def attach(tmp_path: Path, *pids: int, options: tuple = ()) -> Job:
    """``ddpdoctor attach`` on ``pids`` (none: the job it finds), with a JSON report."""
    logdir = tmp_path / "attach"
    report_path = tmp_path / "attach.json"
    proc = ddpdoctor("attach", "--logdir", str(logdir), "--json", str(report_path), *options,
                     *map(str, pids), timeout=90)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return Job(proc.returncode, proc.stdout, proc.stderr, logdir, report)
