"""Voxtral Realtime's causal audio encoder caches as kv_groups plans them, and the scope they are
planned on (pure).

Each WhisperCausalEncoder layer's WhisperCausalAttentionWithBlockPooling takes its base Attention's
sliding-window spec (the block size in force, the encoder's KV heads and head size, the KV cache dtype)
and sets `tokens_per_state` to 1 / block_pool_size and the window to the pooled one (vLLM 0.34.0 and
0.33.0, model_executor/models/whisper_causal.py:411-426; 0.32.0 the same method): a block of B
language-model tokens holds B x pool encoder frames, so its page is `pool` times an unpooled one, and a
request holds cdiv(min(pooled window - 1 + in-flight tokens, max_model_len), B) + 1 blocks of it
(SlidingWindowSpec.max_admission_blocks_per_request). Its pages are the largest, so page unification
scales the language model's blocks up to them (kv_groups). tests/test_voxtral.py checks the specs, the
groups, blocks, per-request blocks and tokens against vLLM 0.32/0.33/0.34's own code
(scripts/oracle_voxtral_cache.py).
"""
from __future__ import annotations

from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.kv_bytes import kv_dtype_bytes
from kvwatch.planner.kv_groups import LayerSpec
from kvwatch.planner.layers import SLIDING
from kvwatch.planner.voxtral import CausalEncoder


def encoder_specs(encoder: CausalEncoder | None, settings: EngineSettings, config_dtype: str | None,
                  block_size: int) -> list[LayerSpec]:
    """One sliding-window spec per encoder layer, in the model's order after the language model's
    layers (its static forward context lists the language model first); none without an encoder."""
    if encoder is None:
        return []
    dtype_bytes = kv_dtype_bytes(settings.kv_cache_dtype, settings.dtype, config_dtype)
    page = encoder.page_bytes(block_size, max(1, settings.tensor_parallel_size), dtype_bytes)
    return [LayerSpec(SLIDING, block_size, page, page, encoder.pooled_window)] * encoder.layers


def encoder_unsure(encoder: CausalEncoder | None, settings: EngineSettings) -> str:
    """Why a plan with the causal encoder is unsure ("" within the scope checked against vLLM: no
    pipeline stages, the hybrid KV cache manager on, no speculative decoding)."""
    if encoder is None:
        return ""
    outside = [what for what, out in (
        ("pipeline parallelism (the encoder's layers per stage)", settings.pipeline_parallel_size > 1),
        ("--disable-hybrid-kv-cache-manager (the pooled specs promoted)", settings.disable_hybrid_kv_cache_manager),
        ("speculative decoding (the windows' retained tokens)", settings.num_speculative_tokens > 0)) if out]
    if not outside:
        return ""
    return (f"Voxtral's causal audio encoder (WhisperCausalAttentionWithBlockPooling) is planned without "
            f"{', '.join(outside)}; kvwatch/planner/voxtral_encoder.py")
