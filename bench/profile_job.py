"""Where a rank of the realistic job spends its time under ddpdoctor: a GIL-aware profile.

    python bench/profile_job.py [--seconds 10] [--steps 300] [--rate 500]

Runs the CNN job (``cnn_job.py``) under ``ddpdoctor run`` on 2 gloo ranks, attaches py-spy
(``pip install py-spy``) to rank 0 once it trains, and samples it with ``--gil --native``
(only the thread that holds the GIL, C++ frames included) and ``--threads``. Prints what share
of the samples are ddpdoctor's: on the training thread (its code the innermost Python frame,
gloo's own work under the forwarded call excepted) and on ddpdoctor's own threads, with the
functions that take most, and the same as a share of the whole sampling time (the GIL is free
while the rank waits in gloo or in a kernel that released it). The job is stopped by process
id at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402  (bench/ is not a package)

_OWN = re.compile(r"ddpdoctor/runtime/")
_PY_FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


def _rank0(tag: str, script: str) -> int | None:
    """Rank 0's worker process of the tagged job (torchrun gives it ``RANK=0``), once it
    exists."""
    for pid in overhead._tagged_pids(tag):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue
        if b"RANK=0" in env and script.encode() in cmdline:
            return pid
    return None


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _name(frame: str) -> str:
    """``function (file)`` of a py-spy frame, without the folder and the line."""
    m = _PY_FRAME.match(frame)
    return frame if m is None else f"{m[1]} ({m[2].rsplit('/', 1)[-1]})"


def analyse(raw: Path, seconds: float, rate: int) -> str:
    """The report on py-spy's raw (collapsed) output ``raw``, sampled ``rate`` times a second
    for ``seconds``."""
    threads: Counter[str] = Counter()
    own_main: Counter[str] = Counter()
    own_total = main_own = 0
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") else "?"
        total += n
        threads[thread] += n
        if thread.startswith("ddpdoctor"):
            own_total += n
            continue
        # ddpdoctor's when its code is the innermost Python on the stack, unless what runs
        # below it is the collective itself (gloo's C++ under the forwarded call: torch's
        # work, which plain torch does too). ddpdoctor's wrappers of DDP's methods stay on
        # the stack while DDP's own code runs: those samples are torch's.
        python = [f for f in frames if _PY_FRAME.match(f) and ".py" in f]
        if python and _OWN.search(python[-1]):
            below = frames[frames.index(python[-1]) + 1:]
            if not any("c10d::" in f for f in below):
                main_own += n
                own_total += n
                own_main[_name(python[-1])] += n
    possible = seconds * rate
    rows = [
        f"rank 0, {seconds:.0f} s at {rate} Hz: {total} samples with the GIL held "
        f"({total / possible:.0%} of the time)",
        "",
        "| where | samples | share of GIL-held | share of all time |",
        "|---|---|---|---|",
        f"| ddpdoctor, all | {own_total} | {own_total / max(total, 1):.2%} | "
        f"{own_total / possible:.2%} |",
        f"| ddpdoctor on the training thread | {main_own} | {main_own / max(total, 1):.2%} | "
        f"{main_own / possible:.2%} |",
    ]
    for thread, n in threads.most_common():
        if thread.startswith("ddpdoctor"):
            rows.append(f"| thread {thread} | {n} | {n / max(total, 1):.2%} | "
                        f"{n / possible:.2%} |")
    rows += ["", "ddpdoctor's functions on the training thread (innermost Python frame):", ""]
    rows += [f"* {name}: {n} ({n / max(total, 1):.2%})" for name, n in own_main.most_common(8)]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="sampling time")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the job")
    parser.add_argument("--rate", type=int, default=500, help="samples per second")
    args = parser.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    tag = uuid.uuid4().hex
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-profile-"))
    env = dict(os.environ, **{overhead.TAG_ENV: tag, "TMPDIR": str(work)})  # leftovers with work
    cmd = [sys.executable, "-m", "ddpdoctor", "run", "--logdir", str(work / "logs"),
           "--nproc-per-node", "2", str(overhead.CNN), "--steps", str(args.steps)]
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        pid = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:
            pid = pid or _rank0(tag, overhead.CNN.name)
            if pid is not None and _cpu_seconds(pid) > 8.0:  # imports, set-up, warm-up done
                break
            time.sleep(0.5)
        else:
            raise SystemExit("the job ended or never trained before it could be sampled")
        raw = work / "profile.txt"
        subprocess.run([spy, "record", "--gil", "--native", "--threads", "-r", str(args.rate),
                        "-d", str(int(args.seconds)), "-f", "raw", "-o", str(raw),
                        "-p", str(pid)], check=True, capture_output=True, timeout=args.seconds + 60)
        print(analyse(raw, args.seconds, args.rate))
    finally:
        job.terminate()
        try:
            job.wait(10)
        except subprocess.TimeoutExpired:
            job.kill()
        overhead.stop_tagged(tag)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
