"""Finding the ranks of running torch.distributed jobs on this node, from ``/proc`` alone.

``ddpdoctor attach`` reads jobs it did not start. A rank is a Python process whose environment
names its rank (``RANK`` from torchrun, Accelerate or Lightning; ``SLURM_PROCID`` from srun),
or a worker that ``torch.multiprocessing.spawn`` started (its rank is the index the spawn
passes it, read later from its stack). A process whose parent is a rank of the same job is
that rank's helper (a DataLoader worker), not a rank; but the parent of Lightning's local
rank 1 that runs the same script is local rank 0. Ranks are grouped into jobs by their
rendezvous (``MASTER_ADDR:MASTER_PORT`` and torchrun's run id) or by their spawning parent.
Nothing here changes or signals a process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddpdoctor.trace.ddp_sites import AGENT_MODULES
from ddpdoctor.trace.redact import mask_args

SPAWN_MARK = "multiprocessing.spawn"  # in the command line of a spawn worker
_ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE",
             "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID",
             "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_BUFFER_SIZE",
             "TORCH_NCCL_TRACE_BUFFER_SIZE")


@dataclass
class RankProcess:
    """One rank's process: its pid and what its environment says of it. ``rank`` is None for
    a spawn worker until its stack names it."""

    pid: int
    ppid: int
    rank: int | None
    cmdline: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def number(self, key: str) -> int | None:
        value = self.env.get(key, "")
        return int(value) if value.isdigit() else None


@dataclass
class FoundJob:
    """The ranks of one job on this node, and the launcher process above them, if any."""

    key: str
    kind: str  # "torchrun", "mp.spawn" or "env" (ranks started with their environment set)
    ranks: list[RankProcess]
    launcher_pid: int | None = None
    launcher_cmdline: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int | None:
        sizes = [r.number("WORLD_SIZE") or r.number("SLURM_NTASKS") for r in self.ranks]
        known = [s for s in sizes if s]
        if known:
            return max(known)
        return len(self.ranks) if self.kind == "mp.spawn" else None

    @property
    def node_ranks(self) -> list[int] | None:
        """The global ranks this node should hold, where the environment says (torchrun's
        LOCAL_WORLD_SIZE with each worker's RANK and LOCAL_RANK); None where it does not."""
        for r in self.ranks:
            local, size = r.number("LOCAL_RANK"), r.number("LOCAL_WORLD_SIZE")
            if r.rank is not None and local is not None and size:
                first = r.rank - local
                return list(range(first, first + size))
        if self.kind == "mp.spawn":
            return list(range(len(self.ranks)))
        return None

    def describe(self) -> str:
        """'torchrun (pid 41) of 2 ranks: python train.py': for a list of found jobs."""
        words = self.launcher_cmdline or (self.ranks[0].cmdline if self.ranks else [])
        cmd = " ".join(mask_args(words))[:160]
        head = self.kind + (f" (pid {self.launcher_pid})" if self.launcher_pid else "")
        return f"{head}, {len(self.ranks)} rank process(es): {cmd}"


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _ppid(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat") or b""
    try:
        return int(stat.rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return 0


def _is_zombie(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat") or b""
    tail = stat.rsplit(b")", 1)[-1].split()
    return bool(tail) and tail[0] in (b"Z", b"X")


def cmdline_of(pid: int) -> list[str]:
    raw = _read(f"/proc/{pid}/cmdline") or b""
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _environ(pid: int) -> dict[str, str] | None:
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode("utf-8", "replace")
        if sep and name in _ENV_KEYS:
            env[name] = value.decode("utf-8", "replace")
    return env


def _is_python(cmdline: list[str]) -> bool:
    return bool(cmdline) and "python" in os.path.basename(cmdline[0]).lower()


def is_agent(cmdline: list[str]) -> bool:
    """torchrun's agent: a launcher, not a rank, even where its environment has SLURM_PROCID
    (``srun torchrun ...``)."""
    return any(a.endswith("torchrun") or a in AGENT_MODULES for a in cmdline[1:3]) or (
        cmdline[1:2] == ["-c"] and len(cmdline) > 2 and any(m in cmdline[2]
                                                              for m in AGENT_MODULES))


def _candidate(pid: int) -> RankProcess | None:
    cmd = cmdline_of(pid)
    if not _is_python(cmd) or _is_zombie(pid) or is_agent(cmd):
        return None
    env = _environ(pid)
    if env is None:
        return None
    ppid = _ppid(pid)
    for key in ("RANK", "SLURM_PROCID"):
        if env.get(key, "").isdigit():
            return RankProcess(pid, ppid, int(env[key]), cmd, env)
    if any(SPAWN_MARK in a for a in cmd):
        return RankProcess(pid, ppid, None, cmd, env)
    if env.get("LOCAL_RANK", "").isdigit() and env.get("WORLD_SIZE", "").isdigit() and \
            env.get("NODE_RANK", "0") == "0":
        # Lightning's own launcher: it runs the script again for local ranks 1..n-1 with
        # LOCAL_RANK / NODE_RANK / WORLD_SIZE (no RANK); on node 0 the rank is the local one.
        return RankProcess(pid, ppid, int(env["LOCAL_RANK"]), cmd, env)
    return None


def _script_parent(rank: RankProcess, found: dict[int, RankProcess]) -> RankProcess | None:
    """Local rank 0 of a launcher that runs the script again for the other ranks (Lightning):
    the parent of local rank 1, running the same command line, with nothing of its rank in
    its environment (it sets it inside the process)."""
    if rank.rank != 1 or "RANK" in rank.env or rank.ppid in found:
        return None
    if cmdline_of(rank.ppid) != rank.cmdline or _is_zombie(rank.ppid):
        return None
    env = {k: v for k, v in rank.env.items() if k in ("MASTER_ADDR", "MASTER_PORT",
                                                      "WORLD_SIZE")}
    return RankProcess(rank.ppid, _ppid(rank.ppid), 0, rank.cmdline, env)


def unreadable(pids: Iterable[int]) -> dict[int, str]:
    """The pids among ``pids`` whose environment this process may not read, with why."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                fh.read(1)
        except OSError as exc:
            out[pid] = "no such process" if isinstance(exc, FileNotFoundError) else \
                (exc.strerror or str(exc)).lower()
    return out


def _all_pids() -> list[int]:
    return sorted(int(n) for n in os.listdir("/proc") if n.isdigit())


def find_jobs(pids: Iterable[int] | None = None) -> list[FoundJob]:
    """Every torch.distributed job with a rank on this node (or among ``pids``), each with
    its ranks sorted by rank; jobs ordered by their lowest pid."""
    me = os.getpid()
    chosen = list(pids) if pids is not None else _all_pids()
    found = {p.pid: p for pid in chosen if pid != me
             for p in [_candidate(pid)] if p is not None}
    # A helper of a rank (DataLoader worker, a spawn worker's own spawn) is not a rank.
    ranks = [p for p in found.values() if p.ppid not in found]
    ranks += [parent for p in ranks for parent in [_script_parent(p, found)] if parent]
    jobs: dict[str, FoundJob] = {}
    for p in ranks:
        if p.rank is None:
            key, kind = f"spawn:{p.ppid}", "mp.spawn"
        else:
            run_id = p.env.get("TORCHELASTIC_RUN_ID", "")
            key = f"{p.env.get('MASTER_ADDR', '')}:{p.env.get('MASTER_PORT', '')}:{run_id}"
            if "SLURM_PROCID" in p.env and "RANK" not in p.env:
                key = f"slurm:{p.env.get('SLURM_JOB_ID', '')}:{key}"
            kind = "torchrun" if run_id else "env"
        job = jobs.setdefault(key, FoundJob(key=key, kind=kind, ranks=[]))
        job.ranks.append(p)
    for job in jobs.values():
        job.ranks.sort(key=lambda r: (r.rank if r.rank is not None else r.pid, r.pid))
        parents = {r.ppid for r in job.ranks} - {r.pid for r in job.ranks}
        if len(parents) == 1:
            parent = parents.pop()
            if parent > 1:
                job.launcher_pid, job.launcher_cmdline = parent, cmdline_of(parent)
    return sorted(jobs.values(), key=lambda j: min(r.pid for r in j.ranks))
