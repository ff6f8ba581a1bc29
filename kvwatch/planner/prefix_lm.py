"""HRM-Text's prefix-LM attention, as vLLM builds its cache from config.json (pure).

vLLM 0.33.0 and 0.34.0 (the same code in both; citations are 0.34.0's):

- Which layers: each attention block of HRM-Text's two stacks builds one PrefillPrefixLMAttention per
  recurrence step it runs at: the L stack at H_cycles x L_cycles steps, the H stack at H_cycles
  steps, each a layer of its own with its own cache (model_executor/models/hrm_text.py:185-224). The
  cache layers are num_layers_per_stack x H_cycles x (L_cycles + 1); vLLM reads the three fields
  from config.json, not num_hidden_layers.
- Its weights: two stacks (L and H) of num_layers_per_stack decoder layers each, shared by every
  recurrence step (hrm_text.py:320-331, :389-401): 2 x num_layers_per_stack layers of weights,
  whatever num_hidden_layers (the cache layers) says.
- Its shape: multi-head, KV heads = num_attention_heads whatever num_key_value_heads says
  (hrm_text.py:142-147), / TP per rank; head_dim from config.json, else hidden_size / heads.
- Its spec: the decoder layer's FullAttentionSpec with non_causal=True
  (layers/attention/prefill_prefix_lm_attention.py:73-86): the page, block size, dtype and memory
  per request of full attention; the flag only tells the engine core to turn chunked prefill and
  prefix caching off (v1/engine/core.py:282-301), and grouping merges it with full attention
  (v1/kv_cache_interface.py:674-712, non_causal=any(...)).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import MAX_FIELD, positive_field

PREFIX_LM_ARCHITECTURES = frozenset({"HrmTextForCausalLM"})


def _positive(cfg: Mapping[str, Any], key: str) -> int:
    return positive_field(cfg, key, needs="HRM-Text: vLLM reads it")


def prefix_lm_layers(cfg: Mapping[str, Any], architectures: tuple[str, ...]) -> tuple[int, int] | None:
    """(cache layers, KV heads) of an HRM-Text config.json, or None for another architecture."""
    if not PREFIX_LM_ARCHITECTURES & set(architectures):
        return None
    stack = _positive(cfg, "num_layers_per_stack")
    high, low = _positive(cfg, "H_cycles"), _positive(cfg, "L_cycles")
    layers = stack * high * (low + 1)
    if layers > MAX_FIELD:   # each field in bounds, their product a malformed config's
        raise ConfigError(f"config.json: HRM-Text's num_layers_per_stack x H_cycles x (L_cycles + 1) = {layers} "
                          f"cache layers is not a model's (at most {MAX_FIELD})")
    return layers, _positive(cfg, "num_attention_heads")


def weight_layers(cfg: Mapping[str, Any], architectures: tuple[str, ...]) -> int | None:
    """The decoder layers HRM-Text holds weights for (two stacks), or None for another architecture."""
    if not PREFIX_LM_ARCHITECTURES & set(architectures):
        return None
    return 2 * _positive(cfg, "num_layers_per_stack")
