"""What the engine's memory profile teaches (pure): the non-KV memory of a profile, kept per profile
(model, batch flags, card, vLLM), and the KV bytes a pinned launch gets from it.

The engine says what its profile left the KV cache; the CUDA total x utilization it sized against,
less that, is everything else it holds (weights, activations, graphs): the next launch of the same
profile is planned with it (source "learned") and, with engine.pin_kv_cache_memory, pinned to it.

A pin is --kv-cache-memory-bytes, and from vLLM 0.34 that turns the extensible KV cache off (vLLM
0.34.0, vllm/config/vllm.py:3203-3207): the cache is then sized from the pin, not from the memory
measured after warm-up and CUDA graph capture. Where the extensible cache is on, a pin helps only
while other processes hold the GPU (it keeps the cache from taking the room they may grow into);
on a GPU of its own the engine measures its cache better than a learned figure, so it is not pinned.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.extensible_kv import extensible_for
from kvwatch.planner.plan import Plan
from kvwatch.planner.units import format_bytes
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.release_defaults import defaults_for

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


def pin_costs_extensible(settings: EngineSettings, platform: str, version: VllmVersion) -> bool:
    """Whether pinning this command would take vLLM's extensible KV cache away (0.34+ on CUDA, not
    already off by its flags)."""
    return extensible_for(settings, platform, defaults_for(version)).sizing is not None


def pin_for(learned_plan: Plan | None, foreign_bytes: int, extensible: bool = False) -> Pin:
    """What the learned plan gives the KV cache, less what other processes hold on the GPU now;
    not pinned when nothing is learned yet, when what is left holds fewer than two blocks, or, where
    the pin would turn off vLLM's extensible KV cache (`extensible`: pin_costs_extensible), when no
    other process holds the GPU. A pin that turns it off says so in `why`."""
    if learned_plan is None or learned_plan.source != "learned":
        return Pin(None, "nothing learned yet for this profile: vLLM profiles the memory itself")
    if extensible and foreign_bytes <= 0:
        return Pin(None, "vLLM sizes the KV cache itself after warm-up (extensible KV cache); "
                         "--kv-cache-memory-bytes would turn that off for nothing: not pinned")
    pinned = learned_plan.kv_memory_bytes - foreign_bytes
    if pinned < 2 * learned_plan.bytes_per_block:
        return Pin(None, "other processes hold more of the GPU than the learned KV cache: "
                         "vLLM profiles the memory itself")
    if extensible:
        return Pin(pinned, f"learned; other processes hold {format_bytes(foreign_bytes)}: the pin keeps the KV "
                           "cache from their room, and costs vLLM's extensible KV cache (the cache is no "
                           "longer sized from the memory measured after warm-up)")
    return Pin(pinned, "learned")
