"""vLLM's extensible KV cache (0.34+), as a plan sees it (pure): whether it is on for a command, what
vLLM refuses about it, and what it gives the KV cache.

With it the cache is reserved as address space, committed after warm-up and CUDA graph capture, and
sized from the memory measured then (vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:592-612
measure_kv_cache_bytes):

    KV = min(requested - resident, free at start - resident - margin) - transient

- requested: CUDA total x utilization, an unset utilization meaning 1.0 (vllm/config/cache.py:495-501,
  the figure in vllm_releases/defaults.py); an explicit value below 1.0 is a cap, and vLLM warns when
  it withholds 1 GiB or more (extensible_kv_cache.py:654-677);
- resident: all the engine keeps after warm-up (weights, non-torch memory, the captured CUDA graphs,
  the runner's state), the KV cache's committed prefix excepted;
- free at start: the card's free memory at the worker's first snapshot (CUDA total less what the
  CUDA context and other processes hold);
- transient: the profiled activation peak plus the CUDA graph estimate (gpu_worker.py:771-773, kept
  free as reserved_headroom_bytes, gpu_worker.py:946); margin: max(1 GiB, 0.75 x transient) on CUDA
  (extensible_kv_cache.py:64-65).

It is on by default on CUDA (and ROCm) unless --kv-cache-memory-bytes or --num-gpu-blocks-override
fixes the cache (vllm/config/vllm.py:3180-3263 _resolve_extensible_kv_cache); asked for where it
cannot be, vLLM refuses to start (vllm/config/vllm.py:3263). KV connectors, elastic EP and drivers
without virtual memory management also turn it off; kvwatch does not read those.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.devices import CUDA_CONTEXT_BYTES, GiB
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.vllm_releases.defaults_shape import ExtensibleSizing, ReleaseDefaults

RESOLVE_SOURCE = "vllm/config/vllm.py:3180-3263"
__all__ = ["CUDA_CONTEXT_BYTES"]   # devices.CUDA_CONTEXT_BYTES, what a clean card lacks at the first snapshot
# vLLM warns that an explicit utilization below 1.0 caps the cache when it withholds this much
# (vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:661).
CAP_WARNING_BYTES = GiB


@dataclass(frozen=True)
class Extensible:
    """The extensible KV cache as a command gets it: on or off, and why."""

    sizing: ExtensibleSizing | None   # None: off (the release has none, or these flags turn it off)
    why: str
    refusal: str | None = None        # vLLM's ValueError when the flags ask for it where it cannot be


def extensible_for(settings: EngineSettings, platform: str, defaults: ReleaseDefaults) -> Extensible:
    """Whether the release sizes this command's KV cache after warm-up (vllm/config/vllm.py
    _resolve_extensible_kv_cache, the parts kvwatch reads: the platform and the two flags that fix the
    cache's size)."""
    sizing = defaults.extensible
    if sizing is None:
        return Extensible(None, f"vLLM {defaults.release} has no extensible KV cache")
    cite = f"vLLM {defaults.release}, {RESOLVE_SOURCE}"
    unsupported = None
    if platform != "cuda":
        unsupported = "it is only supported on CUDA and ROCm"
    elif settings.kv_cache_memory_bytes is not None:
        unsupported = "it sizes the KV cache from measured memory, which kv_cache_memory_bytes overrides"
    elif settings.num_gpu_blocks_override is not None:
        unsupported = "it sizes the KV cache from measured memory, which num_gpu_blocks_override overrides"
    asked = settings.enable_extensible_kv_cache
    if asked and unsupported is not None:
        return Extensible(None, f"refused ({cite})", f"enable_extensible_kv_cache: {unsupported}.")
    if asked is False:
        return Extensible(None, f"off: --no-enable-extensible-kv-cache ({cite})")
    if unsupported is not None:
        return Extensible(None, f"off: {unsupported} ({cite})")
    return Extensible(sizing, f"on: the KV cache is sized after warm-up and CUDA graph capture ({cite})")


def unset_utilization(extensible: Extensible, estimate_default: float) -> float:
    """What an unset --gpu-memory-utilization means: 1.0 with the extensible cache, else the
    release's estimate-based default (CacheConfig.resolved_gpu_memory_utilization)."""
    return extensible.sizing.utilization if extensible.sizing is not None else estimate_default


def extensible_kv_bytes(sizing: ExtensibleSizing, requested: int, free_at_start: int, resident: int,
                        transient: int) -> int:
    """measure_kv_cache_bytes (vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:592-612), with
    torch's reservation growth taken as no larger than the transient peak."""
    margin = max(sizing.margin_floor_bytes, int(transient * sizing.margin_fraction))
    available = min(requested - resident, free_at_start - resident - margin) - transient
    return max(available, 0)


def withheld_bytes(sizing: ExtensibleSizing, total: int, utilization: float, free_at_start: int, resident: int,
                   transient: int) -> int:
    """What an explicit utilization keeps out of the cache against leaving it unset (0 when unset
    would give no more): vLLM warns from CAP_WARNING_BYTES (extensible_kv_cache.py:654-677)."""
    capped = extensible_kv_bytes(sizing, int(total * utilization), free_at_start, resident, transient)
    free = extensible_kv_bytes(sizing, free_at_start, free_at_start, resident, transient)
    return max(0, free - capped)


def effective_utilization(settings: EngineSettings, platform: str, defaults: ReleaseDefaults) -> float:
    """The utilization vLLM sizes against for these flags: the flag, else 1.0 with the extensible KV
    cache on, else the release's estimate-based default. A remedy compares with this, never with the
    estimate default alone: under 0.34 "raise to 0.95" would lower an unset 1.0."""
    if settings.gpu_memory_utilization_given:
        return settings.gpu_memory_utilization
    return unset_utilization(extensible_for(settings, platform, defaults), defaults.gpu_memory_utilization)
