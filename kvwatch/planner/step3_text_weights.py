"""Step3's text decoder (model_type step3_text) as vLLM builds it, for the weight count (pure).

vLLM 0.32.0, vllm/model_executor/models/step3_text.py:
- attention (:159-194): one KV head (num_attention_groups, which must be 1: :162-165) and a low-rank
  query: qkv_proj hidden -> share_q_dim + 2 x head_dim, a ReplicatedLinear (whole on every tensor-parallel
  rank, quantized as the other layers: :172-178), then wq share_q_dim -> heads x head_dim (:188-194) and
  o_proj heads x head_dim -> hidden (:180-186);
- MoE on the layers moe_layers_enum names, a comma-separated string (:249-252), else layers 1 .. L-1
  (:253-254): moe_num_experts experts of moe_intermediate_size beside one shared MLP of share_expert_dim
  (:256-267); the other layers a dense MLP of intermediate_size (:268-275);
- the LM head is its own, never tied (:322, :536-541).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.values.config_values import positive_int as _int

STEP3_TEXT = "step3_text"


@dataclass(frozen=True)
class Step3Attention:
    per_layer: int     # qkv_proj + wq + o_proj of one layer
    replicated: int    # qkv_proj of one layer (whole on every rank)


def step3_attention(cfg: Mapping[str, Any], hidden: int, heads: int, head_dim: int) -> Step3Attention | None:
    """One Step3 layer's attention parameters; None for another family or a config without share_q_dim."""
    if cfg.get("model_type") != STEP3_TEXT:
        return None
    share_q = _int(cfg, "share_q_dim") or head_dim   # :169 `share_q_dim if share_q_dim else head_dim`
    kv = 1   # num_attention_groups; vLLM refuses any other (:162-165)
    qkv = hidden * (share_q + 2 * kv * head_dim)
    return Step3Attention(per_layer=qkv + share_q * heads * head_dim + heads * head_dim * hidden, replicated=qkv)


def step3_moe_layers(cfg: Mapping[str, Any], layers: int) -> list[int] | None:
    """The layers Step3 builds with experts; None for another family."""
    if cfg.get("model_type") != STEP3_TEXT:
        return None
    named = cfg.get("moe_layers_enum")
    items = named.split(",") if isinstance(named, str) else named if isinstance(named, list) else None
    if items is None:
        return list(range(1, layers))
    picked = {int(item) for item in items if str(item).strip().lstrip("-").isdigit()}
    return sorted(i for i in picked if 0 <= i < layers)


def step3_shared_width(cfg: Mapping[str, Any]) -> int:
    """The shared MLP's width of each Step3 MoE layer (0 for another family)."""
    return _int(cfg, "share_expert_dim") if cfg.get("model_type") == STEP3_TEXT else 0
