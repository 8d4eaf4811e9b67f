"""Copies of real traces at scale, for the ``diff`` benchmark: ``python bench/real_traces.py OUT``.

Runs ``diff_job.py`` once under ``ddpdoctor run`` (2 gloo ranks, ~20,000 collectives each;
rank 1 logs one step's loss with another reduce op at ``--diverge-at``), then writes
``OUT/rank-<N>.jsonl`` for ``--ranks`` ranks: rank 1's trace for the one diverging rank
(``--diverge-rank``), rank 0's for every other. Collective lines are copied byte for byte; the
few records that name a rank or the world (header, process start, groups) are rewritten for
the rank they now belong to. Unlike ``synth.py``'s lines, these are what the writer wrote in a
real job: stacks, labels, completion batches and the recording's timing as they come.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "diff_job.py"


def record(folder: Path, steps: int, diverge_at: int) -> dict:
    """Run the job under ``ddpdoctor run``; its log folder is ``folder``."""
    # A cap far above the traces' size: every collective on its own line.
    cmd = [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(folder), "--max-trace-mb",
           "100000", "--nproc-per-node", "2", str(JOB), "--steps", str(steps), "--diverge-at",
           str(diverge_at)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 1 or "reduce_op_mismatch" not in proc.stderr + proc.stdout:
        raise SystemExit(f"the recorded job was not diagnosed as planned (exit "
                         f"{proc.returncode}):\n"
                         f"{proc.stderr[-2000:]}")
    return {"exit": proc.returncode}


def _rewrite(line: bytes, rank: int, world: int) -> bytes:
    """A record that names a rank or the world, made that of ``rank`` in a world of ``world``."""
    rec = json.loads(line)
    kind = rec.get("kind")
    if kind == "header":
        rec["rank"] = rank
    elif kind == "process_start":
        rec.update(rank=rank, local_rank=rank % 8, world_size=world)
        env = rec.get("env") or {}
        for key, value in (("RANK", rank), ("LOCAL_RANK", rank % 8), ("WORLD_SIZE", world),
                           ("GROUP_RANK", rank // 8), ("ROLE_RANK", rank)):
            if key in env:
                env[key] = str(value)
    elif kind == "group" and rec.get("size") == 2:
        rec.update(ranks=list(range(world)), size=world, group_rank=rank)
    return (json.dumps(rec) + "\n").encode()


_NAMED = (b'{"kind": "header"', b'{"kind": "process_start"', b'{"kind": "group"')


def copy(source: Path, out: Path, ranks: int, diverge_rank: int) -> int:
    """Write ``ranks`` traces into ``out`` from the recorded pair; returns the bytes written."""
    out.mkdir(parents=True, exist_ok=True)
    lines = {r: (source / f"rank-{r}.jsonl").read_bytes().splitlines(keepends=True)
             for r in (0, 1)}
    total = 0
    for rank in range(ranks):
        src = lines[1 if rank == diverge_rank else 0]
        data = b"".join(_rewrite(line, rank, ranks) if line.startswith(_NAMED) else line
                        for line in src)
        (out / f"rank-{rank}.jsonl").write_bytes(data)
        total += len(data)
    for extra in source.glob("*.json"):  # the job's own files (job.json: how it ended, ...)
        if extra.name not in ("report.json",):
            shutil.copy(extra, out / extra.name)
    return total


def generate(out: Path, ranks: int, steps: int = 2860, diverge_at: int = 2140,
             diverge_rank: int | None = None) -> dict:
    """Record the job once (cached next to ``out``), then write ``ranks`` copies."""
    recorded = out.parent / f"recorded-{steps}-{diverge_at}"
    if not (recorded / "rank-1.jsonl").exists():
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix="recording-"))
        record(tmp, steps, diverge_at)
        os.replace(tmp, recorded)
    diverge_rank = ranks - 1 if diverge_rank is None else diverge_rank
    written = copy(recorded, out, ranks, diverge_rank)
    collectives = sum(1 for line in (recorded / "rank-0.jsonl").read_bytes().splitlines()
                      if line.startswith(b'{"id": '))
    return {"bytes": written, "collectives": collectives, "diverge_rank": diverge_rank}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=2860)
    parser.add_argument("--diverge-at", type=int, default=2140)
    args = parser.parse_args()
    info = generate(Path(args.out), args.ranks, args.steps, args.diverge_at)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
