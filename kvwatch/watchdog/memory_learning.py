"""What the engine's memory profile teaches (pure): the non-KV memory of a profile, kept per profile
(model, batch flags, card, vLLM), and the KV bytes a pinned launch gets from it.

The engine says what its profile left the KV cache; the CUDA total x utilization it sized against,
less that, is everything else it holds (weights, activations, graphs): the next launch of the same
profile is planned with it (source "learned") and, with engine.pin_kv_cache_memory, pinned to it.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.plan import Plan

MAX_LEARNED_PROFILES = 32   # learned non-KV figures kept per engine (one per profile: flags, card, vLLM)


def remember_non_kv(learned: dict[str, int], key: str, requested: int, available_kv_bytes: int) -> None:
    """Keep the non-KV memory of profile `key`, newest last; the oldest profiles go first."""
    learned.pop(key, None)   # re-inserted last
    learned[key] = max(0, requested - available_kv_bytes)
    for old in list(learned)[:-MAX_LEARNED_PROFILES]:
        del learned[old]


@dataclass(frozen=True)
class Pin:
    """The KV bytes to pin a launch to (None: not pinned), and why, for the log."""

    kv_bytes: int | None
    why: str


def pin_for(learned_plan: Plan | None, foreign_bytes: int) -> Pin:
    """What the learned plan gives the KV cache, less what other processes hold on the GPU now;
    not pinned when nothing is learned yet or what is left holds fewer than two blocks."""
    if learned_plan is None or learned_plan.source != "learned":
        return Pin(None, "nothing learned yet for this profile: vLLM profiles the memory itself")
    pinned = learned_plan.kv_memory_bytes - foreign_bytes
    if pinned < 2 * learned_plan.bytes_per_block:
        return Pin(None, "other processes hold more of the GPU than the learned KV cache: "
                         "vLLM profiles the memory itself")
    return Pin(pinned, "learned")
