"""The headline: what a user sees, whole jobs of plain torchrun against ``ddpdoctor run``.

``python bench/whole_job.py`` (also the first table of ``bench/run.py``). A realistic job
(``cnn_job.py``: a 3.0 M-parameter CNN with BatchNorm, DDP's default buckets, 2 gloo ranks,
~100 ms steps) runs in pairs, plain torchrun and ``ddpdoctor run`` one after the other, the
order swapped every pair so that a machine growing faster or slower during a pair hits both
alike. For each pair the ratio ddpdoctor / plain of

* the median step time,
* the ranks' CPU over the measured steps (every thread: ddpdoctor's in-rank threads included),
* the CPU of every process of the job from its start to its end (launcher, torchrun's agent,
  ranks, start-up and the report included),

and the CPU of ddpdoctor's own process (launcher, monitor, report) per minute of the job. The
figure is the median of the per-pair ratios with their interquartile range; a target is met
only when the whole range sits inside it. The other tenants' CPU during each job (the
machine's busy CPU less the job's own) is recorded, and a pair where either job shared the
machine with more than NOISY_CORES of others' work is flagged.
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

NOISY_CORES = 0.10  # other tenants' CPU, in cores, above which a pair is flagged
DEFAULT_BUCKETS_MB = 25.0  # DDP's default bucket_cap_mb


@dataclass
class Pair:
    plain: overhead.JobResult
    doctor: overhead.JobResult

    @property
    def others_cores(self) -> float:
        """The busier job's other tenants, in cores (0 within /proc/stat's tick rounding)."""
        return max(self.plain.others_cores, self.doctor.others_cores, 0.0)

    @property
    def noisy(self) -> bool:
        return not self.others_cores <= NOISY_CORES


@dataclass
class Figure:
    """One measure over the pairs: the median of the per-pair ratios and their quartiles."""

    measure: str
    base: float
    value: float
    unit: str
    ratios: list[float]
    target: float | None

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def quartiles(self) -> tuple[float, float]:
        return overhead.interquartile(self.ratios)

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.quartiles[1] <= self.target


def run_pairs(pairs: int, steps: int, say: Callable[[str], None]) -> list[Pair]:
    args = ["--steps", str(steps), "--bucket-cap-mb", str(DEFAULT_BUCKETS_MB)]
    out = []
    for i in range(pairs):
        order = [overhead.PLAIN, overhead.DOCTOR] if i % 2 == 0 else \
            [overhead.DOCTOR, overhead.PLAIN]
        done = {kind: overhead.job(kind, overhead.CNN, args, timeout=600) for kind in order}
        out.append(Pair(done[overhead.PLAIN], done[overhead.DOCTOR]))
        p = out[-1]
        say(f"pair {i + 1}/{pairs}: step ×{_step(p.doctor) / _step(p.plain):.3f}, rank CPU "
            f"×{_cpu(p.doctor) / _cpu(p.plain):.3f}, all processes "
            f"×{p.doctor.job_cpu_s / p.plain.job_cpu_s:.3f}, others "
            f"{p.others_cores:.2f} cores")
    return out


def _step(r: overhead.JobResult) -> float:
    return r.median("step_ms")


def _cpu(r: overhead.JobResult) -> float:
    return r.total("cpu_s")


def figures(pairs: list[Pair]) -> list[Figure]:
    def fig(measure: str, unit: str, value: Callable[[overhead.JobResult], float],
            target: float | None) -> Figure:
        return Figure(measure, statistics.median(value(p.plain) for p in pairs),
                      statistics.median(value(p.doctor) for p in pairs), unit,
                      [value(p.doctor) / value(p.plain) for p in pairs], target)

    return [fig("median step time", "ms", _step, 1.01),
            fig("rank CPU over the steps", "s", _cpu, 1.01),
            fig("CPU of every process of the job", "s", lambda r: r.job_cpu_s, 1.02),
            fig("job wall time, start to report", "s", lambda r: r.wall_s, None)]


def own_cpu_per_minute(pairs: list[Pair]) -> list[float]:
    """ddpdoctor's own process's CPU seconds per minute of its job, job by job."""
    return [p.doctor.launcher_cpu_s / (p.doctor.wall_s / 60) for p in pairs]


def tables(pairs: list[Pair]) -> str:
    """The headline table and the per-pair table, as Markdown."""
    steps = pairs[0].doctor.ranks[0]["steps"]
    lines = ["| measure | plain torchrun | ddpdoctor run | ratio (median of pairs) | IQR | "
             "target | met |", "|---|---|---|---|---|---|---|"]
    for f in figures(pairs):
        lo, hi = f.quartiles
        target = f"≤ ×{f.target:.2f}" if f.target else ""
        met = {True: "yes", False: "NO", None: ""}[f.met]
        lines.append(f"| {f.measure} | {f.base:.1f} {f.unit} | {f.value:.1f} {f.unit} | "
                     f"×{f.median:.3f} | ×{lo:.3f}–{hi:.3f} | {target} | {met} |")
    own = own_cpu_per_minute(pairs)
    low, high = overhead.interquartile(own)
    lines.append(f"| ddpdoctor's own process, CPU per job-minute | — | "
                 f"{statistics.median(own):.2f} CPU-s | | {low:.2f}–{high:.2f} | ≤ 1.00 | "
                 f"{'yes' if high <= 1.0 else 'NO'} |")
    lines += ["", f"{len(pairs)} pairs, {steps} steps each (plus 5 warm-up), DDP's default "
              f"buckets; a pair is noisy when others used more than {NOISY_CORES:.2f} cores "
              f"during either job.", "",
              "| pair | order | step ms plain / ddp | rank CPU s plain / ddp | all CPU s plain "
              "/ ddp | ddpdoctor's own CPU s | wall s plain / ddp | others' cores | noisy |",
              "|---|---|---|---|---|---|---|---|---|"]
    for i, p in enumerate(pairs):
        order = "plain first" if i % 2 == 0 else "ddpdoctor first"
        lines.append(
            f"| {i + 1} | {order} | {_step(p.plain):.1f} / {_step(p.doctor):.1f} | "
            f"{_cpu(p.plain):.2f} / {_cpu(p.doctor):.2f} | {p.plain.job_cpu_s:.2f} / "
            f"{p.doctor.job_cpu_s:.2f} | {p.doctor.launcher_cpu_s:.2f} | {p.plain.wall_s:.1f} / "
            f"{p.doctor.wall_s:.1f} | {p.others_cores:.2f} | {'yes' if p.noisy else ''} |")
    quiet = [p for p in pairs if not p.noisy]
    if quiet and len(quiet) < len(pairs):
        lines += ["", f"The {len(quiet)} quiet pairs alone:"]
        for f in figures(quiet):
            lo, hi = f.quartiles
            lines.append(f"* {f.measure}: ×{f.median:.3f} (×{lo:.3f}–{hi:.3f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    pairs = run_pairs(args.pairs, args.steps,
                      lambda m: print(m, file=sys.stderr, flush=True))
    print(tables(pairs))


if __name__ == "__main__":
    main()
