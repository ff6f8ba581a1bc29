"""The parameters of a Nemotron-H decoder (pure): one block per layer, as `hybrid_override_pattern`
spells it, each built as vLLM builds it (vLLM 0.32.0, vllm/model_executor/models/nemotron_h.py):

- `M`, a Mamba2 mixer (planner/mamba_mixer_weights.py) of I = mamba_num_heads x mamba_head_dim channels,
  n_groups groups of ssm_state_size states;
- `*`, attention (NemotronHAttention, nemotron_h.py:427-475): qkv, hidden x (heads + 2 kv heads) x
  head_dim, and o, heads x head_dim x hidden, no biases;
- `-`, a dense MLP without a gate (NemotronHMLP, :93-125, relu2): up and down, hidden x width, the
  width of the MLP's index where `intermediate_size` is a list (:300-306);
- `E`, a mixture of experts (NemotronHMoE, :136-250): the router, hidden x experts (:160-166), and its
  float32 score-correction bias; each routed expert's up and down, (latent or hidden) x
  moe_intermediate_size (no gate: `activation_without_mul`); the shared experts, one MLP of
  moe_shared_expert_intermediate_size x n_shared_experts (:180-193); with `moe_latent_size`, the two
  latent projections, hidden x latent (:198-214).

kvwatch counted Nemotron-H as if every layer held attention and the routed experts: 190.7 GiB for
Nemotron-3-Nano-30B-A3B, whose vLLM start-up on a GB10 logged a 34.32 GiB KV cache.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.planner.mamba_mixer_weights import mamba2_mixer_params
from kvwatch.values.config_values import positive_int

MODEL_TYPE = "nemotron_h"


@dataclass(frozen=True)
class NemotronHParams:
    linear: int              # every projection, routers included
    attention: int           # the attention layers' qkv and o
    routers: int             # hidden x experts per MoE layer
    expert_units: int        # routed experts over all MoE layers
    moe_width: int           # one expert's intermediate size
    routed: int              # experts per token
    expert_hidden: int       # the width the experts run at (the latent size, else hidden)
    mlp_width: int           # the widest MLP a token passes through (a dense layer's, or its experts' and the shared)
    layers: int


def _dense_width(cfg: Mapping[str, Any], index: int) -> int:
    widths = cfg.get("intermediate_size")
    if isinstance(widths, list):
        chosen = widths[0] if len(widths) == 1 else widths[index] if 0 <= index < len(widths) else 0
        return chosen if isinstance(chosen, int) and chosen > 0 else 0
    return positive_int(cfg, "intermediate_size")


def nemotron_h_params(cfg: Mapping[str, Any]) -> NemotronHParams | None:
    """The decoder's parameters by block; None when the config is not Nemotron-H's or lacks a shape."""
    pattern = cfg.get("hybrid_override_pattern")
    hidden, heads = positive_int(cfg, "hidden_size"), positive_int(cfg, "num_attention_heads")
    if cfg.get("model_type") != MODEL_TYPE or not isinstance(pattern, str) or not pattern or not hidden or not heads:
        return None
    head_dim = positive_int(cfg, "head_dim") or hidden // heads
    kv_heads = positive_int(cfg, "num_key_value_heads") or heads
    attention = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    m_heads, m_head_dim = positive_int(cfg, "mamba_num_heads"), positive_int(cfg, "mamba_head_dim")
    groups, state = positive_int(cfg, "n_groups") or 1, positive_int(cfg, "ssm_state_size")
    mamba = mamba2_mixer_params(hidden, m_heads * m_head_dim, m_heads, groups, state, positive_int(cfg, "conv_kernel") or 4,
                                bool(cfg.get("use_conv_bias", True)))
    experts, moe_width = positive_int(cfg, "n_routed_experts"), positive_int(cfg, "moe_intermediate_size")
    latent = positive_int(cfg, "moe_latent_size")
    expert_hidden = latent or hidden
    shared = positive_int(cfg, "moe_shared_expert_intermediate_size") * positive_int(cfg, "n_shared_experts")
    router = hidden * experts + experts
    moe = router + experts * 2 * expert_hidden * moe_width + 2 * hidden * shared + (2 * hidden * latent if latent else 0)
    routed = positive_int(cfg, "num_experts_per_tok") or 1
    linear = attention_total = routers = moe_layers = dense_seen = widest = 0
    for block in pattern:
        if block == "M":
            linear += mamba
        elif block == "*":
            linear += attention
            attention_total += attention
        elif block == "-":
            width = _dense_width(cfg, dense_seen)
            dense_seen += 1
            linear += 2 * hidden * width
            widest = max(widest, width)
        elif block == "E":
            linear += moe
            routers += router
            moe_layers += 1
    if moe_layers:
        widest = max(widest, routed * moe_width + shared)
    return NemotronHParams(linear=linear, attention=attention_total, routers=routers,
                           expert_units=moe_layers * experts, moe_width=moe_width if moe_layers else 0,
                           routed=routed if moe_layers else 0, expert_hidden=expert_hidden, mlp_width=widest,
                           layers=len(pattern))
