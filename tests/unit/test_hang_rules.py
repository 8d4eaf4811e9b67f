"""The hang rules as a pure function, over every combination of rank states: waiting, busy
(CPU or I/O), blocked, exited, and ranks of another node known from a fresh or a stale summary.
Each combination of three ranks is checked against the rules as the README states them."""

from __future__ import annotations

import itertools

import pytest

from ddpdoctor.analysis.hang_rules import Pending, RankProgress, decide
from ddpdoctor.trace.model import Collective
from ddpdoctor.trace.schema import Stop

T0 = 1000.0
NOW = T0 + 100
TIMEOUT = 30.0
STATES = ("waiting", "busy_cpu", "busy_io", "blocked", "exited")


def _rank(rank: int, state: str) -> RankProgress:
    """Rank ``rank`` in ``state`` at NOW: every waiting rank waits since T0 in the same
    all_reduce (#5), which every rank that got there issued; the others stopped at #4."""
    p = RankProgress(rank, last_progress=T0, world_size=3)
    if state == "exited":
        p.status = "finished"
        return p
    activity = {"t": T0 + 1, "quiet_since": T0, "cpu_rate": 0.0,
                "frames": [{"file": "train.py", "line": 30 + rank, "function": "f"}]}
    if state == "waiting":
        c = Collective(rank=rank, id=5, group="0", seq=5, op="all_reduce", label="user",
                       shapes=[[4]], dtypes=["float32"], numel=4)
        p.pending = {5: Pending(T0, "all_reduce (user)", c)}
        p.issued = {"0": 5}
    else:
        p.issued = {"0": 4}
    if state == "busy_cpu":
        activity["cpu_rate"] = 0.6
    elif state == "busy_io":
        activity["io_rate"] = 8_000_000  # a download: the launcher never sets still_since
    elif state == "blocked":
        p.still_since = T0
    p.activity = activity
    rate = activity["cpu_rate"]
    p.cpu_rate = float(rate) if isinstance(rate, float) else None
    return p


def _expected(states: tuple[str, ...], stuck_timeout: float | None) -> Stop | None:
    live = [s for s in states if s != "exited"]
    waiting = [s for s in live if s == "waiting"]
    blocked = [s for s in live if s == "blocked"]
    if live and len(waiting) == len(live):
        return Stop.HANG
    if blocked and waiting and len(blocked) + len(waiting) == len(live):
        return Stop.STUCK  # the blocked rank everyone else waits for, at the hang timeout
    if stuck_timeout is not None and blocked:
        return Stop.STUCK  # blocked past --stuck-timeout, whoever waits
    return None


CASES = [c for c in itertools.product(STATES, repeat=3)
         if c.count("exited") < 3]


@pytest.mark.parametrize("stuck_timeout", [None, 60.0], ids=["no-stuck", "stuck-60"])
def test_every_combination_of_three_rank_states(stuck_timeout: float | None) -> None:
    wrong = []
    for states in CASES:
        ranks = {r: _rank(r, s) for r, s in enumerate(states)}
        got = decide(ranks, {}, TIMEOUT, stuck_timeout, NOW).stop
        if got != _expected(states, stuck_timeout):
            wrong.append((states, got, _expected(states, stuck_timeout)))
    assert not wrong, wrong[:10]


@pytest.mark.parametrize("stuck_timeout", [None, 60.0], ids=["no-stuck", "stuck-60"])
def test_split_over_two_nodes_the_world_digest_decides_as_one_node_would(
        stuck_timeout: float | None) -> None:
    """Every combination, with its ranks split over two nodes every way: node 0's verdict
    from the two node digests is the verdict of the rules over all the ranks at once."""
    from ddpdoctor.analysis import digest

    wrong = []
    for states in CASES:
        ranks = {r: _rank(r, s) for r, s in enumerate(states)}
        want = decide(ranks, {}, TIMEOUT, stuck_timeout, NOW).stop
        for mask in range(1, 7):  # node 0 holds the ranks of the mask's bits, node 1 the rest
            mine = {r: p for r, p in ranks.items() if mask >> r & 1}
            theirs = {r: p for r, p in ranks.items() if not mask >> r & 1}
            world = digest.merge(digest.node_digest(mine, NOW),
                                 [digest.node_digest(theirs, NOW)])
            got = digest.world_decision(world, TIMEOUT, stuck_timeout, NOW).stop
            if got != want:
                wrong.append((states, mask, got, want))
    assert not wrong, wrong[:10]


def test_a_busy_rank_never_lets_a_hang_or_a_blocker_be_called() -> None:
    for states in CASES:
        if any(s in ("busy_cpu", "busy_io") for s in states) and \
                "blocked" not in states:
            ranks = {r: _rank(r, s) for r, s in enumerate(states)}
            assert decide(ranks, {}, TIMEOUT, 60.0, NOW).stop is None, states


def test_the_blocker_is_named_in_the_reason() -> None:
    ranks = {0: _rank(0, "blocked"), 1: _rank(1, "waiting"), 2: _rank(2, "waiting")}
    decision = decide(ranks, {}, TIMEOUT, None, NOW)
    assert decision.stop == Stop.STUCK
    assert decision.reason.startswith("rank 0 stayed in f() at train.py:30 without using CPU")


def test_before_the_timeout_nothing_is_stopped() -> None:
    for states in CASES:
        ranks = {r: _rank(r, s) for r, s in enumerate(states)}
        assert decide(ranks, {}, TIMEOUT, 600.0, T0 + TIMEOUT - 1).stop is None, states


@pytest.mark.parametrize("path, name", [
    ("/root/.pyenv/versions/3.11.7/lib/python3.11/queue.py", "queue.get()"),
    ("/usr/lib/python3.11/multiprocessing/queues.py", "multiprocessing.queues.get()"),
    ("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
     "torch.distributed.distributed_c10d.get()"),
    ("/home/me/mylib.py", "mylib.get()"),
])
def test_a_blocking_call_is_named_by_its_module(path: str, name: str) -> None:
    from ddpdoctor.trace.basics import call_name

    assert call_name(path, "get") == name
