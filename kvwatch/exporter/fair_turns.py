"""Turns at one slow, CPU-bound check (bcrypt), shared fairly between clients, its CPU share bounded.

A flood of new credentials (a brute force) would otherwise take a whole core and queue a real
client behind thousands of guesses. Here:

- one turn runs at a time;
- waiting clients are served by client, the one served longest ago first (round-robin by address),
  not in arrival order, so a flood from one address delays another client by at most one turn per
  other waiting address;
- a wait ends early when `cancelled()` says so (the server cut that connection to free its slot),
  so a flood waiting for turns holds no slot another client needs; a refusal is never immediate,
  which would let a brute force retry as fast as it can connect;
- after a turn that took t seconds the next starts no sooner than t * (1 / share - 1) later, so
  the turns take at most `share` of one core, whatever the flood.

`next_ticket` (which waiting turn goes next) is the decision, pure; FairTurns is its lock.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence


def next_ticket(waiting: Mapping[Hashable, Sequence[tuple[int, object]]],
                served: Mapping[Hashable, int]) -> object | None:
    """The turn served next: of the clients with a turn waiting, the one served longest ago (never
    served first), and of its turns the oldest; `waiting` holds (arrival number, ticket) in arrival
    order, `served` the number of each client's last turn."""
    best: tuple[int, int, object] | None = None
    for client, turns in waiting.items():
        if turns:
            candidate = (served.get(client, -1), turns[0][0], turns[0][1])
            if best is None or candidate[:2] < best[:2]:
                best = candidate
    return None if best is None else best[2]


def rest_after(took: float, share: float) -> float:
    """Seconds the next turn waits after one that took `took`, so that turns use at most `share`."""
    return took * (1.0 / share - 1.0) if 0.0 < share < 1.0 else 0.0


class FairTurns:
    MAX_REMEMBERED = 1024     # clients whose last turn is remembered (forgetting one only favours it)

    POLL = 0.1   # seconds between looks at `cancelled` while waiting

    def __init__(self, share: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self._share = share
        self._clock = clock
        self._cond = threading.Condition()
        self._waiting: dict[Hashable, deque[tuple[int, object]]] = {}
        self._served: dict[Hashable, int] = {}     # client -> number of its last turn, oldest first
        self._count = 0
        self._busy_since: float | None = None
        self._rest_until = 0.0

    def acquire(self, client: Hashable, timeout: float,
                cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Wait for this client's turn, at most `timeout` seconds; False when too late or cancelled."""
        with self._cond:
            turns = self._waiting.setdefault(client, deque())
            self._count += 1
            entry = (self._count, object())
            turns.append(entry)
            deadline = self._clock() + timeout
            try:
                while True:
                    now = self._clock()
                    mine = self._busy_since is None and next_ticket(self._waiting, self._served) is entry[1]
                    if mine and now >= self._rest_until:
                        self._busy_since = now
                        self._served.pop(client, None)
                        self._served[client] = self._count
                        while len(self._served) > self.MAX_REMEMBERED:
                            del self._served[next(iter(self._served))]
                        return True
                    left = deadline - now
                    if left <= 0 or cancelled():
                        self._cond.notify_all()     # the next in line may be someone else now
                        return False
                    self._cond.wait(min(left, self._rest_until - now, self.POLL) if mine
                                    else min(left, self.POLL))
            finally:
                turns.remove(entry)
                if not turns:
                    del self._waiting[client]

    def release(self) -> None:
        with self._cond:
            now = self._clock()
            took = now - self._busy_since if self._busy_since is not None else 0.0
            self._busy_since = None
            self._rest_until = now + rest_after(took, self._share)
            self._cond.notify_all()
