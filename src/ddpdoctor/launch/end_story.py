"""The end of a job of several nodes that no verdict stopped (a crash, an abort, an exit): each
node tells the others the ranks its own diagnosis roots the job at, with their details, so that
a node whose ranks only lost their peers names the rank and the line that failed first.

After a hang verdict the nodes exchange the named ranks' details through torchrun's rendezvous
store (``coordination.Coordinator.exchange``), and they stop the ranks themselves, after the
exchange. A job that ends on its own gives no such moment: torchrun's agent exits as soon as
its workers fail, and the store it serves goes with it. The end story runs through a store of
ddpdoctor's own instead, served by node 0's launcher, which outlives its job by the exchange:
node 0 publishes its address in the rendezvous store when the job starts; the other nodes
connect to it as soon as they read it. At the end, each node:

* diagnoses its own folder; where that roots an error at a cause, it publishes the details
  (``trace/detail.py``) of the root finding's ranks it holds (at most :data:`MAX_TOLD`);
* counts itself ended and waits (at most :data:`LINGER` seconds, with the others) until every
  node has, then fetches the ranks the others told into ``remote-<rank>.jsonl``, which the
  diagnosis of its folder reads beside its own traces (``trace/reader.py``);
* node 0 waits, within the same bound, until every node has fetched, before its store goes.

A node that cannot reach the store, or a node that ends later than the bound, tells and learns
nothing: its report is then its own ranks', which say they lost a peer on another node.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ddpdoctor.trace import detail

LINGER = 5.0  # seconds a node waits for the others at the end
POLL = 0.2  # seconds between two looks at the store meanwhile
MAX_TOLD = 8  # ranks a node tells, at most
CONNECT_SECONDS = 5.0
ADDRESS = "end-store"  # the key, in the rendezvous store, of the address of node 0's store


def story_ranks(folder: Path, held: Collection[int]) -> list[int]:
    """The ranks of ``held`` (this node's) that the diagnosis of ``folder`` roots the job at,
    where that is an error with a cause (a node whose ranks only lost their peers names none,
    and a clean job's warning is no story: it tells nothing)."""
    from ddpdoctor.analysis import diagnose
    from ddpdoctor.trace.reader import load_run

    try:
        report = diagnose(load_run([folder]))
    except Exception:  # noqa: BLE001 - unreadable traces: nothing to tell
        return []
    if not report.findings or not report.findings[0].is_error or \
            report.findings[0].cause is None:
        return []
    return [r for r in sorted(report.findings[0].ranks) if r in held][:MAX_TOLD]


class EndStore:
    """One node's side of the end story: node 0 serves the store, the others join it."""

    def __init__(self, prefix: str, nnodes: int) -> None:
        self.prefix = prefix
        self.nnodes = nnodes
        self.store: Any = None
        self.error = ""

    def _key(self, name: str) -> str:
        return f"{self.prefix}end/{name}"

    def host(self, rendezvous: Any) -> None:
        """Node 0: serve a store on a free port and publish its address."""
        from ddpdoctor.runtime.torch_internals import store_server

        try:
            self.store = store_server(CONNECT_SECONDS)
            rendezvous.set(self.prefix + ADDRESS, f"{socket.getfqdn()}:{self.store.port}")
        except Exception as exc:  # noqa: BLE001 - no end story, the rest goes on
            self.store, self.error = None, f"{type(exc).__name__}: {exc}"

    def join(self, rendezvous: Any) -> bool:
        """Another node: connect to node 0's store once its address is published (True:
        connected, or given up)."""
        from ddpdoctor.runtime.torch_internals import store_client

        key = self.prefix + ADDRESS
        if not rendezvous.check([key]):
            return False
        host, _, port = bytes(rendezvous.get(key)).decode().rpartition(":")
        try:
            self.store = store_client(host, int(port), CONNECT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - unreachable: no end story here
            self.error = f"{type(exc).__name__}: {exc}"
        return True

    def tell(self, node: int, told: list[int], local: dict[int, Path], folder: Path,
             wait: float = LINGER) -> list[int]:
        """Publish the details of ``told`` (ranks held here, their traces in ``local``), wait
        for every node, fetch what the others told into ``folder``. Returns the ranks fetched."""
        store, got = self.store, list[int]()
        if store is None:
            return got
        deadline = time.monotonic() + wait
        try:
            sent = []
            for rank in told:
                try:
                    store.set(self._key(f"detail/{rank}"), detail.extract(local[rank]))
                except (KeyError, OSError, ValueError):
                    continue
                sent.append(rank)
            store.set(self._key(f"told/{node}"), json.dumps(sent))
            store.add(self._key("ended"), 1)
            while time.monotonic() < deadline and \
                    int(store.add(self._key("ended"), 0)) < self.nnodes:
                time.sleep(POLL)
            lists = [self._key(f"told/{n}") for n in range(self.nnodes) if n != node]
            present = [k for k in lists if store.check([k])]
            wanted: list[int] = []
            for raw in store.multi_get(present) if present else []:
                ranks = _ranks(bytes(raw))
                wanted += [r for r in ranks if r not in local and r not in wanted]
            for rank in wanted:
                detail.write(folder, rank, bytes(store.get(self._key(f"detail/{rank}"))))
                got.append(rank)
            store.add(self._key("fetched"), 1)
            if node == 0:  # the store goes with this process: not before the others fetched
                while time.monotonic() < deadline and \
                        int(store.add(self._key("fetched"), 0)) < self.nnodes:
                    time.sleep(POLL)
        except Exception as exc:  # noqa: BLE001 - the store went away: what arrived is kept
            self.error = f"{type(exc).__name__}: {exc}"
        return got


def _ranks(raw: bytes) -> list[int]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return []
    return [r for r in value if isinstance(r, int) and not isinstance(r, bool) and r >= 0][
        :MAX_TOLD] if isinstance(value, list) else []
