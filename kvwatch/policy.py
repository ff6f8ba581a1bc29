"""Bounds and switches for the watchdog's remedies (the [policy] section of the config)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    preflight: bool = True
    max_corrections: int = 5
    max_restarts: int = 5
    restart_window_seconds: float = 600.0
    backoff_initial_seconds: float = 1.0
    backoff_max_seconds: float = 60.0
    stable_seconds: float = 300.0
    allow_kv_dtype_change: bool = True
    allow_block_size_change: bool = True
    allow_max_model_len_change: bool = True
    allow_gpu_memory_utilization_change: bool = True
    allow_max_num_batched_tokens_change: bool = True
    max_gpu_memory_utilization: float = 0.95
    min_gpu_memory_utilization: float = 0.5
    gpu_memory_utilization_step: float = 0.05
    # Fleet invariants: flags kvwatch never changes, whatever the remedy (llm-d's prefix-aware
    # scheduler and a NIXL prefill/decode pair need every pod's --block-size to stay as deployed).
    fixed_flags: tuple[str, ...] = ()


def fixed_among(policy: Policy, flags: Iterable[str]) -> tuple[str, ...]:
    """The flags of `flags` that policy.fixed_flags holds: a change touching one is not applied."""
    return tuple(f for f in flags if f in policy.fixed_flags)
