"""The fair, CPU-bounded queue for bcrypt checks and the choice of the connection that gives way."""
from __future__ import annotations

import threading
import time
from collections import Counter, deque

import pytest

from kvwatch.exporter.eviction import to_evict
from kvwatch.exporter.fair_turns import FairTurns, next_ticket, rest_after

A1, A2, B1, C1 = object(), object(), object(), object()


@pytest.mark.parametrize("waiting, served, expected", [
    ({}, {}, None),
    ({"a": [(1, A1), (2, A2)]}, {}, A1),                                  # one client: its oldest
    ({"a": [(1, A1), (2, A2)], "b": [(3, B1)]}, {"a": 5}, B1),            # a served, b never: b first
    ({"a": [(1, A1)], "b": [(3, B1)]}, {"a": 5, "b": 9}, A1),             # a served longer ago
    ({"a": [(1, A1)], "b": [(3, B1)], "c": [(2, C1)]}, {}, A1),           # never served: in arrival order
    ({"a": [(4, A1)], "b": [(3, B1)], "c": [(2, C1)]}, {"a": 1}, C1),
    ({"a": [], "b": [(3, B1)]}, {}, B1),                                   # no turn waiting: skipped
])
def test_next_ticket(waiting, served, expected) -> None:
    assert next_ticket({k: deque(v) for k, v in waiting.items()}, served) is expected


@pytest.mark.parametrize("took, share, rest", [
    (0.1, 0.25, 0.3), (0.1, 0.5, 0.1), (0.1, 1.0, 0.0), (0.0, 0.25, 0.0), (0.2, 0.0, 0.0),
])
def test_rest_after(took: float, share: float, rest: float) -> None:
    assert rest_after(took, share) == pytest.approx(rest)


# A connection: (name, its client's address, accepted when, waiting for a request head since or None).
def _evict(connections: list[tuple[str, str, float, float | None]], slots: int) -> str | None:
    keys = {name: i for i, (name, *_rest) in enumerate(connections)}
    waiting = {keys[n]: since for n, _, _, since in connections if since is not None}
    peers = {keys[n]: (peer, started) for n, peer, started, _ in connections}
    per_peer = Counter(peer for _, peer, _, _ in connections)
    key = to_evict(waiting, peers, per_peer, now=10.0, slots=slots)
    return None if key is None else connections[key][0]


@pytest.mark.parametrize("connections, slots, expected", [
    ([], 4, None),
    # serving connections only, no address holding over half: nobody gives way
    ([("x", "1", 0, None), ("y", "2", 0, None)], 4, None),
    # an idle one that just came in (within the grace) is about to send its request
    ([("x", "1", 9.8, 9.8)], 4, None),
    ([("x", "1", 9.8, 9.8), ("y", "2", 9.8, 9.8)], 4, None),
    # idle ones: the address holding most gives way first, whatever the waiting times
    ([("scraper", "1", 0, 1.0), ("f1", "2", 5, 5.0), ("f2", "2", 6, 6.0)], 4, "f1"),
    # the same address: the longest waiting
    ([("f1", "2", 5, 7.0), ("f2", "2", 6, 6.0)], 4, "f2"),
    # a young one of a flood goes in place of a neighbour's old idle one (the neighbour holds fewer)
    ([("s", "1", 0, 1.0), ("f1", "2", 9.7, 9.7), ("f2", "2", 9.8, 9.8)], 4, "f1"),
    # the same address: the one past the grace, never a young one (a scraper's kept-alive connection)
    ([("f1", "2", 9.7, 9.7), ("f2", "2", 1, 2.0), ("s", "2", 0, 9.9)], 4, "f2"),
    # none idle, one address over half the slots: its oldest, though it is serving
    ([("s", "1", 0, None), ("f1", "2", 3, None), ("f2", "2", 2, None), ("f3", "2", 4, None)], 4, "f2"),
    # exactly half is not over half
    ([("s", "1", 0, None), ("f1", "2", 3, None), ("f2", "2", 2, None)], 4, None),
])
def test_to_evict(connections, slots, expected) -> None:
    assert _evict(connections, slots) == expected


def test_a_second_address_goes_before_a_flood_from_the_first() -> None:
    turns = FairTurns(share=1.0)
    assert turns.acquire("flood", 1)                 # the flood holds the turn...
    order: list[str] = []

    def wait(client: str) -> None:
        if turns.acquire(client, 5):
            order.append(client)
            time.sleep(0.01)
            turns.release()

    waiters = [threading.Thread(target=wait, args=("flood",)) for _ in range(4)]
    for t in waiters:
        t.start()
    time.sleep(0.1)                                  # ...four more of it queue, then a scraper
    scraper = threading.Thread(target=wait, args=("scraper",))
    scraper.start()
    time.sleep(0.1)
    turns.release()
    for t in [*waiters, scraper]:
        t.join(10)
    assert order[0] == "scraper"
    assert order.count("flood") == 4


def test_a_cancelled_wait_ends_and_the_next_in_line_goes() -> None:
    turns = FairTurns(share=1.0)
    assert turns.acquire("x", 1)
    cut = threading.Event()
    results: dict[str, bool] = {}

    def wait(client: str, cancelled) -> None:
        results[client] = turns.acquire(client, 10, cancelled)
        if results[client]:
            turns.release()

    flood = threading.Thread(target=wait, args=("flood", cut.is_set))   # never served: first in line
    flood.start()
    time.sleep(0.05)
    scraper = threading.Thread(target=wait, args=("scraper", lambda: False))
    scraper.start()
    time.sleep(0.05)
    cut.set()                                        # the server cut the flood's connection
    flood.join(2)
    assert results == {"flood": False}               # its wait ended well before its 10 s
    turns.release()
    scraper.join(5)
    assert results["scraper"] is True


def test_turns_take_at_most_their_share_of_the_time() -> None:
    """Five turns of 0.1 s at a share of 0.5: each rests 0.1 s after the one before, so they span
    at least 0.9 s (a floor the clock enforces, not a speed)."""
    turns = FairTurns(share=0.5)
    starts: list[float] = []

    def one() -> None:
        assert turns.acquire("flood", 10)
        starts.append(time.monotonic())
        time.sleep(0.1)
        turns.release()

    workers = [threading.Thread(target=one) for _ in range(5)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(15)
    assert len(starts) == 5
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.2 - 0.01                   # 0.1 s of turn + 0.1 s of rest
