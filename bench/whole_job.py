"""The headline: what a user sees, whole jobs of plain torchrun against ``ddpdoctor run``.

``python bench/whole_job.py`` (also the first table of ``bench/run.py``). A realistic job
(``--job``, below) runs in units of eight jobs in a row, plain torchrun, ``ddpdoctor run``,
``ddpdoctor run``, plain torchrun, twice (the next unit the other way round; ``--arm-jobs 2``:
once, session 19-27's units of four; 8 units take ~27 minutes, ~21 with ``--job small``): a
machine that grows faster or slower at a steady rate during a unit hits both kinds alike, and
each kind's figure is the mean of its four jobs (of two, single jobs' ±1-3 % on this VM went
into each unit's ratio at half weight). For each unit the ratio ddpdoctor / plain of

* the median step time,
* the ranks' CPU over the measured steps (every thread: ddpdoctor's in-rank threads included),
* the CPU of every process of the job from its start to its end (launcher, torchrun's agent,
  ranks, start-up and the report included),

the CPU-s per job ddpdoctor adds outside the measured steps (start-up, warm-up, teardown,
the report: paid once a job, whatever its length, a difference of the unit's means), and the
CPU of ddpdoctor's own process (launcher, monitor, report) per minute of the job. The
figure is the median of the per-unit ratios with their interquartile range; a target is met
only when the whole range sits inside it. The ratios of neighbouring jobs alone (two pairs a
unit, each plain job against the ddpdoctor job next to it) are shown beside, with their
range: on this 2-core VM two jobs in a row differ by ±1-3 % with nothing else running. The
other tenants' CPU during each job (the machine's busy CPU less the job's own) is recorded,
and a unit where any job shared the machine with more than NOISY_CORES of others' work is
flagged. The host's steal (``/proc/stat``: the time the hypervisor ran its other guests
while this one's CPUs had work) is recorded too and shown beside each unit, not as a flag: a
guest that shares its host meets it all the time, and it slows the CPUs it leaves too.

The job (``--job``, on 2 gloo ranks):

* ``issue`` (the default): the job issue 36 was measured on, a 4.4 M-parameter CNN, DDP's
  default buckets (no ``bucket_cap_mb`` given: a 1 MB first bucket, then 25 MB ones; two
  buckets and two buffer-broadcast chunks a step), ~100 ms steps (batch 20), 200 steps a job;
* ``small``: sessions 19-29's headline job, 3.0 M parameters, ``bucket_cap_mb=25`` (one
  bucket), ~47 ms steps (batch 8), 300 steps a job;
* ``lm``: the second headline job (issue 56), ``lm_job.py``'s small GPT-style language
  model, 0.87 M parameters, three collectives a step (its causal-mask buffer broadcast and
  two gradient buckets), ~50 ms steps (batch 8), 300 steps a job.

``--aa`` runs plain torchrun in both arms (an A/A run): the same units, tables and statistics,
so that the spread the bench itself gives two identical kinds of job can be read beside
ddpdoctor's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import overhead  # noqa: E402

NOISY_CORES = 0.10  # other tenants' CPU, in cores, above which a unit is flagged


@dataclass(frozen=True)
class Job:
    """A bench job: ``cnn_job.py``'s arguments but ``--steps``, and what it is, in words."""

    args: tuple[str, ...]
    steps: int
    what: str
    script: Path = HERE / "cnn_job.py"


JOBS = {
    "issue": Job(("--head-channels", "480", "--batch", "20", "--bucket-cap-mb", "default"), 200,
                 "4.4 M parameters, DDP's default buckets (none given: two buckets and two "
                 "buffer-broadcast chunks a step), batch 20"),
    "small": Job(("--bucket-cap-mb", "25"), 300,
                 "3.0 M parameters, bucket_cap_mb=25 (one bucket and two buffer-broadcast "
                 "chunks a step), batch 8"),
    "lm": Job(("--batch", "8", "--bucket-cap-mb", "default"), 300,
              "lm_job.py's small GPT-style language model, 0.87 M parameters, DDP's default "
              "buckets (two) and its causal-mask buffer broadcast: three collectives a step, "
              "batch 8 of 64 tokens", HERE / "lm_job.py"),
}


@dataclass
class Unit:
    """Jobs in a row: plain, ddpdoctor, ddpdoctor, plain (``plain_first``) or the reverse,
    repeated (:func:`order`); each kind's jobs in the order they ran."""

    plain: tuple[overhead.JobResult, ...]
    doctor: tuple[overhead.JobResult, ...]
    plain_first: bool = True

    @property
    def jobs(self) -> tuple[overhead.JobResult, ...]:
        return (*self.plain, *self.doctor)

    @property
    def others_cores(self) -> float:
        """The busiest job's other tenants, in cores (0 within /proc/stat's tick rounding)."""
        return max(*(j.others_cores for j in self.jobs), 0.0)

    @property
    def steal_cores(self) -> float:
        """The busiest job's steal by the host's other guests, in cores."""
        return max(*(j.steal_cores for j in self.jobs), 0.0)

    @property
    def noisy(self) -> bool:
        return not self.others_cores <= NOISY_CORES

    def ratio(self, value: Callable[[overhead.JobResult], float]) -> float:
        """ddpdoctor's mean ``value`` over plain's: a steady drift cancels out."""
        return sum(value(j) for j in self.doctor) / sum(value(j) for j in self.plain)

    def neighbours(self, value: Callable[[overhead.JobResult], float]) -> list[float]:
        """The ratios of the pairs of neighbouring jobs (the first two and the next two of
        each four: each kind's first jobs, then its second ones, ...)."""
        return [value(d) / value(p) for p, d in zip(self.plain, self.doctor)]


@dataclass
class Figure:
    """One measure over the units: the median of the per-unit ratios and their quartiles,
    and the ratios of neighbouring jobs alone."""

    measure: str
    base: float
    value: float
    unit: str
    ratios: list[float]
    target: float | None
    neighbours: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def quartiles(self) -> tuple[float, float]:
        return overhead.interquartile(self.ratios)

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.quartiles[1] <= self.target


def order(arm_jobs: int, plain_first: bool) -> str:
    """The arms of a unit's jobs in the order they run: "abba" (``arm_jobs`` 2: a is plain
    torchrun) repeated, or "baab" ...: the jobs of each arm sit at the same mean position, so
    a steady drift of the machine cancels out."""
    if arm_jobs < 2 or arm_jobs % 2:
        raise ValueError("jobs per arm must be even and at least 2")
    return ("abba" if plain_first else "baab") * (arm_jobs // 2)


def run_units(units: int, steps: int | None, say: Callable[[str], None],
              aa: bool = False, arm_jobs: int = 2, job: Job = JOBS["issue"]) -> list[Unit]:
    """``units`` units of ``arm_jobs`` jobs of each arm; with ``aa``, the ddpdoctor arm's
    jobs are plain torchrun too (an A/A run). ``steps``: None, the job's own."""
    args = ["--steps", str(steps or job.steps), *job.args]
    second = overhead.PLAIN if aa else overhead.DOCTOR
    out = []
    for i in range(units):
        plain_first = i % 2 == 0
        done: dict[str, list[overhead.JobResult]] = {"a": [], "b": []}
        for arm in order(arm_jobs, plain_first):
            kind = overhead.PLAIN if arm == "a" else second
            done[arm].append(overhead.job(kind, job.script, args, timeout=600))
        u = Unit(tuple(done["a"]), tuple(done["b"]), plain_first)
        out.append(u)
        say(f"unit {i + 1}/{units}: step ×{u.ratio(_step):.3f}, rank CPU ×{u.ratio(_cpu):.3f}, "
            f"all processes ×{u.ratio(_job_cpu):.3f}, others {u.others_cores:.2f} cores, "
            f"host's steal {u.steal_cores:.2f} cores")
    return out


def _step(r: overhead.JobResult) -> float:
    return r.median("step_ms")


def _cpu(r: overhead.JobResult) -> float:
    return r.total("cpu_s")


def _job_cpu(r: overhead.JobResult) -> float:
    return r.job_cpu_s


def _wall(r: overhead.JobResult) -> float:
    return r.wall_s


def figures(units: list[Unit]) -> list[Figure]:
    def fig(measure: str, unit: str, value: Callable[[overhead.JobResult], float],
            target: float | None) -> Figure:
        return Figure(measure, statistics.median(value(j) for u in units for j in u.plain),
                      statistics.median(value(j) for u in units for j in u.doctor), unit,
                      [u.ratio(value) for u in units], target,
                      [r for u in units for r in u.neighbours(value)])

    # Issue 56's targets for both headline jobs (issue 36 allowed every process ×1.02).
    return [fig("median step time", "ms", _step, 1.01),
            fig("rank CPU over the steps", "s", _cpu, 1.01),
            fig("CPU of every process of the job", "s", _job_cpu, 1.01),
            fig("job wall time, start to report", "s", _wall, None)]


def _outside_steps(r: overhead.JobResult) -> float:
    """CPU of every process of the job outside the ranks' measured steps: start-up, warm-up,
    teardown, torchrun's agent, ddpdoctor's launcher and report."""
    return r.job_cpu_s - _cpu(r)


def added_outside_steps(units: list[Unit]) -> list[float]:
    """Per unit, the CPU-s per job the second arm's jobs used outside the measured steps
    beyond plain's (each arm's mean): what a job pays once, whatever its length, where the
    ratios above mix it with what grows with the steps."""
    def mean(jobs: tuple[overhead.JobResult, ...]) -> float:
        return sum(_outside_steps(j) for j in jobs) / len(jobs)

    return [mean(u.doctor) - mean(u.plain) for u in units]


def own_cpu_per_minute(units: list[Unit]) -> list[float]:
    """ddpdoctor's own process's CPU seconds per minute of its job, job by job."""
    return [j.launcher_cpu_s / (j.wall_s / 60) for u in units for j in u.doctor]


def _listed(jobs: tuple[overhead.JobResult, ...],
            value: Callable[[overhead.JobResult], float], digits: int) -> str:
    return ", ".join(f"{value(j):.{digits}f}" for j in jobs)


def tables(units: list[Unit], aa: bool = False, job: Job = JOBS["issue"]) -> str:
    """The headline table and the per-unit table, as Markdown (``aa``: both arms were plain
    torchrun)."""
    steps = units[0].doctor[0].ranks[0]["steps"]
    first, second = ("plain torchrun A", "plain torchrun B") if aa else \
        ("plain torchrun", "ddpdoctor run")
    a, b = ("A", "B") if aa else ("plain", "ddp")
    pair = f"{a} / {b}"
    lines = [f"| measure | {first} | {second} | ratio (median of units) | IQR | "
             "target | met | neighbouring jobs alone: median, IQR, range |",
             "|---|---|---|---|---|---|---|---|"]
    for f in figures(units):
        lo, hi = f.quartiles
        target = f"≤ ×{f.target:.2f}" if f.target else ""
        met = {True: "yes", False: "NO", None: ""}[f.met]
        n_lo, n_hi = overhead.interquartile(f.neighbours)
        lines.append(f"| {f.measure} | {f.base:.1f} {f.unit} | {f.value:.1f} {f.unit} | "
                     f"×{f.median:.3f} | ×{lo:.3f}–{hi:.3f} | {target} | {met} | "
                     f"×{statistics.median(f.neighbours):.3f}, ×{n_lo:.3f}–{n_hi:.3f}, "
                     f"×{min(f.neighbours):.3f}–{max(f.neighbours):.3f} |")
    added = added_outside_steps(units)
    a_lo, a_hi = overhead.interquartile(added)
    lines.append(f"| CPU of every process outside the steps, added per job | "
                 f"{statistics.median(_outside_steps(j) for u in units for j in u.plain):.1f} s | "
                 f"{statistics.median(_outside_steps(j) for u in units for j in u.doctor):.1f} s | "
                 f"{statistics.median(added):+.2f} CPU-s | {a_lo:+.2f} to {a_hi:+.2f} | | | |")
    if not aa:
        own = own_cpu_per_minute(units)
        low, high = overhead.interquartile(own)
        lines.append(f"| ddpdoctor's own process, CPU per job-minute | — | "
                     f"{statistics.median(own):.2f} CPU-s | | {low:.2f}–{high:.2f} | ≤ 1.00 | "
                     f"{'yes' if high <= 1.0 else 'NO'} | |")
    jobs = len(units[0].jobs)
    params = units[0].plain[0].ranks[0].get("params")
    counted = f" ({params / 1e6:.2f} M parameters counted)" if params else ""
    lines += ["", f"{len(units)} units of {jobs} jobs, {steps} steps each (plus 5 warm-up), "
              f"{job.what}{counted}; a unit is noisy when others used more than "
              f"{NOISY_CORES:.2f} cores during any of its jobs.", "",
              f"| unit | order | step ms {pair} | rank CPU s {pair} | all CPU s {pair} | "
              f"ddpdoctor's own CPU s | wall s {pair} | others' cores | host's steal, cores | "
              "noisy |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for i, u in enumerate(units):
        ran = ", ".join({"a": a, "b": b}[arm] for arm in order(len(u.plain), u.plain_first))
        lines.append(
            f"| {i + 1} | {ran} | {_listed(u.plain, _step, 1)} / {_listed(u.doctor, _step, 1)} | "
            f"{_listed(u.plain, _cpu, 2)} / {_listed(u.doctor, _cpu, 2)} | "
            f"{_listed(u.plain, _job_cpu, 2)} / {_listed(u.doctor, _job_cpu, 2)} | "
            f"{'—' if aa else _listed(u.doctor, lambda j: j.launcher_cpu_s, 2)} | "
            f"{_listed(u.plain, _wall, 1)} / {_listed(u.doctor, _wall, 1)} | "
            f"{u.others_cores:.2f} | {u.steal_cores:.2f} | {'yes' if u.noisy else ''} |")
    quiet = [u for u in units if not u.noisy]
    if quiet and len(quiet) < len(units):
        lines += ["", f"The {len(quiet)} quiet units alone:"]
        for f in figures(quiet):
            lo, hi = f.quartiles
            lines.append(f"* {f.measure}: ×{f.median:.3f} (×{lo:.3f}–{hi:.3f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=8, help="units of jobs")
    parser.add_argument("--arm-jobs", type=int, default=4,
                        help="jobs of each arm in a unit, even (2: plain, ddpdoctor, "
                             "ddpdoctor, plain; 4: the same twice)")
    parser.add_argument("--job", choices=sorted(JOBS), default="issue",
                        help="issue: the job issue 36 measured (4.4 M parameters, DDP's "
                             "default buckets, ~100 ms steps); small: sessions 19-29's "
                             "(3.0 M, bucket_cap_mb=25, ~47 ms steps); lm: a small GPT "
                             "(0.87 M, three collectives a step, ~50 ms steps)")
    parser.add_argument("--steps", type=int, default=None,
                        help="steps a job (default: the job's own, 200 or 300)")
    parser.add_argument("--aa", action="store_true",
                        help="plain torchrun in both arms: the bench's own spread")
    args = parser.parse_args()
    job = JOBS[args.job]
    units = run_units(args.units, args.steps,
                      lambda m: print(m, file=sys.stderr, flush=True), aa=args.aa,
                      arm_jobs=args.arm_jobs, job=job)
    print(tables(units, aa=args.aa, job=job))


if __name__ == "__main__":
    main()
