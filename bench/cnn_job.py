"""Realistic DDP workload for the bench: a 3.0 M-parameter CNN with BatchNorm, trained with
``bucket_cap_mb=0.5`` (``--bucket-cap-mb``) on 2 gloo ranks (several gradient buckets and a
buffer broadcast per step, steps of ~100 ms on this machine). Each rank prints one line
``BENCH {json}``: its CPU time over the measured steps (every thread of the process:
ddpdoctor's included), the wall time and the median step time, and the number of collectives
of one step.
"""

import argparse
import json
import statistics
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def cnn() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 64), *block(64, 128), nn.MaxPool2d(2),
        *block(128, 256), *block(256, 256), nn.MaxPool2d(2),
        *block(256, 512), *block(512, 192), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(192, 10))


def tool_threads_cpu() -> dict[str, float]:
    """CPU seconds of each of ddpdoctor's own threads in this process (none under torchrun)."""
    out = {}
    for thread in threading.enumerate():
        if thread.name.startswith("ddpdoctor") and thread.ident is not None:
            try:
                out[thread.name] = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            except OSError:  # the thread ended in between
                pass
    return out


class RecordingAB:
    """Times every call into ddpdoctor's recording group (its ``_issue``: the record and the
    trace line, then the backend) on the calling thread, with recording switched on or off
    for whole steps. On minus off per collective is what recording costs inside this job,
    where the training's own work leaves the caches cold between collectives; the C++ to
    Python entry that DDP's calls take under ddpdoctor is outside it (on in both)."""

    def __init__(self, group: object) -> None:
        issue = getattr(group, "_issue", None)
        if issue is None:
            raise SystemExit("--ab needs ddpdoctor run: the recording group is not in place")
        self.group, self.on = group, True
        self.cpu = {True: 0.0, False: 0.0}
        self.calls = {True: 0, False: 0}
        # The training thread's CPU over whole steps, on and off: what recording costs the
        # step, its effect on the training's own work (caches it evicts) included.
        self.step_cpu: dict[bool, list[float]] = {True: [], False: []}

        def timed(*args: object, **kwargs: object) -> object:
            t0 = time.thread_time()
            try:
                return issue(*args, **kwargs)
            finally:
                self.cpu[self.on] += time.thread_time() - t0
                self.calls[self.on] += 1

        group._issue = timed  # type: ignore[attr-defined]

    def use(self, on: bool) -> None:
        self.on = self.group._enabled = on  # type: ignore[attr-defined]

    def step_done(self, cpu: float) -> None:
        self.step_cpu[self.on].append(cpu)

    def result(self) -> dict:
        self.use(True)
        out = {f"issue_{name}_us": self.cpu[on] / max(self.calls[on], 1) * 1e6
               for name, on in (("on", True), ("off", False))}
        for name, on in (("on", True), ("off", False)):
            out[f"step_cpu_{name}_ms"] = statistics.mean(self.step_cpu[on] or [0.0]) * 1e3
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=16, help="image side")
    parser.add_argument("--bucket-cap-mb", type=float, default=0.5,
                        help="DDP's bucket size (0.5: several buckets a step; DDP's default: 25)")
    parser.add_argument("--pace", type=float, default=0.0,
                        help="seconds per step: sleep out the rest (a job of N steps/s)")
    parser.add_argument("--ab", action="store_true",
                        help="under ddpdoctor: recording on and off in alternate steps, the "
                             "recording group's calls and the steps timed (thread CPU) in each")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(cnn(), bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 3, args.size, args.size)
    y = torch.randint(0, 10, (args.batch,))

    def step() -> float:
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        took = time.perf_counter() - t0
        if args.pace > took:
            time.sleep(args.pace - took)
        return took

    for _ in range(args.warmup):  # buckets are built, then rebuilt after the first iteration
        step()
    ab = RecordingAB(dist.distributed_c10d._get_default_group()) if args.ab else None
    dist.barrier()
    cpu0, wall0, tool0 = time.process_time(), time.perf_counter(), tool_threads_cpu()
    main0 = time.thread_time()
    times = []
    for i in range(args.steps):
        if ab is None:
            times.append(step())
            continue
        ab.use(i % 2 == 0)
        step_cpu = time.thread_time()
        times.append(step())
        ab.step_done(time.thread_time() - step_cpu)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    main_cpu, tool1 = time.thread_time() - main0, tool_threads_cpu()
    tools = {name: cpu - tool0.get(name, 0.0) for name, cpu in tool1.items()}
    total_cpu = time.process_time()  # from the start of the process: start-up included
    params = sum(p.numel() for p in model.parameters())
    print("BENCH " + json.dumps({
        "rank": dist.get_rank(), "cpu_s": cpu, "wall_s": wall, "steps": args.steps,
        "step_ms": statistics.median(times) * 1e3, "params": params,
        "process_cpu_s": total_cpu, "main_cpu_s": main_cpu,
        "tool_threads_cpu_s": sum(tools.values()),
        "tool_threads": tools, **(ab.result() if ab is not None else {})}),
        flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
