"""The sparse-attention indexer cache of DeepSeek-V3.2-style models (GPU only; pure).

An MLA model whose config.json has `index_topk` (DeepSeek-V3.2, GLM-5) gives each decoder layer
an indexer next to its attention, and the indexer keeps its own cache of one key per token
(vLLM 0.32, model_executor/models/deepseek_v2.py):

- `DeepseekV32IndexerCache.get_kv_cache_spec`: an MLAAttentionSpec of one head of
  `index_head_dim + index_head_dim // 128 * 4` bytes (uint8: an fp8 key plus one float32 scale per
  128-element quantization block, `quant_block_size = 128`, deepseek_v2.py:724/732), TP-replicated;
- which layers have one (deepseek_v2.py:1138-1168): every layer unless `index_topk_pattern`
  marks it "S", or, without a pattern, `max(layer - index_skip_topk_offset + 1, 0) %
  index_topk_freq != 0` (defaults: offset 2, freq 1, so every layer).

The CPU platform refuses sparse attention outright (planner/architectures.py), so this cache is
only ever sized on a GPU.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

QUANT_BLOCK = 128   # deepseek_v2.py:724 (a TODO there says it will come from the config)
SCALE_BYTES = 4     # one float32 scale per quantization block


def _int(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def indexer_bytes_per_token_per_layer(cfg: Mapping[str, Any]) -> int:
    """One token of one layer's indexer cache, in bytes (0 when the model has no indexer)."""
    if "index_topk" not in cfg:
        return 0
    head = _int(cfg, "index_head_dim", 128)
    return head + head // QUANT_BLOCK * SCALE_BYTES


def indexer_flags(cfg: Mapping[str, Any], layers: int | None = None) -> tuple[bool, ...]:
    """Per decoder layer (the first `layers`, else num_hidden_layers): whether it builds an indexer."""
    if "index_topk" not in cfg:
        return (False,) * (layers or 0)
    count = _int(cfg, "num_hidden_layers", 0) if layers is None else layers
    pattern = cfg.get("index_topk_pattern")
    if isinstance(pattern, (str, list)):   # a layer past its end keeps its indexer
        return tuple(not (i < len(pattern) and pattern[i] == "S") for i in range(count))
    freq = max(1, _int(cfg, "index_topk_freq", 1))
    offset = _int(cfg, "index_skip_topk_offset", 2)
    return tuple(max(i - offset + 1, 0) % freq == 0 for i in range(count))


def indexer_layers(cfg: Mapping[str, Any]) -> int:
    """How many decoder layers build an indexer (and so hold its cache)."""
    return sum(indexer_flags(cfg))


def indexer_bytes_per_token(cfg: Mapping[str, Any]) -> int:
    """The indexer cache of every layer for one token (TP-replicated: the same on every rank)."""
    return indexer_bytes_per_token_per_layer(cfg) * indexer_layers(cfg)
