"""Multi-node coordination at scale, simulated: ``python bench/coordination_sim.py``.

A real ``TCPStore`` server runs in a process of its own (its CPU is read from /proc), and N
simulated nodes run ddpdoctor's own coordination code (``launch/coordination.Coordinator``:
one store client each, digests merged up the tree of fan-out 16, node 0 deciding with
``analysis/digest.decide_world``), spread over a few worker processes. Each simulated node
stands for R ranks (8) whose state is scripted as ``RankProgress`` objects, the launcher's own
view of its ranks, turned into a digest by ``digest.node_digest`` as on a real node:

* ``healthy``: every rank completes collectives all the time (nothing may be called);
* ``hang``: from ``t_h`` on, every rank waits in the same all_reduce (a hang, called after the
  hang timeout);
* ``mismatch``: from ``t_h`` on, one rank on node N-1 waits in a barrier while the others
  wait in the all_reduce (a deadlock: called without the timeout, naming both sides);
* ``busy``: like hang, except one rank on node N-1 computes outside collectives (nothing may
  be called).

Each node exchanges with the store once a second at its own phase, as the launchers of real
nodes do. Measured per scenario and N: store operations and bytes per node per second, the
store server's CPU, what coordination adds to traces (nothing: digests live in the store),
and for hang/mismatch the seconds from the moment the verdict was due (``t_h`` + hang timeout,
or ``t_h`` for a mismatch) to the moment the last node read it. Then the figures are fitted
against N and extrapolated to 2,048 nodes x 8 ranks (marked as such).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ddpdoctor.analysis import digest  # noqa: E402
from ddpdoctor.analysis.hang_rules import Pending, RankProgress  # noqa: E402
from ddpdoctor.launch.coordination import Coordinator  # noqa: E402
from ddpdoctor.trace.model import Collective, Site  # noqa: E402

RANKS = 8
HANG_TIMEOUT = 5.0
T_HANG = 4.0  # seconds into a scenario when the ranks stop
TAIL = 6.0  # seconds a hang scenario runs past the moment its verdict was due
SITE = [Site("/home/user/train.py", 88, "train_step")]
BARRIER_SITE = [Site("/home/user/train.py", 95, "save_checkpoint")]


def _server(ready: mp.Queue) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    ready.put(store.port)
    while True:
        time.sleep(3600)


def _ranks(node: int, nnodes: int, scenario: str, t: float, start: float) -> dict:
    """The launcher's view of this node's ranks at ``t`` seconds into the scenario."""
    now = start + t
    stopped = scenario != "healthy" and t >= T_HANG
    seq = int((T_HANG if stopped else t) * 20) + 1
    out = {}
    for local in range(RANKS):
        rank = node * RANKS + local
        p = RankProgress(rank, world_size=nnodes * RANKS, iteration=seq // 4)
        p.issued = {"0": seq}
        p.completed = seq - 1
        p.last_progress = start + T_HANG if stopped else now - random.random() * 0.05
        barrier = scenario == "mismatch" and stopped and node == nnodes - 1 and local == 0
        busy = scenario == "busy" and stopped and node == nnodes - 1 and local == 0
        if busy:
            p.activity = {"t": now, "quiet_since": start + T_HANG, "cpu_rate": 0.9,
                          "frames": [{"file": "train.py", "line": 120, "function": "save"}]}
            p.cpu_rate = 0.9
        else:
            op, shapes, numel = ("barrier", [[0]], 0) if barrier else ("all_reduce", [[4096]],
                                                                       4096)
            c = Collective(rank=rank, id=seq, group="0", seq=seq, op=op, label="ddp.bucket",
                           shapes=shapes, dtypes=["float32"], numel=numel, reduce_op="SUM",
                           stack=BARRIER_SITE if barrier else SITE)
            seen = start + T_HANG if stopped else now - 0.01
            p.pending = {seq: Pending(seen, f"{op} at train.py:{c.stack[0].line}", c)}
            if stopped:
                p.activity = {"t": now, "quiet_since": seen, "cpu_rate": 0.0, "frames": []}
                p.cpu_rate = 0.0
        out[rank] = p
    return out


def _worker(port: int, nnodes: int, mine: list[int], scenario: str, go: mp.Queue,
            duration: float, results: mp.Queue) -> None:
    import torch.distributed as dist

    def connect():
        return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=60))

    coords = {n: Coordinator(connect, f"sim-{scenario}-{nnodes}", nnodes, node=n)
              for n in mine}
    for c in coords.values():
        c.setup()
    setup_ops = {n: c.traffic.ops for n, c in coords.items()}
    results.put("ready")
    start = go.get()  # every worker connected and set up: the scenario starts together
    # Each node exchanges at its own moment of the second (coordination.Coordinator.until_turn),
    # and refreshes its digest from its ranks just before, as a launcher does every 0.2 s.
    due = {n: start + coords[n].until_turn(start) for n in mine}
    seen: dict[int, float] = {}
    named: list[int] = []
    next_decision = start
    while time.time() < start + duration:
        now = time.time()
        for n in mine:
            c = coords[n]
            decided = False
            if c.root and now >= next_decision and c.verdict() is None:
                # Node 0's launcher decides at each of its polls (every 0.2 s) and sends a
                # verdict at once.
                next_decision = now + 0.2
                d = c.watch(_ranks(n, nnodes, scenario, now - start, start), HANG_TIMEOUT,
                            None, now)
                decided, named = d.stop is not None, list(d.named)
            if now < due[n] and not decided:
                continue
            if not c.root:
                c.update(digest.node_digest(_ranks(n, nnodes, scenario, now - start, start),
                                            now))
            c.step()
            if c.verdict() is not None and n not in seen:
                seen[n] = time.time()
            if now >= due[n]:
                due[n] = now + c.until_turn(now)
        time.sleep(0.01)
    results.put({"seen": seen, "named": named,
                 "verdict": next((c.verdict() for c in coords.values() if c.verdict()), None),
                 "ops": {n: c.traffic.ops - setup_ops[n] for n, c in coords.items()},
                 "bytes": {n: c.traffic.sent + c.traffic.read for n, c in coords.items()}})


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(nnodes: int, scenario: str, workers: int) -> dict:
    ctx = mp.get_context("spawn")
    ready: mp.Queue = ctx.Queue()
    server = ctx.Process(target=_server, args=(ready,), daemon=True)
    server.start()
    port = ready.get(timeout=60)
    duration = (T_HANG + (0 if scenario == "mismatch" else HANG_TIMEOUT) + TAIL
                if scenario != "healthy" else 12.0)
    results: mp.Queue = ctx.Queue()
    shares = [list(range(w, nnodes, workers)) for w in range(workers)]
    gos = [ctx.Queue() for _ in shares]
    procs = [ctx.Process(target=_worker, args=(port, nnodes, share, scenario, go, duration,
                                               results))
             for share, go in zip(shares, gos) if share]
    for p in procs:
        p.start()
    for _ in procs:
        assert results.get(timeout=300) == "ready"
    start = time.time() + 0.5
    for go in gos[:len(procs)]:
        go.put(start)
    while time.time() < start:
        time.sleep(0.01)
    cpu0, t0 = _cpu(server.pid or 0), time.time()
    got = [results.get(timeout=duration + 120) for _ in procs]
    cpu1, t1 = _cpu(server.pid or 0), time.time()
    for p in procs:
        p.join(10)
    server.kill()
    server.join(5)
    seen = {n: t for g in got for n, t in g["seen"].items()}
    ops = [v / duration for g in got for v in g["ops"].values()]
    rates = [v / duration for g in got for v in g["bytes"].values()]
    due = start + T_HANG + (0 if scenario == "mismatch" else HANG_TIMEOUT)
    verdict = next((g["verdict"] for g in got if g["verdict"]), None)
    return {"nodes": nnodes, "scenario": scenario, "ranks": nnodes * RANKS,
            "ops_max": max(ops), "ops_mean": statistics.mean(ops),
            "bytes_max": max(rates), "bytes_mean": statistics.mean(rates),
            "server_ops": sum(ops), "server_cpu": 100 * (cpu1 - cpu0) / (t1 - t0),
            "verdict": verdict["stop"] if verdict else None,
            "named": verdict["named"] if verdict else [],
            "all_nodes": len(seen) == nnodes,
            "latency": (max(seen.values()) - due) if len(seen) == nnodes else None}


EXPECTED = {"healthy": None, "hang": "hang", "mismatch": "deadlock", "busy": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--scenarios", nargs="+", default=list(EXPECTED))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--table-from", type=Path,
                        help="print the table of rows saved earlier (the JSON lines this "
                             "command prints on stderr, one per scenario) instead of running")
    args = parser.parse_args()
    rows = []
    if args.table_from:
        rows = [json.loads(line) for line in args.table_from.read_text().splitlines()
                if line.startswith("{")]
    for nnodes in [] if args.table_from else args.nodes:
        for scenario in args.scenarios:
            row = run(nnodes, scenario, args.workers)
            row["right"] = row["verdict"] == EXPECTED[scenario] and (
                EXPECTED[scenario] is None or row["all_nodes"])
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    when = (f"rows from {args.table_from}" if args.table_from else
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average "
            f"{os.getloadavg()[0]:.2f} at the end")
    print(f"coordination simulation, {when}; {os.cpu_count()} cores; {RANKS} ranks per "
          f"simulated node; hang timeout {HANG_TIMEOUT:g} s\n")
    print("| nodes | ranks | scenario | verdict (right?) | store ops/s per node (max) | "
          "bytes/s per node (max) | server ops/s | server CPU | trace growth | "
          "verdict on every node after it was due |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lat = f"{r['latency']:+.2f} s" if r["latency"] is not None else "—"
        print(f"| {r['nodes']} | {r['ranks']} | {r['scenario']} | "
              f"{r['verdict'] or 'none'} ({'yes' if r['right'] else 'NO'}) | "
              f"{r['ops_mean']:.2f} ({r['ops_max']:.2f}) | {r['bytes_mean']:,.0f} "
              f"({r['bytes_max']:,.0f}) | {r['server_ops']:,.0f} | {r['server_cpu']:.1f} % | "
              f"0 B/s | {lat} |")
    _extrapolate(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _extrapolate(rows: list[dict], target: int = 2048) -> None:
    """A least-squares line of server CPU against server ops/s, and the per-node figures at
    the largest N measured, carried to ``target`` nodes (extrapolated, not measured)."""
    pts = [(r["server_ops"], r["server_cpu"]) for r in rows]
    if max(x for x, _ in pts) < 2 * min(x for x, _ in pts):
        return  # one size of job: nothing to fit
    mx, my = statistics.mean(x for x, _ in pts), statistics.mean(y for _, y in pts)
    slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    base = my - slope * mx
    largest = max(r["nodes"] for r in rows)
    ops = max(r["ops_mean"] for r in rows if r["nodes"] == largest)
    timed = max((r["nodes"] for r in rows if r["latency"] is not None), default=largest)
    lat = [r["latency"] for r in rows if r["nodes"] == timed and r["latency"] is not None]
    print(f"\nExtrapolated to {target:,} nodes x {RANKS} ranks ({target * RANKS:,} ranks), "
          f"not measured: store operations per node stay at {ops:.2f}/s on average (each node "
          f"does the same operations at any N); the server handles {target * ops:,.0f} ops/s; "
          f"server CPU {base + slope * target * ops:.1f} % of one core (fit: {base:.2f} % + "
          f"{slope * 1000:.3f} % per 1,000 ops/s over the rows above); the tree is "
          f"{digest.height(target)} levels deep against {digest.height(timed)} at {timed} "
          f"nodes: a verdict's path grows by {digest.height(target) - digest.height(timed)} "
          f"level(s) of a fraction of a second each beyond the "
          f"{max(lat) if lat else float('nan'):+.2f} s measured there.")


if __name__ == "__main__":
    main()
