"""Every performance figure of ddpdoctor: ``python bench/run.py`` (``--quick``).

First the headline, what a user sees (``whole_job.py``): whole jobs of plain torchrun and
``ddpdoctor run`` in units of eight (plain, ddpdoctor, ddpdoctor, plain, twice, or the
reverse; four with ``--quick``), the
median of the per-unit ratios with their interquartile range, the other tenants' CPU during
each job, and ddpdoctor's own process's CPU per job-minute. Then
the table that explains it, each figure a ratio against a baseline measured in the same
invocation:

a. caller-thread CPU µs per recorded collective (the recording process group around a backend
   that returns at once) against calling that backend directly; and the whole process's CPU
   per collective once the writer thread has encoded and written it (single process); then
   the floor: one-rank gloo jobs of an all-reduce loop with PyTorch's flight recorder on
   (torch 2.13's default), off, and under ddpdoctor (which switches it off), alternating;
b. a realistic job (``cnn_job.py``: a 3.0 M-parameter CNN with BatchNorm, ``bucket_cap_mb=0.5``,
   2 gloo ranks), plain torchrun / ``ddpdoctor run`` / ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
   alternating. Whole jobs on a shared 2-core machine differ by more than the 1 % target from
   round to round, so the targets are carried by what ddpdoctor adds, measured where it is
   spent: the CPU of its threads in each job, and what its recording group costs the training
   thread per step in this job, where the training leaves the caches cold (steps rotating
   between a twin model on a plain group over the same backend, the calls that enter the
   recording group alone, its forwarding, and recording on); the whole-job ratios are
   shown beside it with their spread;
c. a small all_reduce loop: the CPU that recording adds to one collective while both ranks
   run, on the training thread (blocks through the recording group, the same with recording
   off, and through torch's own path to the same gloo backend, alternating in one job) and on
   ddpdoctor's own threads (their CPU clocks), which is the figure the target is held to;
   every thread's CPU per op against plain torchrun (a cross-check: whole jobs spread wider
   than the target), and time per op under ``ddpdoctor run`` and under DETAIL against plain
   torchrun;
d. ``ddpdoctor diff`` wall time and peak RSS (a fresh process each) on synthetic traces from
   ``bench/synth.py`` (DDP-like, one injected divergence): collectives per rank grow at 8
   ranks, then ranks grow at 50,000 collectives; the baseline is reading the same bytes and
   splitting their lines, and the record-by-record reader (the code before the compact path)
   is measured once at 8 x 50,000, reading in one process (instead of worker processes,
   ``ddpdoctor.trace.parallel``) once at 64 x 50,000; at 1024 x 20,000 the whole ``ddpdoctor
   diff`` command (start-up included), the median of 3; and the same on copies of a real
   job's traces (``real_traces.py``). Each diagnosis must name the injected divergence;
e. hang-to-diagnosis seconds (``bench/hang_latency.py``) against the hang timeout, for a rank
   stuck outside collectives (target: the timeout + 1 s), and, for collectives that provably
   cannot match, with a 30 s hang timeout (target 2 s);
f. trace bytes per collective on disk (CNN job); the uncapped trace of an hour at 10 steps/s
   of the headline's job (DDP's default buckets, 4.4 M parameters), of one 25 MB bucket and
   of a many-bucket one; the same with the default cap, from the rates of the CNN job paced
   to 10 steps/s without a cap and capped from the start; and a long all_reduce loop's traces
   with ``--max-trace-mb 0.25``;
g. ``ddpdoctor diff`` wall time (start-up included) and peak RSS on the worst damaged inputs:
   2 GB sparse traces, a 2 GB fault file, absurd world sizes and sequence numbers, a line
   nested 200,000 deep;
h. a whole job's log folders at scale (``--nodes``, default 2,048 nodes x 8 ranks x 10,000
   collectives, ``synth.generate_nodes``): each node's folder as ``ddpdoctor run`` leaves it
   (identical ranks as member files of the node's first, trace format 8), one rank diverging,
   and again with the ranks in 4 behaviour classes (a group per block of nodes); the whole
   ``ddpdoctor diff`` command over every folder (median of 3), its peak RSS, and ``ddpdoctor
   timeline`` (one track per class of identical ranks). The baseline is what the same traces
   weigh written whole;
i. the launcher's own CPU per minute of the job while it watches (``launcher_cost.py``):
   2 and 8 fake ranks writing real traces through the rank's own writer at 100, 1,000 and
   5,000 collectives a second each, against the same code with the ranks idle (target at 8 x
   1,000: 0.5 CPU-s, flat in the rate).

The machine's load average is printed before and after: other processes on the machine make
every timing noisier (the alternation and the medians are there for that).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402
import real_traces  # noqa: E402
import synth  # noqa: E402
import whole_job  # noqa: E402
from ddpdoctor.launch.options import RunOptions  # noqa: E402

MB = 1024 * 1024
DEFAULT_CAP_MB = RunOptions.max_trace_mb  # the class default


@dataclass
class Row:
    """One line of the table."""

    item: str
    measure: str
    base_name: str
    base: float
    value: float
    unit: str
    target: str = ""
    met: bool | None = None
    note: str = ""
    median_ratio: float | None = None  # when the figure is a median of ratios, not value/base

    @property
    def ratio(self) -> float:
        if self.median_ratio is not None:
            return self.median_ratio
        return self.value / self.base if self.base else float("nan")


def _fmt(x: float) -> str:
    if x != x:  # nan
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (readable as plain text too)."""
    head = ["", "measure", "baseline", "base", "ddpdoctor", "ratio", "target", "met", "notes"]
    body = [[r.item, r.measure, r.base_name, f"{_fmt(r.base)} {r.unit}",
             f"{_fmt(r.value)} {r.unit}", f"×{r.ratio:.3f}" if r.ratio == r.ratio else "-",
             r.target, {True: "yes", False: "NO", None: ""}[r.met], r.note] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(head, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |"
              for row in body]
    return "\n".join(lines)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- a, b, c: overhead ----------------------------------------------------------------------
def hot_path(repeats: int) -> list[Row]:
    say("a: hot path")
    runs = [overhead.hot_path_us() for _ in range(repeats)]
    plain = statistics.median(r.plain_us for r in runs)
    rec = statistics.median(r.recorded_us for r in runs)
    low, high = min(r.recorded_us for r in runs), max(r.recorded_us for r in runs)
    wall = statistics.median(r.recorded_wall_us for r in runs)
    cpu = statistics.median(r.cpu_us for r in runs)
    module = statistics.median(r.module_loop_us for r in runs)
    return [
        Row("a", "caller-thread CPU per recorded collective", "backend called directly",
            plain, rec, "µs", "≤ +10 µs", rec - plain <= 10,
            f"+{rec - plain:.2f} µs ({low:.2f}–{high:.2f}, wall {wall:.2f}); median of "
            f"{repeats} runs, each the mean over 50,000 calls"),
        Row("a", "process CPU per collective, writer thread incl.", "backend called directly",
            plain, cpu, "µs", "", None, "encoding and write off the caller's thread"),
        Row("a", "caller-thread CPU, loop at module level of a 2,000-line script",
            "backend called directly", plain, module, "µs", "", None,
            "where tutorials put the training loop: deep in a long code object"),
    ]


def floor(rounds: int, ops: int = 20_000) -> list[Row]:
    """Item a, against PyTorch's flight recorder: a one-rank gloo job (``small_ops.py``: an
    all-reduce loop, no other rank to wait for) as plain torchrun (the flight recorder on, torch
    2.13's default), plain torchrun with it off, and ``ddpdoctor run`` (which switches it off),
    alternating; the training thread's CPU per op of each."""
    say(f"a: the flight recorder's floor, {rounds} rounds of one-rank jobs")
    kinds = [overhead.PLAIN, overhead.NO_FR, overhead.DOCTOR]
    res: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            j = overhead.job(kind, overhead.SMALL_OPS, ["--ops", str(ops)], nproc=1)
            res[kind].append(j.ranks[0]["thread_us"])
    fr = [on - off for on, off in zip(res[overhead.PLAIN], res[overhead.NO_FR])]
    own = [d - off for d, off in zip(res[overhead.DOCTOR], res[overhead.NO_FR])]
    net = [d - on for d, on in zip(res[overhead.DOCTOR], res[overhead.PLAIN])]
    off = statistics.median(res[overhead.NO_FR])

    def spread(values: list[float]) -> str:
        return f"{min(values):+.2f} to {max(values):+.2f} over {len(values)} rounds"

    return [
        Row("a", "one-rank gloo all_reduce loop: training-thread CPU per op, flight recorder",
            "flight recorder off", off, off + statistics.median(fr), "µs", "", None,
            f"{statistics.median(fr):+.2f} µs ({spread(fr)}): PyTorch's own record of each "
            f"collective (on by default in torch 2.13), the floor"),
        Row("a", "same loop under ddpdoctor (its record; the flight recorder off)",
            "flight recorder off", off, off + statistics.median(own), "µs", "", None,
            f"{statistics.median(own):+.2f} µs ({spread(own)}): ddpdoctor's record, "
            f"×{statistics.median(own) / statistics.median(fr):.1f} the flight recorder's; "
            f"against plain torch with its default flight recorder "
            f"{statistics.median(net):+.2f} µs ({spread(net)})"),
    ]


def realistic(rounds: int, steps: int, ab_steps: int
              ) -> tuple[list[Row], list[overhead.JobResult]]:
    """Item b. The targets are carried by what ddpdoctor adds, measured where it is spent:
    its threads' CPU in each ddpdoctor job, and what its recording group costs the training
    thread in this job (``cnn_job.py --ab``, ``ab_steps`` steps rotating between a twin
    model on a plain group over the same backend, the calls that enter the recording group
    alone, its forwarding with recording off, and recording on: on − plain is ddpdoctor's
    cost a step, split into the entry, the forwarding and the record). Whole jobs against
    plain torchrun are shown beside it with their spread."""
    say(f"b: CNN job, {rounds} rounds of plain/ddpdoctor/DETAIL jobs")
    res, failed = overhead.alternate([overhead.PLAIN, overhead.DOCTOR, overhead.DETAIL],
                                     overhead.CNN, ["--steps", str(steps)], rounds)
    if overhead.DOCTOR in failed:
        raise SystemExit(failed[overhead.DOCTOR])
    say("b: CNN job under ddpdoctor, steps rotating between a plain group and the recording "
        "group's entry, forwarding and record (3 jobs)")
    ab = [r for _ in range(3) for r in overhead.job(
        overhead.DOCTOR, overhead.CNN, ["--steps", str(ab_steps), "--ab"]).ranks]
    record_us = statistics.median(r["issue_on_us"] - r["issue_off_us"] for r in ab)

    def per_step(kind: str, base: str) -> list[float]:
        """Training-thread CPU ms a step of ``kind`` adds to one of ``base``, rank by rank."""
        return sorted(r[f"step_cpu_{kind}_ms"] - r[f"step_cpu_{base}_ms"] for r in ab)

    added, entry = per_step("on", "plain"), per_step("bare", "plain")
    forwarding, recording = per_step("off", "bare"), per_step("on", "off")
    step_plain = statistics.median(r["step_cpu_plain_ms"] for r in ab)
    step_added = statistics.median(added)
    doc, plain = res[overhead.DOCTOR], res[overhead.PLAIN]
    warmup = 5  # cnn_job.py's default
    collectives = statistics.median((j.collective_lines / 2 - 5) / (steps + warmup)
                                    for j in doc)
    plain_cpu = statistics.median(j.total("cpu_s") for j in plain)
    plain_step = statistics.median(j.median("step_ms") for j in plain)
    # Added CPU per rank over the measured steps, job by job: threads (measured) + the steps'.
    cpu_ratios = sorted(1 + (j.total("tool_threads_cpu_s") / 2 + steps * step_added / 1e3)
                        / (plain_cpu / 2) for j in doc)
    threads = statistics.median(j.total("tool_threads_cpu_s") / 2 for j in doc)
    step_ratio = 1 + step_added / step_plain
    cpu = overhead.paired(res, overhead.PLAIN, overhead.DOCTOR, lambda r: r.total("cpu_s"))
    step = overhead.paired(res, overhead.PLAIN, overhead.DOCTOR, lambda r: r.median("step_ms"))
    job_cpu = overhead.paired(res, overhead.PLAIN, overhead.DOCTOR, lambda r: r.job_cpu_s)
    params = doc[0].ranks[0]["params"]
    what = f"{params / 1e6:.1f} M params, BN, bucket_cap_mb=0.5, {collectives:.1f} " \
           f"collectives/step"
    median_cpu = statistics.median(cpu_ratios)

    def spread(values: list[float]) -> str:
        return f"{values[0] * 1e3:+.0f} to {values[-1] * 1e3:+.0f} µs"

    rows = [
        Row("b", f"CNN job ({what}): rank CPU added by ddpdoctor", "plain torchrun",
            plain_cpu / 2, plain_cpu / 2 * median_cpu, "s", "≤ ×1.01", max(cpu_ratios) <= 1.01,
            f"×{cpu_ratios[0]:.4f}–{cpu_ratios[-1]:.4f} over {len(doc)} jobs: its threads "
            f"{threads * 1e3:.0f} ms + {steps} steps × {step_added * 1e3:.0f} µs (the "
            f"training thread's, below) per rank", median_ratio=median_cpu),
        Row("b", "CNN job: training-thread CPU per step, ddpdoctor's group against a plain "
            "one", "plain group", step_plain, step_plain + step_added, "ms", "≤ ×1.01",
            step_ratio <= 1.01,
            f"{step_added * 1e3:+.0f} µs a step ({spread(added)} over {len(ab)} ranks × jobs; "
            f"steps rotating in one job, a twin model on a plain group over the same "
            f"backend), {step_added * 1e3 / collectives:.0f} µs per collective: the entry "
            f"into the recording group {statistics.median(entry) * 1e3:+.0f} µs "
            f"({spread(entry)}), "
            f"the forwarding {statistics.median(forwarding) * 1e3:+.0f} µs "
            f"({spread(forwarding)}), the record {statistics.median(recording) * 1e3:+.0f} µs "
            f"({spread(recording)}; its call {record_us:.0f} µs per collective, on − off)",
            median_ratio=step_ratio),
        Row("b", "CNN job, whole jobs: rank CPU over the steps", "plain torchrun",
            statistics.median(cpu.base), statistics.median(cpu.other), "s", "", None,
            f"cross-check, median of per-round ratios, {cpu.spread()}", median_ratio=cpu.ratio),
        Row("b", "CNN job, whole jobs: median step time", "plain torchrun",
            statistics.median(step.base), statistics.median(step.other), "ms", "", None,
            f"cross-check, {step.spread()}", median_ratio=step.ratio),
        Row("b", "CNN job, whole jobs: CPU of every process", "plain torchrun",
            statistics.median(job_cpu.base), statistics.median(job_cpu.other), "s", "", None,
            f"{job_cpu.spread()}; launcher, torchrun agent and ranks, start-up included",
            median_ratio=job_cpu.ratio),
    ]
    if overhead.DETAIL in failed:
        rows.append(Row("b", "CNN job, TORCH_DISTRIBUTED_DEBUG=DETAIL", "plain torchrun",
                        plain_step, float("nan"), "ms", "(anchor)", None,
                        f"did not run: {failed[overhead.DETAIL]}"))
    else:
        det = overhead.paired(res, overhead.PLAIN, overhead.DETAIL,
                              lambda r: r.median("step_ms"))
        rows.append(Row("b", "CNN job, TORCH_DISTRIBUTED_DEBUG=DETAIL: step time",
                        "plain torchrun", statistics.median(det.base),
                        statistics.median(det.other), "ms", "(anchor)", None, det.spread(),
                        median_ratio=det.ratio))
    return rows, doc


def small_ops(rounds: int, ops: int, single_us: float | None = None) -> list[Row]:
    """Rows of item c. ``single_us``: what recording adds to the caller's thread in a single
    process (item a), to compare the two."""
    say(f"c: all_reduce loop, {rounds} rounds of plain/ddpdoctor/DETAIL jobs")
    res, failed = overhead.alternate([overhead.PLAIN, overhead.DOCTOR, overhead.DETAIL],
                                     overhead.SMALL_OPS, ["--ops", str(ops), "--wrapper-ab"],
                                     rounds)
    for kind in (overhead.DOCTOR, overhead.DETAIL):
        if kind in failed:
            raise SystemExit(failed[kind])
    doc = overhead.paired(res, overhead.PLAIN, overhead.DOCTOR, lambda r: r.median("op_us"))
    det = overhead.paired(res, overhead.PLAIN, overhead.DETAIL, lambda r: r.median("op_us"))
    cpu = overhead.paired(res, overhead.PLAIN, overhead.DOCTOR, lambda r: r.median("cpu_us"))

    def whole_jobs(measure: str, pair: overhead.Paired, what: str) -> Row:
        """A cross-check row: a per-op figure of ddpdoctor jobs against plain ones."""
        added = [o - b for b, o in zip(pair.base, pair.other)]
        return Row("c", measure, "plain torchrun", statistics.median(pair.base),
                   statistics.median(pair.other), "µs", "", None,
                   f"cross-check, {statistics.median(added):+.1f} µs (median of per-round "
                   f"differences, {min(added):+.1f} to {max(added):+.1f}): {what}",
                   median_ratio=pair.ratio)

    base = statistics.median(doc.base)
    share = (f"; ddpdoctor adds {(doc.ratio - 1) / (det.ratio - 1):.1%} of what DETAIL adds"
             if det.ratio > 1 else "")
    ranks = [r for j in res[overhead.DOCTOR] for r in j.ranks]
    wrapped = [r["wrapped_cpu_us"] for r in ranks]
    plain = [r["plain_cpu_us"] for r in ranks]
    direct = [r["direct_cpu_us"] for r in ranks]
    wrapper_us = statistics.median(w - p for w, p in zip(wrapped, plain))
    forwarding_us = statistics.median(r["off_cpu_us"] - r["plain_cpu_us"] for r in ranks)
    # What ddpdoctor adds to the process per collective: on the training thread (the A/B
    # blocks: its group against torch's own path to the same backend) and on its own
    # threads; gloo's threads are the same either way.
    added = [r["wrapped_cpu_us"] - r["plain_cpu_us"] + r["threads_cpu_us"] for r in ranks]
    added_process = statistics.median(added)
    threads_us = statistics.median(r["threads_cpu_us"] for r in ranks)
    threads_alt = statistics.median(r["threads_alternating_cpu_us"] for r in ranks)
    q = statistics.quantiles(added, n=4) if len(added) > 1 else [added[0]] * 3
    spin_alone = statistics.median(r["spin_alone_us"] for r in ranks)
    spin_job = statistics.median(r["busy_cpu_us"] - r["plain_cpu_us"] for r in ranks)
    spin_ratio = spin_job / spin_alone
    recording_ratio = ""
    if single_us:
        recording_ratio = (
            f"; recording costs ×{wrapper_us / single_us:.1f} (+{wrapper_us:.1f} µs here, "
            f"+{single_us:.2f} single-process: item a): the rest is its code and data, "
            f"cold again after each wait")
    base_process = statistics.median(cpu.base)
    return [
        Row("c", "caller-thread CPU per collective, both ranks running",
            "ProcessGroup → gloo", statistics.median(plain), statistics.median(wrapped), "µs",
            "", None,
            f"+{wrapper_us:.1f} µs: record + trace line (median over ranks and jobs; blocks of "
            f"200 alternating in one job with torch's path, which dispatches to the same gloo "
            f"backend; the forwarding alone, recording off: {forwarding_us:+.1f} µs; the "
            f"backend's binding called directly: {statistics.median(direct):.1f} µs)"),
        Row("c", "all_reduce float32[1] loop: process CPU added per collective, in the job",
            "plain torchrun", base_process, base_process + added_process, "µs", "≤ +10 µs",
            q[2] <= 10,
            f"{added_process:+.1f} µs: training thread +{wrapper_us:.1f} (row above) and "
            f"ddpdoctor's threads +{threads_us:.1f} (in a loop recording without pause; "
            f"charged over the whole A/B alternation, {threads_alt:.1f}); quartiles "
            f"{q[0]:+.1f} to {q[2]:+.1f} over {len(ranks)} ranks × jobs, met when the upper "
            f"one is inside; the flight recorder, off in both arms here, is not credited "
            f"(item a)"),
        whole_jobs("same loop, whole jobs: training-thread CPU per op",
                   overhead.paired(res, overhead.PLAIN, overhead.DOCTOR,
                                   lambda r: r.median("thread_us")),
                   "ddpdoctor's record (first row), less the flight recorder's, which it "
                   "switches off"),
        Row("c", "a pure-Python loop before each collective: its caller-thread CPU, in the job",
            "the loop alone", spin_alone, spin_job, "µs", "", None,
            f"a loop's CPU costs ×{spin_ratio:.1f} its single-process price here while both "
            f"ranks run (same A/B blocks){recording_ratio}"),
        whole_jobs("same loop, whole jobs: process CPU per op", cpu,
                   "every thread of the rank; jobs against jobs spread wider than the target"),
        Row("c", "same loop: time per op, ddpdoctor", "plain torchrun", base,
            statistics.median(doc.other), "µs/op", "< DETAIL", doc.ratio < det.ratio,
            f"median of per-round ratios, {doc.spread()}", median_ratio=doc.ratio),
        Row("c", "same loop, TORCH_DISTRIBUTED_DEBUG=DETAIL", "plain torchrun", base,
            statistics.median(det.other), "µs/op", "(anchor)", None, det.spread() + share,
            median_ratio=det.ratio),
    ]


# -- d: diff at scale -----------------------------------------------------------------------
_DIFF = r"""
import json, sys, time
t0 = time.perf_counter()
from ddpdoctor.trace import reader
from ddpdoctor.analysis import diagnose
if sys.argv[2] == "legacy":
    from ddpdoctor.trace.compact import NotCompact
    def refuse(*a, **k):
        raise NotCompact("record by record")
    reader.read_compact = reader.read_shared = refuse
if sys.argv[2] in ("legacy", "serial"):
    from ddpdoctor.trace import parallel as _parallel
    _parallel.MIN_FILES = 1 << 60
t1 = time.perf_counter()
if sys.argv[2] == "idle":
    run = None
else:
    from pathlib import Path as _Path
    run = reader.load_run(sorted(_Path(sys.argv[1]).glob("node-*")) or [sys.argv[1]])
t2 = time.perf_counter()
report = diagnose(run) if run is not None else None
t3 = time.perf_counter()
root = report.findings[0] if report and report.findings else None
# Peak RSS of this process image: VmHWM (ru_maxrss would include the parent's memory, which
# a forked child carries until it executes this interpreter); plus, when worker processes
# read the traces, each worker's peak (RUSAGE_CHILDREN: the largest one, counted once per
# worker; pages they share with this process counted twice, so an upper bound).
import resource
from pathlib import Path
from ddpdoctor.trace import parallel, schema
with open("/proc/self/status") as fh:
    hwm = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
files = [] if run is None else sorted(Path(sys.argv[1]).glob(schema.TRACE_GLOB)) or \
    sorted(Path(sys.argv[1]).glob("node-*/" + schema.TRACE_GLOB))
workers = parallel.workers_for(files)
hwm += workers * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"load": t2 - t1, "diagnose": t3 - t2, "import": t1 - t0,
                  "maxrss_kb": hwm, "workers": workers,
                  "root": [root.kind, root.seq, sorted(root.ranks)] if root else None,
                  "verdict": report.verdict if report else None}))
"""


WHOLE_RUNS = 3  # `ddpdoctor diff` of 1024 ranks, start-up included: the median of these


def _diff_child(folder: Path | None, mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _DIFF, str(folder), mode], capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"diff benchmark failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _read_floor(folder: Path) -> float:
    """Seconds to read every trace's bytes and split them into lines (no parsing at all)."""
    t0 = time.perf_counter()
    for path in sorted(folder.glob("rank-*.jsonl")):
        path.read_bytes().split(b"\n")
    return time.perf_counter() - t0


def diff_real(work: Path, ranks: int = 1024) -> list[Row]:
    """``ddpdoctor diff``, whole command, of copies of a real job's traces (``real_traces.py``:
    ~20,000 collectives a rank, one rank's reduce op differing at ~#15,000)."""
    folder = work / f"real-{ranks}"
    say(f"d: recording a real job and copying its traces to {ranks} ranks")
    info = real_traces.generate(folder, ranks)
    floor = min(_read_floor(folder) for _ in range(2))
    res = _diff_child(folder, "compact")
    walls = []
    for _ in range(WHOLE_RUNS):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "ddpdoctor", "diff", str(folder)],
                             capture_output=True, text=True, timeout=600)
        walls.append(time.perf_counter() - t0)
    found = "reduce_op_mismatch" in out.stdout and f"rank {info['diverge_rank']} " in out.stdout
    wall, rss = statistics.median(walls), res["maxrss_kb"] / 1024
    scale = f"{ranks} ranks × {info['collectives']:,}, copies of a real job's traces"
    return [
        Row("d", f"diff wall, whole command {scale}", "read + split the bytes", floor, wall,
            "s", "≤ 5 s", wall <= 5.0 and found,
            f"median of {WHOLE_RUNS} ({min(walls):.2f}–{max(walls):.2f} s); read "
            f"{res['load']:.2f} s, compare+diagnose {res['diagnose']:.2f} s; "
            f"{info['bytes'] / MB:,.0f} MB; "
            f"{'divergence found' if found else 'DIVERGENCE NOT FOUND'}"),
        Row("d", f"diff peak RSS, {scale}", "python + ddpdoctor imported",
            _diff_child(None, "idle")["maxrss_kb"] / 1024, rss, "MB", "≤ 300 MB", rss <= 300,
            f"this process + {res['workers']} workers' peaks (shared pages counted twice)"
            if res["workers"] else ""),
    ]


def diff_scale(shapes: list[tuple[int, int]], legacy_at: tuple[int, int] | None,
               serial_at: tuple[int, int] | None, work: Path) -> list[Row]:
    rows: list[Row] = []
    idle = _diff_child(None, "idle")
    base_rss = idle["maxrss_kb"] / 1024
    for ranks, colls in shapes:
        folder = work / f"synth-{ranks}x{colls}"
        say(f"d: generating {ranks} ranks x {colls:,} collectives")
        t0 = time.perf_counter()
        info = synth.generate(folder, ranks, colls)
        gen = time.perf_counter() - t0
        say(f"d: {info['bytes'] / MB:,.0f} MB in {gen:.1f} s; diff")
        floor = min(_read_floor(folder) for _ in range(2))
        res = _diff_child(folder, "compact")
        wall = res["load"] + res["diagnose"]
        rss = res["maxrss_kb"] / 1024
        found = res["root"] is not None and res["root"][1] == info["diverge_seq"] and \
            info["diverge_rank"] in res["root"][2]
        scale = f"{ranks} ranks × {colls:,}"
        # (seconds, MB) targets: 256 × 50,000 from the hardening issue; 1024 × 20,000 is the
        # whole command, start-up included.
        target = {(256, 50_000): (20.0, 1024.0), (1024, 20_000): (5.0, 300.0)}.get((ranks, colls))
        spread = ""
        if (ranks, colls) == (1024, 20_000):
            walls = []
            for _ in range(WHOLE_RUNS):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "ddpdoctor", "diff", str(folder)],
                               capture_output=True, timeout=600)
                walls.append(time.perf_counter() - t0)
            wall = statistics.median(walls)
            whole = "whole command "
            spread = f"median of {WHOLE_RUNS} ({min(walls):.2f}–{max(walls):.2f} s); "
        else:
            whole = ""
        by = f", {res['workers']} worker processes" if res["workers"] else ""
        rows.append(Row(
            "d", f"diff wall, {whole}{scale}", "read + split the bytes", floor, wall, "s",
            f"≤ {target[0]:g} s" if target else "", (wall <= target[0]) if target else None,
            f"{spread}{wall / (ranks * colls) * 1e9:.0f} ns/collective; "
            f"read {res['load']:.2f} s "
            f"({res['load'] / ranks * 1e3:.0f} ms/rank{by}), "
            f"compare+diagnose "
            f"{res['diagnose']:.2f} s; {info['bytes'] / MB:,.0f} MB; "
            f"{'divergence found' if found else 'DIVERGENCE NOT FOUND'}"))
        rows.append(Row(
            "d", f"diff peak RSS, {scale}", "python + ddpdoctor imported", base_rss, rss, "MB",
            f"≤ {target[1]:g} MB" if target else "", (rss <= target[1]) if target else None,
            f"this process + {res['workers']} workers' peaks (shared pages counted twice)"
            if res["workers"] else ""))
        if res["workers"] and (ranks, colls) == serial_at:
            say("d: the same traces read in one process")
            one = _diff_child(folder, "serial")
            rows.append(Row("d", f"diff wall, {scale}, worker processes", "one process",
                            one["load"] + one["diagnose"], res["load"] + res["diagnose"], "s",
                            "", None, f"read {one['load']:.2f} s in one process, "
                            f"{res['load']:.2f} s by {res['workers']} workers"))
        if legacy_at == (ranks, colls):
            say("d: the record-by-record reader (before), same traces")
            old = _diff_child(folder, "legacy")
            old_wall = old["load"] + old["diagnose"]
            rows.append(Row("d", f"diff wall, {scale}, compact path", "record by record "
                            "(before)", old_wall, wall, "s", "", None,
                            f"before: read {old['load']:.2f} s, compare+diagnose "
                            f"{old['diagnose']:.2f} s"))
            rows.append(Row("d", f"diff peak RSS, {scale}, compact path", "record by record "
                            "(before)", old["maxrss_kb"] / 1024, rss, "MB", "", None, ""))
        shutil.rmtree(folder, ignore_errors=True)
    return rows


# -- h: a whole job's folders at scale ---------------------------------------------------------
def diff_nodes(work: Path, nodes: int, per_node: int, colls: int,
               classes: int) -> list[Row]:
    """``ddpdoctor diff`` and ``ddpdoctor timeline`` over ``nodes`` folders as ``ddpdoctor
    run`` leaves them (member files), one rank diverging, the ranks in ``classes`` classes."""
    folder = work / f"nodes-{nodes}x{per_node}-{classes}"
    ranks = nodes * per_node
    say(f"h: generating {nodes} nodes x {per_node} ranks x {colls:,} collectives, "
        f"{classes} class(es)")
    t0 = time.perf_counter()
    info = synth.generate_nodes(folder, nodes, per_node, colls, classes=classes)
    say(f"h: {info['bytes'] / MB:,.0f} MB, {info['members']:,} member files, "
        f"in {time.perf_counter() - t0:.0f} s; diff")
    whole_mb = info["whole_bytes"] / MB
    folders = [str(p) for p in sorted(folder.glob("node-*"))]
    walls, out = [], None
    for _ in range(WHOLE_RUNS):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "ddpdoctor", "diff", *folders],
                             capture_output=True, text=True, timeout=900)
        walls.append(time.perf_counter() - t0)
    assert out is not None
    res = _diff_child(folder, "compact")
    d = info["diverge_rank"]
    others = f"ranks 0-{d - 1}, {d + 1}-{ranks - 1}"
    found = res["root"] is not None and res["root"][1] == info["diverge_seq"] and \
        d in res["root"][2] and f"{others} issued" in out.stdout and f"rank {d} issued" in \
        out.stdout
    say("h: timeline")
    t0 = time.perf_counter()
    line = subprocess.run([sys.executable, "-m", "ddpdoctor", "timeline", "-o",
                           str(work / "timeline.json"), *folders],
                          capture_output=True, text=True, timeout=900)
    timeline_wall = time.perf_counter() - t0
    tracks = json.loads((work / "timeline.json").read_text())["metadata"]["tracks"] \
        if line.returncode == 0 else -1
    shutil.rmtree(folder, ignore_errors=True)
    wall, rss = statistics.median(walls), res["maxrss_kb"] / 1024
    scale = f"{nodes:,} nodes × {per_node} ranks × {colls:,}" + \
        (f", {classes} behaviour classes" if classes > 1 else "")
    return [
        Row("h", f"diff wall, whole command, {scale}", "-", float("nan"), wall, "s",
            "≤ 30 s", wall <= 30.0 and found,
            f"median of {WHOLE_RUNS} ({min(walls):.1f}–{max(walls):.1f} s); read "
            f"{res['load']:.1f} s, compare+diagnose {res['diagnose']:.1f} s; " +
            (f"the report names {others} and rank {d}" if found
             else "DIVERGENCE NOT NAMED")),
        Row("h", f"diff peak RSS, {scale}", "-", float("nan"), rss, "MB", "≤ 2048 MB",
            rss <= 2048, f"this process + {res['workers']} workers' peaks"),
        Row("h", f"traces on disk, {scale}", "written whole", whole_mb,
            info["bytes"] / MB, "MB", "", None,
            f"{info['members']:,} of {ranks:,} ranks are member files"),
        Row("h", f"timeline wall, {scale}", "-", float("nan"), timeline_wall, "s", "", None,
            f"{tracks} track(s) for {ranks:,} ranks (one per class of identical ranks)"
            if tracks > 0 else f"FAILED: {line.stderr[-300:]}"),
    ]


# -- g: diff on damaged inputs ---------------------------------------------------------------
def _damaged_folder(folder: Path, kind: str) -> None:
    """Two ranks' traces, damaged as ``kind`` says (the worst inputs of the hardening issue)."""
    folder.mkdir(parents=True)
    start = {"kind": "process_start", "world_size": 2, "pid": 1}
    stack = {"kind": "stack", "id": 0, "frames": [{"file": "t.py", "line": 3, "function": "f"}]}

    def coll(seq: int) -> dict:
        return {"kind": "collective", "id": 1, "seq": seq, "iteration": 0, "t": 1.0,
                "state": "pending", "group": "0", "op": "all_reduce", "label": "user",
                "shapes": [[2]], "dtypes": ["float32"], "numel": 2, "stack": 0}

    for rank in (0, 1):
        head = {"kind": "header", "format": "ddpdoctor-trace", "version": 3, "rank": rank,
                "run_id": "damaged", "attempt": 0}
        records = [start, stack, coll(1)]
        if kind == "world_size 10**9":
            records[0] = {**start, "world_size": 10**9}
        elif kind == "seq 10**9":
            records[2] = coll(10**9)
        path = folder / f"rank-{rank}.jsonl"
        text = "\n".join(json.dumps(r) for r in [head, *records]) + "\n"
        if kind == "nested 200,000 deep":
            text += "[" * 200_000 + "]" * 200_000 + "\n"
        path.write_text(text)
        if kind == "2 GB sparse traces":
            with open(path, "r+b") as fh:
                fh.truncate(2 * 1024**3)
        if kind == "2 GB fault file":
            with open(folder / "fault-1.txt", "wb") as fh:
                fh.write(b"Fatal Python error: Aborted\n")
                fh.truncate(2 * 1024**3)


def damaged(work: Path) -> list[Row]:
    """``diff`` wall time and peak memory on damaged inputs (target: 1 s and 200 MB each)."""
    rows: list[Row] = []
    idle = _diff_child(None, "idle")
    for kind in ("2 GB sparse traces", "2 GB fault file", "world_size 10**9", "seq 10**9",
                 "nested 200,000 deep"):
        folder = work / ("damaged-" + "".join(c if c.isalnum() else "-" for c in kind))
        _damaged_folder(folder, kind)
        say(f"g: diff on {kind}")
        res = _diff_child(folder, "compact")
        wall, rss = res["import"] + res["load"] + res["diagnose"], res["maxrss_kb"] / 1024
        rows.append(Row("g", f"diff on {kind}", "python + ddpdoctor imported",
                        idle["import"], wall, "s", "≤ 1 s", wall <= 1.0,
                        f"peak RSS {rss:.0f} MB (≤ 200 MB: {'yes' if rss <= 200 else 'NO'}); "
                        f"verdict {res['verdict']}"))
        shutil.rmtree(folder, ignore_errors=True)
    return rows


# -- e: hang latency ------------------------------------------------------------------------
def hang(rounds: int, timeout: float) -> list[Row]:
    if not (HERE / "hang_latency.py").exists():
        return [Row("e", "hang to diagnosis", "hang timeout", timeout, float("nan"), "s",
                    "≤ timeout + 5 s", None, "bench/hang_latency.py not present")]
    say(f"e: hang latency, {rounds} rounds")
    module = importlib.import_module("hang_latency")
    values = module.measure(timeout, rounds)
    median = statistics.median(values)
    rows = [Row("e", "hang to diagnosis printed", "hang timeout", timeout, median, "s",
                "≤ timeout + 5 s", median <= timeout + 5,
                f"+{median - timeout:.2f} s; {min(values):.2f}–{max(values):.2f} s over "
                f"{len(values)} runs; rank 0 in a barrier, rank 1 in a recv")]
    slow = module.TIMEOUT["mismatch"]
    values = module.measure(slow, rounds, "mismatch")
    median = statistics.median(values)
    rows.append(Row("e", "provable mismatch to diagnosis printed", "hang timeout", slow,
                    median, "s", "≤ 2 s", median <= 2.0,
                    f"{min(values):.2f}–{max(values):.2f} s over {len(values)} runs; rank 0 in "
                    f"a barrier, rank 1 in a DDP bucket all-reduce"))
    values = module.measure(timeout, rounds, "stuck")
    median = statistics.median(values)
    rows.append(Row("e", "rank stuck outside collectives to diagnosis printed", "hang timeout",
                    timeout, median, "s", "≤ timeout + 1 s", median <= timeout + 1,
                    f"+{median - timeout:.2f} s; {min(values):.2f}–{max(values):.2f} s over "
                    f"{len(values)} runs; rank 1 asleep after its fifth step, rank 0 in the "
                    f"sixth step's all-reduce"))
    return rows


# -- i: the launcher's own CPU against the rate of collectives -------------------------------
def launcher(ranks: tuple[int, ...], rates: tuple[float, ...], seconds: float,
             window: float) -> list[Row]:
    """Item i: ``launcher_cost.py``'s fake ranks at each rate, the launcher's CPU per
    job-minute while it watches, against the same code's at rate 0 (ranks idle)."""
    module = importlib.import_module("launcher_cost")
    rows = []
    for n in ranks:
        say(f"i: the launcher's CPU, {n} fake ranks at {', '.join(f'{r:g}' for r in rates)} "
            f"collectives/s each")
        idle = module.one(HERE.parent / "src", n, 0.0, seconds, window)["per_minute"]
        for rate in rates:
            got = module.one(HERE.parent / "src", n, rate, seconds, window)
            target = "≤ 0.5 CPU-s" if n >= 8 and rate >= 1000 else ""
            rows.append(Row("i", f"launcher CPU per job-minute, {n} ranks x {rate:g} "
                            f"collectives/s", "ranks idle", idle, got["per_minute"], "CPU-s",
                            target, got["per_minute"] <= 0.5 if target else None,
                            f"{got['rate']:.0f} collectives/s per rank achieved; "
                            f"{window:g} s window of a {seconds:g} s job"))
    return rows


# -- f: trace size --------------------------------------------------------------------------
def trace_size(jobs: list[overhead.JobResult], steps: int, seconds: float,
               ops: int) -> list[Row]:
    lines = sum(j.collective_lines for j in jobs)
    coll_bytes = sum(j.collective_bytes for j in jobs)
    total = sum(j.trace_bytes for j in jobs)
    rows = [Row("f", "trace bytes per collective (CNN job)", "collective line alone",
                coll_bytes / lines, total / lines, "B", "", None,
                f"{lines:,} collectives in {len(jobs)} jobs; the rest: done, stack, activity, "
                f"process records")]
    paced = int(seconds * 10)
    hour = 3600.0
    # An hour's trace is what the steps add: the difference between a job of ``paced`` steps
    # and one of a third as many (start-up, DDP's construction and the exit cancel out).
    short = paced // 3
    # The headline's job (issue 36's: 4.4 M parameters, DDP's default buckets, ~10 steps/s),
    # sessions 19-29's (one 25 MB bucket) and a many-bucket one; their trace does not depend
    # on the images' size, only on the collectives a step and the pace.
    for model, what in ((("--head-channels", "480", "--bucket-cap-mb", "default"),
                         "DDP's default buckets, 4.4 M parameters"),
                        (("--bucket-cap-mb", "25"), "bucket_cap_mb=25"),
                        (("--bucket-cap-mb", "0.5"), "bucket_cap_mb=0.5")):
        say(f"f: the CNN job ({what}) at 10 steps/s, {paced} and {short} steps, no cap")
        sizes = {}
        for steps in (paced, short):
            args = ["--steps", str(steps), "--size", "8", "--batch", "4", "--pace", "0.1",
                    *model]
            sizes[steps] = overhead.job(overhead.DOCTOR, overhead.CNN, args,
                                        options=("--max-trace-mb", "1e6"))
        per_step = (sizes[paced].trace_bytes - sizes[short].trace_bytes) / 2 / (paced - short)
        colls = (sizes[paced].collective_lines - sizes[short].collective_lines) / 2 / \
            (paced - short)
        rows.append(Row("f", f"uncapped trace per hour per rank at 10 steps/s, CNN, {what}",
                        "", float("nan"), per_step * 10 * hour / MB, "MB", "≤ 30 MB",
                        per_step * 10 * hour <= 30 * MB,
                        f"{per_step:.0f} B a step a rank ({colls:.1f} collectives, "
                        f"{per_step / colls:.0f} B each with their done records), the "
                        f"difference of {paced}- and {short}-step jobs; at 20 steps/s "
                        f"{per_step * 20 * hour / MB:.1f} MB"))
    full_rate = per_step * 10  # the many-bucket job: bytes per second per rank
    say(f"f: the same job capped from the start ({paced} steps)")
    args = ["--steps", str(paced), "--size", "8", "--batch", "4", "--pace", "0.1"]
    capped = overhead.job(overhead.DOCTOR, overhead.CNN, args, options=("--max-trace-mb", "0"))
    capped_rate = capped.trace_bytes / 2 / statistics.median(r["wall_s"] for r in capped.ranks)
    cap = DEFAULT_CAP_MB * MB
    fill = cap / full_rate
    per_hour = full_rate * hour if fill >= hour else cap + capped_rate * (hour - fill)
    rows.append(Row("f", "trace per hour per rank at 10 steps/s, default cap", "no cap",
                    full_rate * hour / MB, per_hour / MB, "MB", "≤ 30 MB", per_hour <= 30 * MB,
                    f"{DEFAULT_CAP_MB:g} MB in full ({fill / 60:.0f} min), then "
                    f"{capped_rate / 1024:.2f} KB/s (measured: {paced} paced steps, "
                    f"{full_rate / 1024:.2f} KB/s uncapped); same diagnosis (unit-tested)"))
    say(f"f: a {ops:,}-op all_reduce loop with and without --max-trace-mb 0.25")
    full = overhead.job(overhead.DOCTOR, overhead.SMALL_OPS, ["--ops", str(ops)],
                        options=("--max-trace-mb", "1e6"))
    capped = overhead.job(overhead.DOCTOR, overhead.SMALL_OPS, ["--ops", str(ops)],
                          options=("--max-trace-mb", "0.25"))
    n = 2 * (ops + 201)  # 2 ranks: the loop, its 200 warm-up all_reduces, the init barrier
    rows.append(Row("f", f"traces of 2 × {ops:,} all_reduces, --max-trace-mb 0.25",
                    "no cap", full.trace_bytes / MB, capped.trace_bytes / MB, "MB", "", None,
                    f"{capped.trace_bytes / n:.1f} B/collective with the cap, "
                    f"{full.trace_bytes / n:.0f} without"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds, no 256- or 1024-rank and no 200,000-collective "
                             "traces (about 6 minutes)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of alternating jobs for b (default 8, quick 3); c runs "
                             "3/4 as many")
    parser.add_argument("--skip", default="",
                        help="items to leave out, e.g. 'e,f' ('job': the whole-job headline)")
    parser.add_argument("--hang-timeout", type=float, default=5.0)
    parser.add_argument("--nodes", type=int, default=None,
                        help="h: nodes of 8 ranks x 10,000 collectives (default 2048, about "
                             "12 minutes and 11 GB of disk; quick 64)")
    parser.add_argument("--workdir", default=None,
                        help="where to write synthetic traces (default: a temporary folder)")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    args = parser.parse_args()
    quick = args.quick
    skip = set(args.skip.split(",")) - {""}
    rounds = args.rounds or (3 if quick else 8)
    started = time.perf_counter()
    load0 = os.getloadavg()
    rows: list[Row] = []
    doctor_jobs: list[overhead.JobResult] = []
    work = Path(tempfile.mkdtemp(prefix="ddpdoctor-bench-", dir=args.workdir))
    headline = ""
    try:
        if "job" not in skip:
            say("headline: whole jobs, plain torchrun and ddpdoctor run in alternating units")
            headline = whole_job.tables(whole_job.run_units(4 if quick else 8,
                                                            100 if quick else None, say,
                                                            arm_jobs=2 if quick else 4))
        single_us = None
        if "a" not in skip:
            rows += hot_path(3)
            single_us = rows[0].value - rows[0].base
            rows += floor(6 if quick else 8)
        if "c" not in skip:
            rows += small_ops(max(3, rounds * 3 // 4), 3000, single_us)
        if "b" not in skip:
            r, jobs = realistic(rounds, 40, 400 if quick else 1600)
            rows += r
            doctor_jobs += jobs
        if "d" not in skip:
            shapes = [(8, 12_500), (8, 50_000), (64, 50_000)] if quick else \
                [(8, 12_500), (8, 50_000), (8, 200_000), (64, 50_000), (256, 50_000),
                 (1024, 20_000)]
            rows += diff_scale(shapes, (8, 50_000), (64, 50_000), work)
            if not quick:
                rows += diff_real(work)
        if "e" not in skip:
            rows += hang(1 if quick else 3, args.hang_timeout)
        if "f" not in skip and doctor_jobs:
            rows += trace_size(doctor_jobs, 40, 10 if quick else 30,
                               5_000 if quick else 20_000)
        if "g" not in skip:
            rows += damaged(work)
        if "i" not in skip:
            rows += launcher((2, 8), (100, 1000, 5000), 20.0, 12.0)
        if "h" not in skip:
            nodes = args.nodes or (64 if quick else 2048)
            for classes in (1, 4):
                rows += diff_nodes(work, nodes, 8, 10_000, classes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows.sort(key=lambda row: row.item)  # in item order: c runs before b
    load1 = os.getloadavg()
    header = (f"ddpdoctor benchmark, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
              f"{platform.node()}: {os.cpu_count()} cores ({_cpu_name()}), "
              f"{_memory_gb():.0f} GB, "
              f"Python {platform.python_version()}, torch {_torch_version()}; "
              f"{'quick' if quick else 'full'} mode, {time.perf_counter() - started:.0f} s; "
              f"load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    text = header + "\n\n" + (f"What a user sees, whole jobs:\n\n{headline}\n\n"
                                 "How it splits:\n\n" if headline else "") + table(rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def _memory_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError):
        return float("nan")


def _torch_version() -> str:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
