"""Which connection gives way when every connection slot is taken (pure).

A scraper's request takes milliseconds; a flood of idle, slow or silent connections can take every
slot. The one cut is, in this order:

1. one that waits for a request head (idle, or sending it a byte at a time), from the address
   holding the most connections, the longest waiting of it first: a flood from one address gives
   way before one well-behaved neighbour's idle keep-alive connection. One that began waiting
   within IDLE_GRACE (about to send its request) is cut only when its address holds the most;
2. when none waits: any connection of an address holding more than half the slots (busy
   connections too, e.g. reading the answer a byte at a time), its oldest first, so that one
   address never holds every slot;
3. else none: the new connection is refused.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

IDLE_GRACE = 0.5     # seconds: a connection that just got in is about to send its request


@dataclass(frozen=True)
class Connection:
    key: int                 # the serving thread
    peer: str                # the client's address
    started: float           # when it was accepted (monotonic)
    waiting_since: float | None   # when it began waiting for a request head; None while serving one


def to_evict(connections: Sequence[Connection], now: float, slots: int) -> int | None:
    per_peer = Counter(c.peer for c in connections)
    most = max(per_peer.values(), default=0)

    def young(c: Connection) -> bool:
        return c.waiting_since is not None and now - c.waiting_since <= IDLE_GRACE

    # A connection within its grace gives way only when its address holds the most (and more than one).
    idle = [c for c in connections if c.waiting_since is not None
            and (not young(c) or (per_peer[c.peer] == most and most > 1))]
    if idle:
        return min(idle, key=lambda c: (-per_peer[c.peer], young(c), c.waiting_since)).key
    if not per_peer:
        return None
    peer, held = per_peer.most_common(1)[0]
    if held * 2 <= slots:
        return None
    return min((c for c in connections if c.peer == peer), key=lambda c: c.started).key
