"""The shape of vLLM's defaults per release (pure): the types the generated table defaults.py is
written in. The lookups the planner makes in it are in release_defaults.py; the types sit apart so the
table and the lookups import them without importing each other."""
from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
CUDAGRAPH_ABSENT, CUDAGRAPH_OPT_IN, CUDAGRAPH_DEFAULT = "absent", "opt-in", "default"


@dataclass(frozen=True)
class BatchTier:
    """One branch of vLLM's get_batch_defaults for the API server: a card with at least
    `min_memory_gib` of total memory (NVML's, as the CUDA platform reports it), whose name holds none
    of `exclude_names` and whose capability is none of `exclude_capabilities`."""
    min_memory_gib: int
    exclude_names: tuple[str, ...]
    exclude_capabilities: tuple[tuple[int, int], ...]
    max_num_batched_tokens: int
    max_num_seqs: int
    source: str

    def matches(self, total_memory_bytes: int, name: str, capability: tuple[int, int] | None) -> bool:
        return (total_memory_bytes >= self.min_memory_gib * GIB
                and not any(word in name.lower() for word in self.exclude_names)
                and capability not in self.exclude_capabilities)


@dataclass(frozen=True)
class ExtensibleSizing:
    """The extensible KV cache (0.34+, on by default on CUDA unless --kv-cache-memory-bytes or
    --num-gpu-blocks-override is given): the cache is sized from the memory measured after warm-up and
    CUDA graph capture. An unset --gpu-memory-utilization then means `utilization` (1.0); the cache
    gets min(budget - vLLM's own use, headroom - margin) - the transient peak, the margin being
    max(margin_floor_bytes, margin_fraction x transient peak) (measure_kv_cache_bytes)."""
    source: str                     # CacheConfig.enable_extensible_kv_cache
    utilization: float              # resolved_gpu_memory_utilization with the cache extensible
    utilization_source: str
    margin_floor_bytes: int         # KV_CACHE_MARGIN_FLOOR_BYTES (CUDA)
    margin_fraction: float          # KV_CACHE_MARGIN_FRACTION
    non_torch_reserve_bytes: int    # KV_CACHE_NON_TORCH_RESERVE_BYTES (CUDA), inside the margin
    margin_source: str


@dataclass(frozen=True)
class ReleaseDefaults:
    release: str
    gpu_memory_utilization: float
    gpu_memory_utilization_source: str
    block_size: int
    block_size_source: str
    batch_tiers: tuple[BatchTier, ...]     # first match wins; the last has no condition
    cpu_tokens_per_rank: int               # the CPU platform: x tensor x pipeline parallel size
    cpu_seqs_per_rank: int
    cpu_source: str
    cudagraph_estimate: str                # absent | opt-in | default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
    cudagraph_estimate_source: str
    cudagraph_applied_source: str          # where gpu_worker.py takes the estimate from the KV budget
    startup_plan_schema: int               # 0: the release has no persisted start-up plan
    startup_plan_source: str
    triton_sampler_source: str             # "" when the release has no Triton top-k/top-p kernel
    v0_switch_source: str = ""             # envs.py's VLLM_USE_V1 ("" once the V0 engine is gone)
    extensible: ExtensibleSizing | None = None   # None: the release sizes the cache from the profile only

    def cite(self, source: str) -> str:
        return f"vLLM {self.release}, {source}"

    def gpu_batch_tier(self, total_memory_bytes: int, name: str, capability: tuple[int, int] | None) -> BatchTier:
        return next(t for t in self.batch_tiers if t.matches(total_memory_bytes, name, capability))

    def cudagraphs_counted(self, env_value: str | None) -> bool:
        """Whether the profile takes the CUDA graph estimate from the KV budget, given the engine's
        VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (None: unset). envs.py reads it as bool(int(...))."""
        if self.cudagraph_estimate == CUDAGRAPH_ABSENT:
            return False
        if env_value is not None and env_value.strip().lstrip("-").isdigit():
            return int(env_value) != 0
        return self.cudagraph_estimate == CUDAGRAPH_DEFAULT
