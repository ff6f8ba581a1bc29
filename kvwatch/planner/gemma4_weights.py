"""Gemma 4's parameters layer by layer (pure), as vLLM 0.32.0 builds them (vllm/model_executor/models/gemma4.py):

- attention: a full-attention layer is global_head_dim wide (default 512) and, with attention_k_eq_v, has
  num_global_key_value_heads (transformers 5.19.0 Gemma4TextConfig.per_layer_config; gemma4.py:578 reads
  per_layer_config[i]); its qkv_proj holds K and V both (the checkpoint's k_proj loads into both, :85-126);
  the last num_kv_shared_layers layers build q_proj and o_proj only (:403-437);
- MLP: gated; a KV-shared layer's is twice as wide under use_double_wide_mlp (:595-611);
- per-layer embeddings (hidden_size_per_layer_input > 0, the E-series): embed_tokens_per_layer,
  vocab_size_per_layer_input x (per-layer width x layers), and per_layer_model_projection, hidden x the same
  (:1018-1045); in each layer, per_layer_input_gate and per_layer_projection, hidden x per-layer width each
  (:674-700).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.values.config_values import positive_int

MODEL_TYPES = ("gemma4", "gemma4_text")
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True)
class Gemma4Params:
    attention: int          # every layer's q, k, v and o
    mlp: int                # every layer's gated MLP
    per_layer_linear: int   # the per-layer embeddings' projections (per_layer_model_projection, gates)
    per_layer_embedding: int   # embed_tokens_per_layer
    widest_mlp: int


def gemma4_params(cfg: Mapping[str, Any], hidden: int, heads: int, head_dim: int, kv_heads: int,
                  layers: int) -> Gemma4Params | None:
    """None for another model, or a config whose layer_types do not name every layer."""
    types = cfg.get("layer_types")
    if cfg.get("model_type") not in MODEL_TYPES or not isinstance(types, list) or len(types) != layers:
        return None
    wide = positive_int(cfg, "global_head_dim") or 512
    global_kv = positive_int(cfg, "num_global_key_value_heads") if cfg.get("attention_k_eq_v") is True else 0
    shared_from = layers - min(positive_int(cfg, "num_kv_shared_layers"), layers - 1)
    width = positive_int(cfg, "intermediate_size")
    # a file that leaves the per-layer input out takes the class's (256 x 262,144: planner/config_keys.py
    # class_defaults fills it); a stated 0 turns it off
    per_layer = positive_int(cfg, "hidden_size_per_layer_input")
    attention = mlp = widest = 0
    for index, kind in enumerate(types):
        full = kind == FULL_ATTENTION
        size, kv = (wide, global_kv or kv_heads) if full else (head_dim, kv_heads)
        shared = index >= shared_from
        attention += hidden * heads * size * 2 + (0 if shared else 2 * hidden * kv * size)
        layer_width = width * (2 if shared and cfg.get("use_double_wide_mlp") is True else 1)
        mlp += 3 * hidden * layer_width
        widest = max(widest, layer_width)
    vocab = positive_int(cfg, "vocab_size_per_layer_input", "vocab_size")
    # per_layer_model_projection, and each layer's per_layer_input_gate and per_layer_projection
    return Gemma4Params(attention=attention, mlp=mlp, widest_mlp=widest, per_layer_linear=3 * hidden * per_layer * layers,
                        per_layer_embedding=vocab * per_layer * layers)
