"""How much Python the recording runs per collective: bytecode executed on the calling thread
in one steady-state ``all_reduce``, counted, not timed.

    python bench/hot_path_code.py [--before COMMIT]

In a busy rank the training thread comes back from each wait to cold caches, and pays for
every line of bytecode (and every object) the recording touches: a part's in-job price is
3-8 times its single-process one (bench/RESULTS.md, sessions 41-42), and the whole-job
figures that decide issue 56 need 16-20 rounds to resolve 4 µs. This count is exact and
takes seconds: under ``ddpdoctor run`` (one rank, gloo), one ``dist.all_reduce`` of one
float is traced opcode by opcode after 200 untraced ones, for ddpdoctor's recording and each
stand-in of ``hot_path_floor.py``; only ddpdoctor's and the stand-ins' own code objects
count (torch's Python is the same for all). Per variant: the instructions executed, their
bytes (with the inline caches CPython 3.11+ keeps after each), and the 64-byte lines of
bytecode they lie in. ``--before`` adds that commit's ddpdoctor (its ``src`` from ``git
archive``).
"""

from __future__ import annotations

import argparse
import dis
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MARK = "CODE "
VARIANTS = ("full", "lean", "floor", "off")
LINE = 64


@functools.cache
def _package() -> str:
    import ddpdoctor

    return os.path.dirname(os.path.abspath(ddpdoctor.__file__)) + os.sep


def _ours(code: CodeType) -> bool:
    """ddpdoctor's code (the package this process imported) or a stand-in's."""
    name = code.co_filename
    return name.startswith(_package()) or name == str(HERE / "hot_path_floor.py")


def executed(step: Any, trace: bool = True,
             ours: Callable[[CodeType], bool] = _ours) -> dict[str, tuple[int, int, int]]:
    """(instructions, bytes, 64-byte lines) of each code object that ``ours`` accepts and one
    ``step()`` runs, by ``file:function`` (``trace`` False: just the step, from the same call
    path)."""
    seen: dict[CodeType, set[int]] = {}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if not ours(frame.f_code):
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen.setdefault(frame.f_code, set()).add(frame.f_lasti)
        return tracer

    if trace:
        sys.settrace(tracer)
    try:
        step()
    finally:
        sys.settrace(None)
    out = {}
    for code, offsets in seen.items():
        ins = list(dis.get_instructions(code))
        ends = {a.offset: b.offset for a, b in zip(ins, ins[1:])}
        ends[ins[-1].offset] = len(code.co_code)
        spans = [(o, ends.get(o, o + 2)) for o in offsets]
        lines = {n for start, end in spans for n in range(start // LINE, (end - 1) // LINE + 1)}
        name = f"{Path(code.co_filename).name}:{code.co_name}"
        out[name] = (len(offsets), sum(end - start for start, end in spans), len(lines))
    return out


def in_job() -> None:
    """The rank's part: count each variant, print one ``CODE {json}`` line."""
    import torch
    import torch.distributed as dist

    import hot_path_floor

    dist.init_process_group("gloo")
    t = torch.ones(1)

    def step() -> None:
        dist.all_reduce(t)

    group = dist.distributed_c10d._get_default_group()
    issue = group._issue
    result = {}
    for variant in VARIANTS:
        group._issue, group._enabled = issue, True
        hot_path_floor.use(variant)
        for i in range(201):  # the site known, caches filled: the last call traced
            result[variant] = executed(step, trace=i == 200)
    print(MARK + json.dumps(result), flush=True)
    dist.destroy_process_group()


def measure(src: Path) -> dict[str, dict[str, list[int]]]:
    """Run the rank's part under ``ddpdoctor run`` from ``src``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src), os.environ.get("PYTHONPATH", "")]), "DDPDOCTOR_HOT_PATH_CODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "run", "--nproc-per-node", "1",
                           "--hang-timeout", "60", __file__], env=env, capture_output=True,
                          text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise SystemExit(f"no {MARK.strip()} line from the job:\n{proc.stdout}\n{proc.stderr}")


def table(arms: dict[str, dict[str, dict[str, list[int]]]]) -> str:
    """The totals by arm and variant, then ddpdoctor's code objects one by one."""
    rows = ["| arm | variant | instructions | bytes | 64-byte lines |", "|---|---|---|---|---|"]
    for arm, result in arms.items():
        for variant, parts in result.items():
            ins, size, lines = (sum(p[i] for p in parts.values()) for i in range(3))
            rows.append(f"| {arm} | {variant} | {ins} | {size} | {lines} |")
    for arm, result in arms.items():
        rows += ["", f"{arm}, ddpdoctor's recording by code object:",
                 "| code object | instructions | bytes | 64-byte lines |", "|---|---|---|---|"]
        for name, (ins, size, lines) in sorted(result["full"].items()):
            rows.append(f"| {name} | {ins} | {size} | {lines} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="a commit whose ddpdoctor to count beside")
    args = parser.parse_args()
    from launcher_cost import checkout

    arms = {"this": measure(HERE.parent / "src")}
    if args.before:
        arms[args.before] = measure(checkout(args.before))
    print(table(arms))


if __name__ == "__main__":
    in_job() if os.environ.get("DDPDOCTOR_HOT_PATH_CODE") else main()
