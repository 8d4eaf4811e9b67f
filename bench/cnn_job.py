"""Realistic DDP workload for the bench: a 3.0 M-parameter CNN with BatchNorm (4.4 M with
``--head-channels 480``), trained with ``bucket_cap_mb=0.5`` (``--bucket-cap-mb``; ``default``
gives none, DDP's own) on 2 gloo ranks (several gradient buckets and a buffer broadcast per
step; ~47 ms steps on this machine at the default batch of 8, ~105 ms for the 4.4 M model at
batch 20, the headline's job). Each rank prints one line ``BENCH {json}``: its CPU time over
the measured steps (every thread of the process: ddpdoctor's included), the wall time and the
median step time, and the number of collectives of one step.
"""

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def cnn(head: int = 192) -> nn.Module:
    """``head``: the last block's channels (192: 3.0 M parameters; 480: 4.4 M)."""
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 64), *block(64, 128), nn.MaxPool2d(2),
        *block(128, 256), *block(256, 256), nn.MaxPool2d(2),
        *block(256, 512), *block(512, head), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(head, 10))


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
    """What ddpdoctor's recording group costs the training thread inside this job, where the
    training's own work leaves the caches cold between collectives. Steps rotate between
    four kinds, each step's training-thread CPU kept by kind:

    * plain: a second, identical model whose DDP uses a plain process group over a gloo
      backend of its own (torch's own path, as under plain torchrun);
    * bare: the calls that enter the recording group go straight to the backend, nothing
      else done (DDP's coalesced broadcasts, ``_Issuer.broadcast_coalesced``, and from the
      third forward its gradient buckets, ``runtime/ddp_buckets.py``, do not enter it; with
      ``DDPDOCTOR_BUCKETS_EACH=1`` each bucket enters from C++, pybind's C++-to-Python entry);
    * off: the recording group's own forwarding, recording switched off;
    * on: recording on, as under ``ddpdoctor run``.

    Afterwards, :meth:`time_calls` times the recording group's calls themselves (its
    ``_issue``: the record and the trace line, then the backend), on and off."""

    KINDS = ("plain", "bare", "off", "on")

    def __init__(self, group: object, make_model: Callable[[object], nn.Module]) -> None:
        issue = getattr(group, "_issue", None)
        if issue is None:
            raise SystemExit("--ab needs ddpdoctor run: the recording group is not in place")
        from ddpdoctor.runtime.pg_wrapper import group_of  # the bench runs under ddpdoctor

        self.group, self.issue, self.kind = group, issue, "on"
        # A gloo backend of its own: DDP's buckets, recorded once per backward, are checked
        # against the recording group's backend's sequence number, which the twin's
        # collectives must not move.
        rank, size = group.rank(), group.size()  # type: ignore[attr-defined]
        store = dist.PrefixStore("bench-twin/", dist.distributed_c10d._get_default_store())
        plain = group_of(dist.ProcessGroupGloo(store, rank, size, timedelta(minutes=5)), rank,
                         size)
        self.plain_model = make_model(plain)
        self.step_cpu: dict[str, list[float]] = {k: [] for k in self.KINDS}
        self.call_cpu = {"on": 0.0, "off": 0.0}
        self.calls = {"on": 0, "off": 0}
        bound: dict[str, Callable[..., object]] = {}

        def bare(op: str, method: str, args: tuple, *_: object) -> object:
            call = bound.get(method)
            if call is None:
                call = bound[method] = group._bound(method)  # type: ignore[attr-defined]
            return call(*args)

        self.bare = bare

    def use(self, step: int) -> str:
        """The kind of step ``step`` (the order rotates every round of four)."""
        self.kind = self.KINDS[(step + step // 4) % 4]
        self.group._enabled = self.kind == "on"  # type: ignore[attr-defined]
        self.group._issue = self.bare if self.kind == "bare" else self.issue  # type: ignore
        return self.kind

    def step_done(self, cpu: float) -> None:
        self.step_cpu[self.kind].append(cpu)

    def time_calls(self, steps: int, step: Callable[[], object]) -> None:
        """``steps`` steps, recording on and off in turn, every call of the recording group
        timed on the calling thread (kept out of the steps above: the timer costs too)."""
        issue = self.issue

        def timed(*args: object) -> object:
            t0 = time.thread_time()
            try:
                return issue(*args)
            finally:
                self.call_cpu[self.kind] += time.thread_time() - t0
                self.calls[self.kind] += 1

        self.group._issue = timed  # type: ignore[attr-defined]
        for i in range(steps):
            self.kind = "on" if i % 2 == 0 else "off"
            self.group._enabled = self.kind == "on"  # type: ignore[attr-defined]
            step()
        self.group._issue, self.group._enabled = issue, True  # type: ignore[attr-defined]

    def result(self) -> dict:
        out = {f"issue_{kind}_us": self.call_cpu[kind] / max(self.calls[kind], 1) * 1e6
               for kind in ("on", "off")}
        for kind in self.KINDS:
            out[f"step_cpu_{kind}_ms"] = statistics.mean(self.step_cpu[kind] or [0.0]) * 1e3
        return out


def bucket_cap(text: str) -> float | None:
    """``--bucket-cap-mb``: MB, or ``default`` for none given (DDP's own buckets)."""
    return None if text == "default" else float(text)


def main(make_net: Callable[[argparse.Namespace], nn.Module] | None = None,
         make_batch: Callable[[argparse.Namespace], tuple[torch.Tensor, torch.Tensor]]
         | None = None) -> None:
    """The job; ``make_net`` and ``make_batch`` another model and its batch (``lm_job.py``),
    trained with the same loop, options and measures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=16, help="image side")
    parser.add_argument("--bucket-cap-mb", type=bucket_cap, default=0.5,
                        help="DDP's bucket size (0.5: several buckets a step; 25: one for "
                             "this model; 'default': none given, DDP's own default, a 1 MB "
                             "first bucket and 25 MB ones after it)")
    parser.add_argument("--head-channels", type=int, default=192,
                        help="the last block's channels (192: 3.0 M parameters, 480: 4.4 M)")
    parser.add_argument("--pace", type=float, default=0.0,
                        help="seconds per step: sleep out the rest (a job of N steps/s)")
    parser.add_argument("--ab", action="store_true",
                        help="under ddpdoctor: steps rotate between a twin model on a plain "
                             "group and the recording group bare, off and on (thread CPU "
                             "timed in each)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)

    def make_model(group: object = None) -> nn.Module:
        net = make_net(args) if make_net is not None else cnn(args.head_channels)
        return DDP(net, bucket_cap_mb=args.bucket_cap_mb, process_group=group)

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ab = RecordingAB(dist.distributed_c10d._get_default_group(), make_model) \
        if args.ab else None
    plain = (ab.plain_model, torch.optim.SGD(ab.plain_model.parameters(), lr=0.01,
                                             momentum=0.9)) if ab is not None else (model, opt)
    loss_fn = nn.CrossEntropyLoss()
    if make_batch is not None:
        x, y = make_batch(args)
    else:
        x = torch.randn(args.batch, 3, args.size, args.size)
        y = torch.randint(0, 10, (args.batch,))

    def step() -> float:
        t0 = time.perf_counter()
        net, optimizer = plain if ab is not None and ab.kind == "plain" else (model, opt)
        loss = loss_fn(net(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        took = time.perf_counter() - t0
        if args.pace > took:
            time.sleep(args.pace - took)
        return took

    # Buckets are built, then rebuilt after the first iteration (each kind's, with --ab).
    for i in range(args.warmup * (len(RecordingAB.KINDS) if ab is not None else 1)):
        if ab is not None:
            ab.use(i)
        step()
    dist.barrier()
    cpu0, wall0, tool0 = time.process_time(), time.perf_counter(), tool_threads_cpu()
    main0 = time.thread_time()
    times = []
    for i in range(args.steps):
        if ab is None:
            times.append(step())
            continue
        ab.use(i)
        step_cpu = time.thread_time()
        times.append(step())
        ab.step_done(time.thread_time() - step_cpu)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    main_cpu, tool1 = time.thread_time() - main0, tool_threads_cpu()
    tools = {name: cpu - tool0.get(name, 0.0) for name, cpu in tool1.items()}
    if ab is not None:
        ab.time_calls(60, step)
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
