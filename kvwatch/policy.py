"""Bounds and switches for the watchdog's remedies (the [policy] section of the config)."""
from __future__ import annotations

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
