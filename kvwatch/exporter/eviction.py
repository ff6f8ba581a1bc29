"""Which connection gives way when every connection slot is taken (pure).

A scraper's request takes milliseconds; a flood of idle, slow or silent connections can take every
slot. The one cut is, in this order:

1. one that waits for a request head (idle, or sending it a byte at a time), from the address
   holding the most connections, the longest waiting of it first: a flood from one address gives
   way before one well-behaved neighbour's idle keep-alive connection. One that began waiting
   within IDLE_GRACE (about to send its request) is cut only in place of a neighbour's holding
   fewer connections;
2. when none waits: any connection of an address holding more than half the slots (busy
   connections too, e.g. reading the answer a byte at a time), its oldest first, so that one
   address never holds every slot;
3. else none: the new connection is refused.

It runs on every connection beyond the bound, under the server's lock: it reads the server's own
tables (no copy) and makes no object per connection.
"""
from __future__ import annotations

from collections.abc import Mapping

IDLE_GRACE = 0.5     # seconds: a connection that just got in is about to send its request


def to_evict(waiting: Mapping[int, float], peers: Mapping[int, tuple[str, float]],
             per_peer: Mapping[str, int], now: float, slots: int) -> int | None:
    """`waiting`: connection -> since when it waits for a request head; `peers`: every connection ->
    (its client's address, when it was accepted); `per_peer`: address -> connections it holds."""
    old: tuple[int, float, int] | None = None     # (-held, waiting since, connection): the least is cut
    young: tuple[int, float, int] | None = None
    for key, since in waiting.items():
        rank = (-per_peer.get(peers[key][0], 0) if key in peers else 0, since, key)
        if now - since > IDLE_GRACE:
            old = rank if old is None or rank < old else old
        elif young is None or rank < young:
            young = rank
    if old is not None:
        # One within its grace gives way only for a neighbour holding fewer connections.
        return young[2] if young is not None and young[0] < old[0] else old[2]
    if not per_peer:
        return None
    peer, held = max(per_peer.items(), key=lambda item: item[1])
    if held * 2 <= slots:
        return None
    return min((started, key) for key, (address, started) in peers.items() if address == peer)[1]
