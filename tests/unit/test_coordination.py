"""Several nodes, one verdict: node digests built from real trace lines, merged up the tree and
judged at node 0; the exchange through a real TCPStore (two store operations a node a second);
another node's rank's detail read beside the node's own traces."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from ddpdoctor.analysis import digest
from ddpdoctor.analysis.diagnosis import diagnose
from ddpdoctor.analysis.hang_rules import SETTLE, Decision, Idle
from ddpdoctor.launch.coordination import Coordinator
from ddpdoctor.launch.monitor import JobProgress
from ddpdoctor.trace import detail, schema
from ddpdoctor.trace.reader import load_run
from ddpdoctor.trace.schema import Stop

from .test_progress import T0, Rank


def _node(folder: Path, ranks: list[int], world: int) -> tuple[JobProgress, dict[int, Rank]]:
    folder.mkdir(parents=True, exist_ok=True)
    return JobProgress(str(folder)), {r: Rank(folder, r, world) for r in ranks}


def test_the_tree_reaches_every_node_with_at_most_16_children_each() -> None:
    for nnodes in (1, 2, 17, 256, 2048):
        seen = [0]
        for node in range(nnodes):
            kids = digest.children(node, nnodes)
            assert len(kids) <= digest.FANOUT
            assert all(digest.parent(k) == node for k in kids)
            seen += kids
        assert sorted(seen) == list(range(nnodes))
        assert digest.subtree_size(0, nnodes) == nnodes
    depth, node = 0, 2047
    while node:
        node, depth = digest.parent(node) or 0, depth + 1
    assert depth == 3  # 2,048 nodes: a verdict three hops from the farthest node


def _world(*digests: digest.Digest) -> digest.Digest:
    return digest.merge(digests[0], digests[1:])


def test_a_hang_across_two_nodes_is_called_from_their_digests(tmp_path: Path) -> None:
    job0, n0 = _node(tmp_path / "n0", [0, 1], 4)
    job1, n1 = _node(tmp_path / "n1", [2, 3], 4)
    for r in (*n0.values(), *n1.values()):
        r.coll("all_reduce", 4)
    job0.poll(T0), job1.poll(T0)
    # Rank 3 computes: nothing to call however long the others wait.
    for r in (n0[0], n0[1], n1[2]):
        r.activity(T0 + 1, 0.0)
    n1[3].activity(T0 + 1, 0.9)
    job0.poll(T0 + 1), job1.poll(T0 + 1)
    world = _world(digest.node_digest(job0.ranks, T0 + 40), digest.node_digest(job1.ranks, T0 + 40))
    assert (world.ranks, world.live, world.waiting) == (4, 4, 3)
    assert digest.world_decision(world, 30, None, T0 + 40).stop is None
    n1[3].activity(T0 + 2, 0.0)
    job1.poll(T0 + 2)
    world = _world(digest.node_digest(job0.ranks, T0 + 40), digest.node_digest(job1.ranks, T0 + 40))
    decision = digest.world_decision(world, 30, None, T0 + 40)
    assert decision.stop == Stop.HANG and decision.named == (0,)
    # One node unknown (its digest went stale): nothing is decided.
    assert digest.world_decision(replace(world, unknown=1), 30, None, T0 + 40).stop is None
    # A rank of the world never seen: nothing is decided either.
    alone = digest.node_digest(job0.ranks, T0 + 40)
    assert digest.world_decision(alone, 30, None, T0 + 40).stop is None


def test_collectives_that_cannot_match_on_two_nodes_are_a_deadlock_naming_both_sides(
        tmp_path: Path) -> None:
    job0, n0 = _node(tmp_path / "n0", [0, 1], 4)
    job1, n1 = _node(tmp_path / "n1", [2, 3], 4)
    n0[0].coll("barrier", 0)
    for r in (n0[1], n1[2], n1[3]):
        r.coll("all_reduce", 740)
    for r in (*n0.values(), *n1.values()):
        r.activity(T0 + 1, 0.0)
    job0.poll(T0 + 1), job1.poll(T0 + 1)
    # Node 1 alone sees nothing wrong; merged, the barrier meets the all_reduce.
    d1 = digest.node_digest(job1.ranks, T0 + 2)
    assert len({e.signature for e in d1.pending}) == 1
    world = _world(digest.node_digest(job0.ranks, T0 + 2), d1)
    first = digest.world_decision(world, 30, None, T0 + 2)
    assert first.stop is None and first.deadlock_since == T0 + 2  # held before it is called
    decision = digest.world_decision(world, 30, None, T0 + 2 + SETTLE,
                                   first.deadlock_since)
    assert decision.stop == Stop.DEADLOCK and set(decision.named) == {0, 1}


def test_a_rank_idle_outside_collectives_on_another_node_is_named_stuck(tmp_path: Path) -> None:
    job0, n0 = _node(tmp_path / "n0", [0], 2)
    job1, n1 = _node(tmp_path / "n1", [1], 2)
    n0[0].coll("barrier", 0)
    n0[0].activity(T0 + 1, 0.0)
    n1[1].activity(T0 + 1, 0.0, "load")
    n1[1].activity(T0 + 2, 0.0, "load")
    job0.poll(T0 + 2), job1.poll(T0 + 2)
    world = _world(digest.node_digest(job0.ranks, T0 + 40), digest.node_digest(job1.ranks, T0 + 40))
    decision = digest.world_decision(world, 30, None, T0 + 40)
    assert decision.stop == Stop.STUCK and "rank 1" in decision.reason
    assert decision.named[0] == 1


def test_a_digest_stays_small_however_many_ranks_and_collectives_are_pending(
        tmp_path: Path) -> None:
    job, ranks = _node(tmp_path, list(range(8)), 16384)
    for r in ranks.values():
        for shape in range(40):
            r.coll("all_reduce", shape + r.rank, group=str(shape % 20))
    job.poll(T0)
    one = digest.node_digest(job.ranks, T0 + 1)
    merged = digest.merge(one, [one] * 16)
    for d in (one, merged):
        assert len(d.pending) <= digest.MAX_PENDING and len(d.issued) <= digest.MAX_GROUPS
        assert len(json.dumps(d.wire())) < 3000
        assert digest.Digest.from_wire(json.loads(json.dumps(d.wire()))) == d
    assert merged.ranks == 17 * 8 and merged.nodes == 17


def test_ages_grow_with_the_time_since_a_digest_was_received() -> None:
    d = digest.Digest(quiet=1.0, wait=2.0, idle=Idle(3, 4.0, "f() at t.py:1"))
    assert digest.aged(d, 1.5) == digest.Digest(quiet=2.5, wait=3.5,
                                                idle=Idle(3, 5.5, "f() at t.py:1"))


def test_a_digest_read_from_another_node_leaves_out_what_is_malformed() -> None:
    raw = {"nodes": 2, "ranks": 4, "world": 4, "live": 4, "waiting": 4, "quiet": 3.5,
           "idle": [1, "x", "f"], "issued": {"0": [9, 2], "1": ["a", 0], "2": [1]},
           "pending": [["0", 9, "ab", 0, 3, "all_reduce"], ["0", "nine", "ab", 0, 1, ""]],
           "ended": [[5, "finished"], "x"]}
    d = digest.Digest.from_wire(raw)
    assert d is not None and (d.nodes, d.ranks, d.waiting, d.quiet) == (2, 4, 4, 3.5)
    assert d.idle is None and d.issued == {"0": digest.Issued(9, 2)}
    assert d.pending == (digest.PendingEntry("0", 9, "ab", 0, 3, "all_reduce"),)
    assert d.ended == (digest.Ended(5, "finished"),)
    assert digest.Digest.from_wire([1, 2]) is None and digest.Digest.from_wire(None) is None
    assert digest.Digest.from_wire({"ranks": "many"}) is None


@pytest.fixture
def store_port():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    yield server.port
    del server


def _client(port: int):
    return lambda: dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                 timeout=timedelta(seconds=10))


@pytest.mark.timeout(60)
def test_digests_climb_the_tree_and_the_verdict_comes_down(tmp_path: Path,
                                                          store_port: int) -> None:
    nnodes = 18  # node 1 has a child of its own (17): three levels
    nodes = [Coordinator(_client(store_port), "run", nnodes, interval=0.05)
             for _ in range(nnodes)]
    for c in nodes:
        c.setup()  # node numbers by arrival, as under a c10d rendezvous
    assert sorted(c.node for c in nodes) == list(range(nnodes))
    by_node = {c.node: c for c in nodes}
    local = digest.Digest(nodes=1, unknown=0, ranks=2, world=2 * nnodes, live=2, waiting=2,
                          blocked=2, quiet=40.0, wait=40.0)
    world = digest.Digest()
    for _ in range(4):  # leaves to node 0: a round per level, and one to spare
        for node in sorted(by_node, reverse=True):
            c = by_node[node]
            merged = c.update(local)
            c.step()
            if node == 0:
                world = merged
    assert world.nodes == nnodes and world.ranks == 2 * nnodes and not world.unknown
    root = by_node[0]
    decision = root.watch({}, 30, None, time.time())  # node 0 has no ranks of its own here
    assert decision.stop is None  # its own digest is empty: the world is short of ranks
    root.publish_verdict(Decision(Stop.HANG, "every rank waited", named=(5,)))
    root.step()
    for c in nodes[1:]:
        c.step()
    assert all(c.verdict() == {"stop": "hang", "reason": "every rank waited", "named": [5]}
               for c in nodes)
    steps = 6
    assert all(c.traffic.ops <= 3 + digest.FANOUT + 1 + 2 * steps for c in nodes)


def test_a_child_whose_digest_cannot_be_read_makes_its_subtree_unknown(
        store_port: int) -> None:
    root = Coordinator(_client(store_port), "garbled", 2, node=0, interval=0.05)
    root.setup()
    store = _client(store_port)()
    store.set(root._digest_key(1), b"{not json")
    local = digest.merge(digest.Digest(nodes=1, ranks=1, world=2, live=1, waiting=1,
                                       blocked=1, quiet=0.0, wait=0.0), [])
    root.update(local)
    root.step()
    assert root.update(local).unknown == 1


def test_a_child_that_stops_publishing_makes_its_subtree_unknown(store_port: int,
                                                                 monkeypatch) -> None:
    from ddpdoctor.launch import coordination

    root = Coordinator(_client(store_port), "stale", 2, node=0, interval=0.05)
    child = Coordinator(_client(store_port), "stale", 2, node=1, interval=0.05)
    root.setup(), child.setup()
    local = digest.merge(digest.Digest(nodes=1, ranks=1, world=2, live=1, waiting=1,
                                       blocked=1, quiet=0.0, wait=0.0), [])
    child.update(local)
    child.step()
    root.step()
    assert root.update(local).unknown == 0 and root.update(local).ranks == 2
    monkeypatch.setattr(coordination, "STALE", 0.0)
    time.sleep(0.01)
    assert root.update(local).unknown == 1
    child.update(local, final=True)  # a node whose job ended says so: never stale
    child.step()
    root.step()
    assert root.update(local).unknown == 0


@pytest.mark.timeout(60)
def test_a_node_learns_that_every_other_nodes_job_has_ended(store_port: int) -> None:
    nodes = [Coordinator(_client(store_port), "ended", 3, node=n, interval=0.05)
             for n in range(3)]
    local = digest.merge(digest.Digest(nodes=1, ranks=1, world=3, live=0), [])
    for c in nodes:
        c.setup()
        c.update(local)
    root = nodes[0]
    ops = root.traffic.ops
    root.step()
    assert root.traffic.ops == ops + 1  # not asked yet: no read of the count
    assert not root.others_ended()
    for c in nodes[1:]:
        c.start()
    nodes[1].finish(local)
    root.step()
    assert not root.others_ended()  # node 2's job still runs
    nodes[2].finish(local)
    root.step()
    assert root.others_ended()


def _mismatch_on_two_nodes(tmp_path: Path) -> tuple[tuple[Path, dict], tuple[Path, dict]]:
    """Rank 0 on node 0 and rank 1 on node 1: 30 matching all-reduces, then a barrier on rank
    0 against an all-reduce on rank 1 (their folders, their ranks)."""
    n0, n1 = tmp_path / "n0", tmp_path / "n1"
    _, r0 = _node(n0, [0], 2)
    _, r1 = _node(n1, [1], 2)
    for _ in range(30):
        r0[0].coll("all_reduce", 4), r1[1].coll("all_reduce", 4)
    r0[0].coll("barrier", 0)
    r1[1].coll("all_reduce", 740)
    r0[0].done(31)
    r1[1].done(31)
    return (n0, r0), (n1, r1)


def test_named_ranks_cross_to_every_node_as_partial_traces(tmp_path: Path,
                                                          store_port: int) -> None:
    (n0, r0), (n1, r1) = _mismatch_on_two_nodes(tmp_path)
    a = Coordinator(_client(store_port), "x", 2, node=0)
    b = Coordinator(_client(store_port), "x", 2, node=1)
    a.setup(), b.setup()
    got: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda c=c, mine=mine, folder=folder: got.__setitem__(
        c.node, c.exchange([0, 1], mine, folder, wait=10)))
        for c, mine, folder in ((a, {0: r0[0].path}, n0), (b, {1: r1[1].path}, n1))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == {0: [1], 1: [0]}
    remote = (n1 / schema.remote_filename(0)).read_bytes()
    assert len(remote.splitlines()) < 20  # the end of the trace, not all of it
    run = load_run([n1])
    assert run.ranks[0].remote and not run.ranks[0].damaged_lines
    report = diagnose(run)
    root = report.findings[0]
    assert root.kind == "op_mismatch" and root.seq == 31, report.findings
    # Given both nodes' folders, each rank's own trace is read, not the detail.
    both = load_run([n0, n1])
    assert not both.ranks[0].remote and len(both.ranks[0].collectives) == 31


@pytest.mark.timeout(60)
def test_at_a_jobs_own_end_the_told_ranks_cross_through_node_0s_own_store(
        tmp_path: Path, store_port: int) -> None:
    """No verdict: node 0 serves a store of its own, published in the rendezvous store; node
    1 joins it; each tells what its diagnosis roots the job at, and fetches the others'."""
    (n0, r0), (n1, r1) = _mismatch_on_two_nodes(tmp_path)
    a = Coordinator(_client(store_port), "x", 2, node=0)
    b = Coordinator(_client(store_port), "x", 2, node=1)
    b.setup()
    assert b.end.join(b.store) is False  # node 0's store is not up yet
    a.setup()
    assert a.end.store is not None and b.end.join(b.store) and b.end.store is not None
    got: dict[int, list[int]] = {}
    told = {0: [], 1: [1]}  # node 0's ranks only lost their peer: it tells nothing
    threads = [threading.Thread(target=lambda c=c, mine=mine, folder=folder: got.__setitem__(
        c.node, c.end.tell(c.node, told[c.node], mine, folder, wait=10)))
        for c, mine, folder in ((a, {0: r0[0].path}, n0), (b, {1: r1[1].path}, n1))]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == {0: [1], 1: []} and time.monotonic() - start < 5
    assert load_run([n0]).ranks[1].remote
    assert not (n1 / schema.remote_filename(0)).exists()
    # A node alone at the end waits for the others no longer than its bound, and learns
    # nothing.
    c = Coordinator(_client(store_port), "y", 2, node=0)
    c.setup()
    start = time.monotonic()
    assert c.end.tell(0, [], {0: r0[0].path}, tmp_path, wait=1.0) == []
    assert 0.9 < time.monotonic() - start < 3.5


def test_a_detail_keeps_the_last_collectives_of_each_group_and_the_end(tmp_path: Path) -> None:
    _, ranks = _node(tmp_path, [0], 2)
    r = ranks[0]
    for i in range(50):
        r.coll("all_reduce", 4, group=str(i % 2))
    r.done(50)
    r._write({"kind": "hang", "t": T0, "pending": [], "threads": []})
    lines = [json.loads(line) for line in detail.extract(r.path).splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["partial"] is True
    colls = [x for x in lines if x["kind"] == "collective"]
    assert len(colls) == 2 * detail.KEEP and colls[-1]["id"] == 50
    assert {x["kind"] for x in lines} >= {"stack", "site", "process_start", "done", "hang"}
    # The sites those collectives name come with them: read back, each is in its group.
    other = tmp_path / "other"
    _node(other, [1], 2)  # a node of its own ranks, given rank 0's detail
    detail.write(other, 0, detail.extract(r.path))
    remote = load_run([other]).ranks[0]
    assert remote.remote and not remote.damaged_lines
    kept = list(remote.collectives)
    assert [(c.id, c.group) for c in kept] == [(x["id"], str((x["id"] - 1) % 2)) for x in colls]


def test_a_node_that_cannot_reach_the_store_decides_nothing_and_the_report_says_so(
        tmp_path: Path, monkeypatch) -> None:
    from ddpdoctor.launch import coordination
    from ddpdoctor.launch.job import JobResult, write_job_record

    monkeypatch.setattr(coordination, "CONNECT_SECONDS", 0.3)

    def refuse():
        raise ConnectionRefusedError("connection refused")

    c = Coordinator(refuse, "nostore", 2, interval=0.05).start()
    assert c._thread is not None
    c._thread.join(5)
    job, ranks = _node(tmp_path, [0], 2)
    ranks[0].coll("barrier", 0)
    ranks[0].activity(T0 + 1, 0.0)
    job.poll(T0 + 1)
    assert c.node is None and "refused" in c.error
    assert c.watch(job.ranks, 1, None, T0 + 100).stop is None
    write_job_record(tmp_path, JobResult(0, str(tmp_path), 1.0, nnodes=2,
                                         unwatched="hangs across nodes were not watched: x"))
    assert "hangs across nodes were not watched: x" in load_run([tmp_path]).notes


def test_the_leaves_exchange_first_and_node_0_last_within_each_second() -> None:
    """A digest climbs a level within the second: each level exchanges after the one below."""
    nnodes = 300  # three levels: 0, 1..16, 17..272, and 273..299 below node 16
    at = {n: Coordinator(lambda: None, "r", nnodes, node=n).until_turn(999.9)
          for n in (0, 1, 17, 299)}  # a tenth of a second before a whole second
    assert at[299] < at[17] < at[1] < at[0] <= 1.0
    assert at[17] == pytest.approx(at[299] + 0.25)  # a level later: a quarter of the second


def test_a_detail_of_another_run_or_a_damaged_one_is_left_out(tmp_path: Path) -> None:
    _, ranks = _node(tmp_path, [0], 2)
    ranks[0].coll("all_reduce", 4)
    other = tmp_path / "elsewhere"
    _, theirs = _node(other, [1], 2)
    theirs[1].coll("all_reduce", 4)
    detail.write(tmp_path, 1, detail.extract(theirs[1].path).replace(b'"r"', b'"other-run"'))
    assert 1 not in load_run([tmp_path]).ranks
    (tmp_path / schema.remote_filename(1)).write_bytes(b'{"kind": "header", "partial": tr\n\0\0')
    assert 1 not in load_run([tmp_path]).ranks
    detail.write(tmp_path, 1, detail.extract(theirs[1].path))
    assert load_run([tmp_path]).ranks[1].remote
