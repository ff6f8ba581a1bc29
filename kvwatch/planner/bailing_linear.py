"""Bailing MoE V2.5's lightning-attention and MLA layers, as vLLM builds them (pure).

BailingMoeV2_5ForCausalLM (Ring-2.5 / Ling-2.5, model_type bailing_hybrid) mixes two kinds of decoder
layer, by `layer_group_size` (default 1): layer i is linear attention where the group size is positive
and `(i + 1) % layer_group_size != 0`, full attention otherwise (is_linear_layer and
BailingMoeV25Model.__init__: vLLM 0.34.0, vllm/model_executor/models/bailing_moe_linear.py:68-74 and
:462-469; the same in 0.32.0 and 0.33.0).

- A full-attention layer is MLA without an indexer (BailingMoeV25MLAAttention, bailing_moe_linear.py:
  77-221): one latent of `kv_lora_rank + qk_rope_head_dim` per token, the planner's MLA geometry.
- A linear-attention layer (BailingMoELinearAttention, a LinearAttention: vLLM 0.34.0,
  vllm/model_executor/layers/mamba/linear/base.py:23-66) keeps one state per request: a MambaSpec
  (mamba_type LINEAR) of the one tensor `(num_attention_heads // tp, head_dim, head_dim)`
  (MambaStateShapeCalculator.linear_attention_state_shape, mamba_utils.py:162-169), `head_dim` the
  config's, else `hidden_size // num_attention_heads` (base.py:39-43), in --mamba-cache-dtype
  ("auto": the model's dtype; linear_attention_state_dtype, mamba_utils.py:63-69, reads no
  --mamba-ssm-cache-dtype). The planner keeps that tensor where it keeps a conv state, whose dtype
  rule it is (layers.RecurrentState family "linear").

The model is IsHybrid, so the attention block size and the state page are aligned as for every MLA
hybrid (Platform._align_hybrid_block_size, vllm_releases/hybrid_alignment.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvwatch.planner.layers import FULL, MAMBA, LayerLayout, RecurrentState

ARCHITECTURES = frozenset({"BailingMoeV2_5ForCausalLM"})


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def is_linear_layer(layer: int, group_size: int) -> bool:
    """is_linear_layer (bailing_moe_linear.py:68-74): every layer but each group's last."""
    return group_size > 0 and (layer + 1) % group_size != 0


def bailing_linear_layout(cfg: Mapping[str, Any], architectures: Sequence[str], num_layers: int) -> LayerLayout | None:
    """The cache layers of a Bailing V2.5 (text) config.json, in order; None for another model."""
    if not ARCHITECTURES & set(architectures):
        return None
    group = cfg.get("layer_group_size", 1)
    group = group if isinstance(group, int) and not isinstance(group, bool) else 1
    kinds = tuple(MAMBA if is_linear_layer(i, group) else FULL for i in range(num_layers))
    heads = _positive(cfg.get("num_attention_heads")) or 1
    head_dim = _positive(cfg.get("head_dim")) or (_positive(cfg.get("hidden_size")) or heads) // heads
    state = RecurrentState("linear", conv_kernel=0, num_heads=heads, head_dim=head_dim)
    return LayerLayout(kinds, None, state if MAMBA in kinds else None)
