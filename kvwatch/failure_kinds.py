"""The failure classes: stable names, used as the `kind` label of kvwatch's metrics."""
from __future__ import annotations

from enum import Enum


class FailureKind(str, Enum):
    BLOCK_SIZE_UNSUPPORTED = "block_size_unsupported"
    KV_DTYPE_UNSUPPORTED = "kv_dtype_unsupported"
    KERNEL_OUT_OF_RESOURCES = "kernel_out_of_resources"
    KV_CACHE_TOO_SMALL = "kv_cache_too_small"
    NO_KV_CACHE_MEMORY = "no_kv_cache_memory"
    MAMBA_CACHE_TOO_SMALL = "mamba_cache_too_small"   # max_num_seqs above a hybrid's Mamba cache blocks
    CUDA_OOM = "cuda_oom"
    GPU_MEMORY_BUSY = "gpu_memory_busy"
    NO_ATTENTION_BACKEND = "no_attention_backend"
    CONFIG_REFUSED = "config_refused"           # vLLM's own validation of its configuration said no
    ENGINE_DIED = "engine_died"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value
