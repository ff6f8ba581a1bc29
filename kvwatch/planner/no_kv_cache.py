"""A model vLLM allocates no KV cache for: encoder-only models (BERT, RoBERTa, XLM-R, ModernBERT,
GTE, Nomic, their embedding and reranking heads), planned as 0 blocks (pure).

Every layer of these is EncoderOnlyAttention, whose KV cache spec is None (vLLM 0.33.0,
vllm/model_executor/layers/attention/encoder_only_attention.py:94-96: "Does not need KV cache"),
so the worker reports no spec; the engine then gives the KV cache no memory (vllm/v1/engine/core.py:298-314,
"Attention free models don't need memory for kv cache") and sizes a config with no group and no
tensor, one null block for the block pool (vllm/v1/core/kv_cache_planning.py:658-662). The same
holds in 0.28.0 and 0.34.0 (encoder_only_attention.py:96 and :94). Which architectures build only
that layer is the release's architecture table (architecture_kinds.builds_no_cache).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.predicted_refusal import PredictedRefusal

if TYPE_CHECKING:
    from kvwatch.planner.plan import Plan

NO_KV_CACHE_SOURCE = ("vLLM 0.33.0, vllm/model_executor/layers/attention/encoder_only_attention.py:94-96 "
                      "(no KV cache spec) and vllm/v1/engine/core.py:298-314 (no memory for a KV cache)")
NO_KV_CACHE_ATTENTION = "encoder-only"


def no_kv_cache_plan(model: str, reason: str, settings: EngineSettings, device: Device,
                     max_model_len: int | None, warnings: Sequence[PredictedRefusal]) -> Plan:
    """The plan of a model vLLM gives no KV cache: 0 blocks, 0 bytes, exact (no estimate is involved)."""
    from kvwatch.planner.plan import Plan  # plan.py calls this module: import at use
    return Plan(
        model=model, device=device.name, compute_capability=device.sm, attention=NO_KV_CACHE_ATTENTION,
        backend=None, block_size=settings.block_size or 0, block_size_source="no KV cache: no block is sized",
        kv_cache_dtype=settings.kv_cache_dtype, dtype_bytes=0, kv_bytes_per_token_per_layer=0, kv_bytes_per_token=0,
        page_size_bytes=0, layers_per_block=0, bytes_per_block=0, kv_memory_bytes=0,
        kv_memory_source=f"none: {reason} ({NO_KV_CACHE_SOURCE})", num_blocks=0, kv_cache_tokens=0,
        max_model_len=max_model_len, max_concurrency=None, estimated=False,
        padding_bytes={}, warnings=tuple(warnings), data_parallel_size=max(1, settings.data_parallel_size),
        pipeline_parallel_size=max(1, settings.pipeline_parallel_size), kv_cache_groups=0, no_kv_cache=reason)
