"""Several nodes, one verdict: the launchers exchange node digests through the job's store.

Each node's ``ddpdoctor run`` reads its own ranks' traces. In a job of several nodes it also
connects to the rendezvous store torchrun already runs (the static rendezvous' master address
or the c10d endpoint) and, once a second:

* publishes its subtree's digest (``analysis/digest.py``: its own ranks merged with the
  digests of the nodes below it in a tree of fan-out 16) under ``ddpdoctor/<run>/d/<node>``:
  one ``set``;
* reads the digests of its children and the verdict key in one ``multi_get``.

Node 0 holds the world's digest, decides, and publishes the verdict at once; every node reads
it within a second and stops its ranks as a single-node run would. The nodes exchange at
moments of the second set by their depth in the tree (by the wall clock, which NTP keeps
within milliseconds across a cluster): the leaves first, node 0 last, so that a digest climbs
a level in a fraction of a second rather than a whole one. Traffic per node is two store
operations a second and at most 17 digests (~0.5 KB each) whatever the size of the job (a node
with no children, 15 in 16, reads only the verdict and exchanges every 2 s); nothing of it
enters the traces. After a verdict each node publishes the detail of the named ranks it
holds (``trace/detail.py``), fetches those held elsewhere into ``remote-<rank>.jsonl``, and
counts itself done; the nodes wait (a few seconds at most) for each other before stopping
their ranks, so the store, which lives in one node's torchrun agent, outlasts the exchange.
A job that ends on its own (a crash) tells its story through node 0's own store instead
(``launch/end_story.py``), whose address node 0 publishes here when it connects.
A node whose job ends counts itself under ``ended``: a launcher whose agent still waits at
torchrun's exit barrier once every other node's job has ended asks it (``others_ended``).

A node's number is its ``--node-rank`` under a static rendezvous, else its order of arrival
(an ``add`` on the store). The store client is torch's ``TCPStore``; any object with its
``set``/``multi_get``/``compare_set``/``check``/``add`` methods will do (the simulation in
``bench/coordination_sim.py`` passes its own).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpdoctor.analysis import digest
from ddpdoctor.analysis.hang_rules import Decision, RankProgress
from ddpdoctor.launch.end_story import EndStore
from ddpdoctor.trace import detail
from ddpdoctor.trace.schema import Stop

INTERVAL = 1.0  # seconds between two exchanges with the store (a node with children)
# A node with no children (15 in 16) reads nothing but the verdict: it exchanges half as
# often, which keeps the store server's load to about one operation a node a second.
LEAF_INTERVAL = 2.0
STALE = 5.0  # a child whose digest has not changed for this long is unknown
LINGER = 5.0  # seconds a node waits for the other nodes' details after a verdict
CONNECT_SECONDS = 30.0
POLL = 0.5  # seconds between two looks at the store while the nodes exchange details


@dataclass
class Traffic:
    """What this node sent to and read from the store (the simulation reports it)."""

    ops: int = 0
    sent: int = 0
    read: int = 0


def tcp_store(host: str, port: int) -> Any:
    """A client of the job's rendezvous store (torch's TCPStore)."""
    from ddpdoctor.runtime.torch_internals import store_client

    return store_client(host, port, CONNECT_SECONDS)


class Coordinator:
    """One node's side of the exchange; :meth:`start` runs it in a thread."""

    def __init__(self, connect: Callable[[], Any], run: str, nnodes: int,
                 node: int | None = None, interval: float = INTERVAL) -> None:
        self._connect = connect
        self.prefix = f"ddpdoctor/{run}/"
        self.nnodes = nnodes
        self.node = node
        self.interval = interval
        self.store: Any = None
        self.traffic = Traffic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # a verdict to send now
        self._thread: threading.Thread | None = None
        # node -> (raw digest, when it changed, the digest read from it or None, whether that
        # node's job has ended: its last digest, never stale)
        self._children: dict[int, tuple[bytes, float, digest.Digest | None, bool]] = {}
        # this node's own digest, as the launcher last made it
        self._local: digest.Digest | None = None
        self._local_at = 0.0  # when (monotonic)
        self._final = False
        self._verdict_out: bytes | None = None
        self._verdict: dict | None = None
        self._gen = 0
        self._deadlock_since: float | None = None
        self._ask_ended = False  # others_ended was asked: the thread reads the count
        self._others_ended = False
        self.error = ""
        self.end = EndStore(self.prefix, nnodes)  # the end story's store (end_story.py)
        self._end_asked = False  # a node other than 0 found node 0's store's address

    # -- keys ----------------------------------------------------------------------------------
    def _key(self, name: str) -> str:
        return self.prefix + name

    def _digest_key(self, node: int) -> str:
        return self._key(f"d/{node}")

    @property
    def root(self) -> bool:
        return self.node == 0

    # -- the thread ----------------------------------------------------------------------------
    def start(self) -> Coordinator:
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-nodes", daemon=True)
        self._thread.start()
        return self

    def _halt(self) -> None:
        """Stop the thread (the caller takes the store over)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2 * self.interval + 1)

    def _run(self) -> None:
        deadline = time.monotonic() + CONNECT_SECONDS
        while not self._stop.is_set():
            try:
                self.setup()
                break
            except Exception as exc:  # the store is not up yet (the agent starts it)
                self.error = f"{type(exc).__name__}: {exc}"
                if time.monotonic() > deadline:
                    return
                self._stop.wait(self.interval)
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as exc:  # a store that went away (a node ended): stop asking
                self.error = f"{type(exc).__name__}: {exc}"
                return
            self._wake.wait(self.until_turn(time.time()))
            self._wake.clear()

    def setup(self) -> None:
        """Connect, learn this node's number, and make sure every key read exists (a
        ``multi_get`` waits for missing keys)."""
        store = self.store = self._connect()
        if self.node is None:
            self.node = int(store.add(self._key("nodes"), 1)) - 1
            self.traffic.ops += 1
        for key in [self._key("verdict"), self._digest_key(self.node),
                    *map(self._digest_key, digest.children(self.node, self.nnodes))]:
            store.compare_set(key, "", "")
            self.traffic.ops += 1
        if self.root:
            self.end.host(store)
            self.traffic.ops += 1

    @property
    def period(self) -> float:
        """Seconds between this node's exchanges (:data:`LEAF_INTERVAL` for a leaf)."""
        leaf = not digest.children(self.node or 0, self.nnodes)
        return self.interval * (LEAF_INTERVAL / INTERVAL if leaf else 1.0)

    def until_turn(self, now: float) -> float:
        """Seconds until this node's next moment to exchange: a fraction of the interval set
        by its depth (leaves at 0, node 0 last)."""
        levels = digest.height(self.nnodes) + 1
        phase = (levels - 1 - digest.depth(self.node or 0)) / levels * self.interval
        return (phase - now) % self.period or self.period

    def step(self) -> None:
        """One exchange: read the children's digests and the verdict, then publish this
        subtree's digest made from them (so that it climbs a level within the second)."""
        store, node = self.store, self.node
        assert store is not None and node is not None
        kids = digest.children(node, self.nnodes)
        keys = [self._digest_key(k) for k in kids] + ([] if self.root else [self._key("verdict")])
        if keys:
            values = [bytes(v) for v in store.multi_get(keys)]
            self._count(read=sum(map(len, values)))
            now = time.monotonic()
            with self._lock:
                for kid, raw in zip(kids, values):
                    old = self._children.get(kid)
                    if raw and (old is None or old[0] != raw):
                        # Unreadable: None, which makes the child's subtree unknown.
                        value = _parse(raw)
                        self._children[kid] = (raw, now, digest.Digest.from_wire(value),
                                               bool(value and value.get("final")))
                if not self.root and values[-1]:
                    self._verdict = _parse(values[-1])
        if not self._send_verdict(store) and not self.root:
            self._send_digest(store)
        if self._ask_ended:
            self._others_ended = int(store.add(self._key("ended"), 0)) >= self.nnodes - 1
            self.traffic.ops += 1
        if not self.root and not self._end_asked:
            self._end_asked = self.end.join(store)  # one check a step until node 0 is up
            self.traffic.ops += 1

    def _send_verdict(self, store: Any) -> bool:
        """Node 0: send the verdict made since the last exchange, if any (True: sent)."""
        with self._lock:
            verdict_out, self._verdict_out = self._verdict_out, None
        if verdict_out is None:
            return False
        store.set(self._key("verdict"), verdict_out)
        self._count(sent=len(verdict_out))
        return True

    def _send_digest(self, store: Any) -> None:
        """Publish this subtree's digest (nothing before the launcher made its own)."""
        payload = self._payload()
        if payload is not None:
            store.set(self._digest_key(self.node or 0), payload)
            self._count(sent=len(payload))

    def _payload(self) -> bytes | None:
        """This subtree's digest as published (None before the launcher made its own)."""
        merged = self._merged()
        if merged is None:
            return None
        self._gen += 1  # a digest that changes every time: one that stops is stale
        return json.dumps({**merged.wire(), "gen": self._gen, "final": self._final},
                          separators=(",", ":")).encode()

    def _count(self, sent: int = 0, read: int = 0) -> None:
        self.traffic.ops += 1
        self.traffic.sent += sent
        self.traffic.read += read

    # -- the launcher's side --------------------------------------------------------------------
    def update(self, local: digest.Digest, final: bool = False) -> digest.Digest:
        """Take this node's own digest (the next exchange publishes it merged with the
        children's); returns that merged digest now (node 0's is the world's)."""
        with self._lock:
            self._local, self._local_at, self._final = local, time.monotonic(), final
        merged = self._merged()
        assert merged is not None
        return merged

    def _merged(self) -> digest.Digest | None:
        """This node's own digest merged with its children's, every age as of now."""
        now = time.monotonic()
        with self._lock:
            local, local_at, children = self._local, self._local_at, dict(self._children)
        if local is None:
            return None
        fresh, unknown = [], 0
        for kid in digest.children(self.node or 0, self.nnodes) if self.node is not None else []:
            got = children.get(kid)
            if got is None:
                continue  # never heard of: its ranks are missing from the count
            _raw, received, parsed, ended = got
            if parsed is None or (now - received > STALE and not ended):
                unknown += digest.subtree_size(kid, self.nnodes)
                continue
            fresh.append(digest.aged(parsed, now - received))
        return digest.merge(digest.aged(local, now - local_at), fresh, unknown)

    def watch(self, ranks: dict[int, RankProgress], timeout: float,
              stuck_timeout: float | None, now: float) -> Decision:
        """The world's verdict as this node knows it now: node 0 decides (and publishes what
        it decides), the others read node 0's."""
        world = self.update(digest.node_digest(ranks, now))
        if self.root:
            decision = digest.world_decision(world, timeout, stuck_timeout, now,
                                             self._deadlock_since)
            self._deadlock_since = decision.deadlock_since
            if decision.stop is not None:
                self.publish_verdict(decision)
            return decision
        verdict = self.verdict()
        stop = world_stop(verdict) if verdict else None
        if verdict is None or stop is None:
            return Decision(None)
        named = [r for r in verdict.get("named") or [] if isinstance(r, int)]
        return Decision(stop, str(verdict.get("reason", ""))[:500],
                        named=tuple(named[:digest.MAX_NAMED]))

    def publish_verdict(self, decision: Decision) -> None:
        """Node 0: make the verdict every node reads."""
        with self._lock:
            self._verdict = {"stop": str(decision.stop), "reason": decision.reason,
                             "named": list(decision.named)}
            self._verdict_out = json.dumps(self._verdict).encode()
        self._wake.set()

    def verdict(self) -> dict | None:
        """The world's verdict, once node 0 has made it."""
        with self._lock:
            return self._verdict

    def others_ended(self) -> bool:
        """Whether every other node's job has ended (each counted itself in :meth:`finish`),
        as the exchange thread last read it: asking starts the reading, one ``add`` per
        exchange."""
        self._ask_ended = True
        return self._others_ended

    def finish(self, local: digest.Digest) -> None:
        """The job ended here: publish a last digest that never goes stale, count this node
        as ended, and stop."""
        if self.store is None or self._thread is None:
            return
        self.update(local, final=True)
        self._halt()
        try:
            if not self.root:
                self._send_digest(self.store)
            self.store.add(self._key("ended"), 1)
        except Exception:  # the store went away: the node simply goes stale
            pass

    def exchange(self, named: list[int], local: dict[int, Path], folder: Path,
                 wait: float = LINGER) -> list[int]:
        """After a verdict: publish the named ranks held here, fetch the others into
        ``folder`` (``remote-<rank>.jsonl``), then wait for every node to be done (at most
        ``wait`` seconds in all). Returns the ranks fetched."""
        self._halt()
        store, got = self.store, list[int]()
        if store is None:
            return got
        deadline = time.monotonic() + wait
        try:
            self._send_verdict(store)  # node 0's, if the thread had not sent it yet
            for rank in named:
                if rank in local:
                    try:
                        data = detail.extract(local[rank])
                    except (OSError, ValueError):
                        continue
                    store.set(self._key(f"detail/{rank}"), data)
                    self._count(sent=len(data))
            # Polled twice a second with one operation (a check of every key wanted): at a
            # hang every node does this at once.
            keys = {r: self._key(f"detail/{r}") for r in named if r not in local}
            while keys and not store.check(list(keys.values())) and \
                    time.monotonic() < deadline:
                time.sleep(POLL)
            ready = [r for r, key in keys.items() if store.check([key])]
            for rank, data in zip(ready, store.multi_get([keys[r] for r in ready])
                                  if ready else []):
                detail.write(folder, rank, bytes(data))
                got.append(rank)
            store.add(self._key("done"), 1)
            while time.monotonic() < deadline and \
                    int(store.add(self._key("done"), 0)) < self.nnodes:
                time.sleep(POLL)
        except Exception as exc:  # the store went away meanwhile: what arrived is kept
            self.error = f"{type(exc).__name__}: {exc}"
        return got


def _parse(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def world_stop(verdict: dict) -> Stop | None:
    """The stop a verdict read from the store names (None: not one of ours)."""
    try:
        return Stop(verdict.get("stop"))
    except ValueError:
        return None


def for_job(torchrun: Any, run: str) -> Coordinator | None:
    """The coordinator of one node of a multi-node torchrun job (None on one node, or where
    the rendezvous store is not torch's TCPStore)."""
    address = torchrun.store_address() if torchrun.nnodes_max > 1 else None
    if address is None:
        return None
    host, port = address
    return Coordinator(lambda: tcp_store(host, port), run, torchrun.nnodes_max,
                       torchrun.node_rank)
