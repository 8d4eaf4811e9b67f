"""What each phase of a rank's life costs it, plain torchrun against ``ddpdoctor run``.

    python bench/rank_phases.py [--jobs 10] [--steps 30]

Jobs of the LM headline model (``lm_job.py``) on 2 gloo ranks alternate between plain
torchrun and ``ddpdoctor run`` (``--before SRC``: another ddpdoctor, a worktree's ``src``, in
plain torchrun's place). Each rank reads its own ``getrusage`` at the end of each phase: the
interpreter's start (ddpdoctor's boot included), ``import torch``, ``init_process_group``,
building the DDP model, 5 warm-up steps, ``--steps`` steps; and prints the median over the
ranks of each arm of the user and system CPU, the voluntary and involuntary context switches
and the wall time of each phase. Whole jobs cannot show a cost paid once a job on this VM (a
plain rank's ``import torch`` takes 1.3 or 1.9 CPU-s from one job to the next); per phase,
with the context switches beside, the start-up's share stands out (session 49: the
watchdog's ten wake-ups a second while a rank imported torch, ~80 more voluntary switches).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ddpdoctor.launch.command import free_port

HERE = Path(__file__).resolve().parent
FIELDS = ("user", "sys", "vcsw", "ivcsw", "wall")

# The rank: a phase ends where it appends its reading; readings to the file $PHASES_OUT_<rank>.
RANK_SCRIPT = '''
import json, os, resource, sys, time
readings = []
def phase(name):
    r = resource.getrusage(resource.RUSAGE_SELF)
    readings.append([name, r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw, time.perf_counter()])
phase("start")
import torch, torch.distributed as dist
phase("import torch")
sys.path.insert(0, {bench!r})
import lm_job
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
phase("init_process_group")
torch.manual_seed(0)
model = DDP(lm_job.TinyGPT())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
phase("DDP model built")
class Args: batch = 8
x, y = lm_job.batch(Args)
loss_fn = torch.nn.CrossEntropyLoss()
def step():
    loss = loss_fn(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
for _ in range(5): step()
phase("5 warm-up steps")
for _ in range({steps}): step()
phase("{steps} steps")
dist.destroy_process_group()
with open(os.environ["PHASES_OUT"] + "_" + os.environ["RANK"], "w") as fh:
    json.dump(readings, fh)
'''


def phases(readings: list[list]) -> list[tuple[str, dict[str, float]]]:
    """Each phase's share of a rank's readings: what each field grew by since the last."""
    out = []
    for i, (name, *values) in enumerate(readings):
        before = readings[i - 1][1:] if i else [0.0, 0.0, 0, 0, values[4]]
        out.append((name, {f: v - b for f, v, b in zip(FIELDS, values, before)}))
    return out


def run_job(arm: str, src: str, script: Path, out: str, work: Path) -> None:
    environ = dict(os.environ, PYTHONPATH=src, PHASES_OUT=out, TMPDIR=str(work))
    if arm == "plain":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--master-port", str(free_port()), str(script)]
    else:
        cmd = [sys.executable, "-m", "ddpdoctor", "run", "--logdir",
               tempfile.mkdtemp(dir=work), "--nproc-per-node", "2", str(script)]
    subprocess.run(cmd, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300, check=True)


def table(results: dict[str, list[list[tuple[str, dict[str, float]]]]], arms: list[str]) -> str:
    names = [name for name, _ in results[arms[0]][0]]
    rows = ["| phase | " + " | ".join(f"{f} {' / '.join(arms)}" for f in FIELDS) + " |",
            "|---|" + "---|" * len(FIELDS)]
    for k, name in enumerate(names):
        cells = []
        for f in FIELDS:
            values = [statistics.median(rank[k][1][f] for rank in results[a]) for a in arms]
            unit = 1e3 if f in ("user", "sys", "wall") else 1
            cells.append(" / ".join(f"{v * unit:.0f}" for v in values))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + ("\n\nCPU and wall in ms, context switches in counts; medians "
                              f"over {len(results[arms[0]])} ranks of each arm.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10, help="jobs of each arm")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--before", type=Path, default=None,
                        help="another ddpdoctor's src folder, in plain torchrun's place")
    args = parser.parse_args()
    src = os.environ.get("PYTHONPATH", "")
    arms = {("before" if args.before else "plain"): str(args.before or src), "ddpdoctor": src}
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-rank-phases-"))
    try:
        script = work / "rank.py"
        script.write_text(RANK_SCRIPT.format(bench=str(HERE), steps=args.steps))
        results: dict[str, list] = {arm: [] for arm in arms}
        for i in range(args.jobs):
            for arm, path in arms.items():
                out = str(work / f"{arm}-{i}")
                run_job("plain" if arm == "plain" else "ddpdoctor", path, script, out, work)
                for rank in (0, 1):
                    with open(f"{out}_{rank}") as fh:
                        results[arm].append(phases(json.load(fh)))
            print(f"job {i + 1}/{args.jobs}", file=sys.stderr, flush=True)
        print(table(results, list(arms)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
