"""A model vLLM allocates no KV cache for: encoder-only models (BERT, RoBERTa, XLM-R, ModernBERT,
GTE, Nomic, their embedding and reranking heads), planned as 0 blocks (pure).

Every layer of these is EncoderOnlyAttention, whose KV cache spec is None (vLLM 0.33.0,
vllm/model_executor/layers/attention/encoder_only_attention.py:94-96: "Does not need KV cache"),
so the worker reports no spec; the engine then gives the KV cache no memory (vllm/v1/engine/core.py:298-314,
"Attention free models don't need memory for kv cache") and sizes a config with no group and no
tensor, one null block for the block pool (vllm/v1/core/kv_cache_planning.py:658-662). The same
holds in 0.28.0 and 0.34.0 (encoder_only_attention.py:96 and :94). Which architectures build only
that layer is the release's architecture table (architecture_kinds.builds_no_cache); plan.py's
_no_kv_cache_plan builds the plan from these words.
"""
from __future__ import annotations

NO_KV_CACHE_SOURCE = ("vLLM 0.33.0, vllm/model_executor/layers/attention/encoder_only_attention.py:94-96 "
                      "(no KV cache spec) and vllm/v1/engine/core.py:298-314 (no memory for a KV cache)")
NO_KV_CACHE_ATTENTION = "encoder-only"
