"""The parameters of vLLM's Mamba2 mixer, and of the hybrids that list their layers' mixers (pure).

MambaMixer2 (vLLM 0.32.0, vllm/model_executor/layers/mamba/mamba_mixer2.py:265-520), for a mixer of
I = heads x head_dim inner channels, G groups of S states and H heads: in_proj, hidden x (2 I + 2 G S + H)
(:358-366); conv1d, (I + 2 G S) x kernel, plus its bias with use_conv_bias (:343-356); A, D and dt_bias,
one each per head (:480-487); the gated norm, I (:506); out_proj, I x hidden (:497).

Granite 4.0's hybrids (GraniteMoeHybridForCausalLM, vLLM 0.32.0 models/granitemoehybrid.py) build each
layer's mixer from `layer_types` (:349-351): a Mamba2 mixer of mamba_expand x hidden channels,
mamba_n_heads heads of mamba_d_head (:73-89), or attention; every layer keeps its MoE and shared MLP.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GRANITE_HYBRID = "granitemoehybrid"


def mamba2_mixer_params(hidden: int, inner: int, heads: int, groups: int, state: int, kernel: int,
                        conv_bias: bool) -> int:
    """One MambaMixer2's parameters (its projections without biases, as the hybrids build them)."""
    conv_dim = inner + 2 * groups * state
    return (hidden * (2 * inner + 2 * groups * state + heads) + conv_dim * (kernel + (1 if conv_bias else 0))
            + 3 * heads + inner + inner * hidden)


def _positive(cfg: Mapping[str, Any], key: str) -> int:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def granite_hybrid_mixers(cfg: Mapping[str, Any], attention: int, hidden: int, layers: int) -> int | None:
    """The token mixers of a Granite 4.0 hybrid, layer by layer (`attention`: one attention layer's
    parameters); None for another model, or a config whose layer_types do not name every layer."""
    types = cfg.get("layer_types")
    if cfg.get("model_type") != GRANITE_HYBRID or not isinstance(types, list) or len(types) != layers:
        return None
    mamba = mamba2_mixer_params(hidden, (_positive(cfg, "mamba_expand") or 2) * hidden, _positive(cfg, "mamba_n_heads"),
                                _positive(cfg, "mamba_n_groups") or 1, _positive(cfg, "mamba_d_state"),
                                _positive(cfg, "mamba_d_conv") or 4, cfg.get("mamba_conv_bias", True) is not False)
    return sum(mamba if kind == "mamba" else attention for kind in types)
