"""The parameters of vLLM's Mamba2 mixer, and of the hybrids that list their layers' mixers (pure).

MambaMixer2 (vLLM 0.32.0, vllm/model_executor/layers/mamba/mamba_mixer2.py:265-520), for a mixer of
I = heads x head_dim inner channels, G groups of S states and H heads: in_proj, hidden x (2 I + 2 G S + H)
(:358-366); conv1d, (I + 2 G S) x kernel, plus its bias with use_conv_bias (:343-356); A, D and dt_bias,
one each per head (:480-487); the gated norm, I (:506); out_proj, I x hidden (:497).

MambaMixer (Mamba1, vLLM 0.32.0 vllm/model_executor/layers/mamba/mamba_mixer.py:85-190), for I inner channels,
S states, a time-step rank R and a kernel K: in_proj, hidden x 2 I; conv1d, I x K and its bias with use_conv_bias;
x_proj, I x (R + 2 S); dt_proj, R x I and its bias; A, I x S; D, I; out_proj, I x hidden; with RMS norms (Jamba),
R + 2 S more.

Jamba (vLLM 0.32.0 models/jamba.py:120-160, :321-323) builds a layer's mixer from transformers'
`layers_block_type` (attention where i % attn_layer_period == attn_layer_offset, else a Mamba1 mixer of
mamba_expand x hidden channels) and its feed-forward from `layers_num_experts` (num_experts experts where
i % expert_layer_period == expert_layer_offset, else one gated MLP); transformers 5.19.0
models/jamba/configuration_jamba.py:76-101 gives the defaults and the time-step rank ceil(hidden / 16).

Granite 4.0's hybrids (GraniteMoeHybridForCausalLM, vLLM 0.32.0 models/granitemoehybrid.py) build each
layer's mixer from `layer_types` (:349-351): a Mamba2 mixer of mamba_expand x hidden channels,
mamba_n_heads heads of mamba_d_head (:73-89), or attention; every layer keeps its MoE and shared MLP.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import MAX_FIELD
from kvwatch.values.config_values import positive_int, positive_number

GRANITE_HYBRID = "granitemoehybrid"
JAMBA = "jamba"
PURE_MAMBA = ("mamba", "falcon_mamba", "mamba2")
FALCON_H1 = "falcon_h1"
LFM2 = "lfm2"


def mamba2_mixer_params(hidden: int, inner: int, heads: int, groups: int, state: int, kernel: int,
                        conv_bias: bool, rms_norm: bool = True) -> int:
    """One MambaMixer2's parameters (its projections without biases, as the hybrids build them); the gated
    norm holds a weight only with use_rms_norm (mamba_mixer2.py:108-112)."""
    conv_dim = inner + 2 * groups * state
    return (hidden * (2 * inner + 2 * groups * state + heads) + conv_dim * (kernel + (1 if conv_bias else 0))
            + 3 * heads + (inner if rms_norm else 0) + inner * hidden)


def granite_hybrid_mixers(cfg: Mapping[str, Any], attention: int, hidden: int, layers: int) -> int | None:
    """The token mixers of a Granite 4.0 hybrid, layer by layer (`attention`: one attention layer's
    parameters); None for another model, or a config whose layer_types do not name every layer."""
    types = cfg.get("layer_types")
    if cfg.get("model_type") != GRANITE_HYBRID or not isinstance(types, list) or len(types) != layers:
        return None
    mamba = mamba2_mixer_params(hidden, (positive_int(cfg, "mamba_expand") or 2) * hidden, positive_int(cfg, "mamba_n_heads"),
                                positive_int(cfg, "mamba_n_groups") or 1, positive_int(cfg, "mamba_d_state"),
                                positive_int(cfg, "mamba_d_conv") or 4, cfg.get("mamba_conv_bias", True) is not False)
    return sum(mamba if kind == "mamba" else attention for kind in types)


def mamba1_mixer_params(hidden: int, inner: int, state: int, rank: int, kernel: int, conv_bias: bool,
                        rms_norms: bool) -> int:
    """One MambaMixer's (Mamba1) parameters."""
    return (hidden * 2 * inner + inner * kernel + (inner if conv_bias else 0) + inner * (rank + 2 * state)
            + rank * inner + inner + inner * state + inner + inner * hidden + ((rank + 2 * state) if rms_norms else 0))


def _setting(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def jamba_layers(cfg: Mapping[str, Any], attention: int, hidden: int, layers: int) -> tuple[int, int] | None:
    """Jamba's token mixers over all layers and its number of MoE layers; None for another model."""
    if cfg.get("model_type") != JAMBA:
        return None
    attn_period, attn_offset = _setting(cfg, "attn_layer_period", 8) or 1, _setting(cfg, "attn_layer_offset", 4)
    expert_period, expert_offset = _setting(cfg, "expert_layer_period", 2) or 1, _setting(cfg, "expert_layer_offset", 1)
    rank = positive_int(cfg, "mamba_dt_rank") or -(-hidden // 16)   # "auto": ceil(hidden / 16)
    mamba = mamba1_mixer_params(hidden, _setting(cfg, "mamba_expand", 2) * hidden, _setting(cfg, "mamba_d_state", 16),
                                rank, _setting(cfg, "mamba_d_conv", 4), cfg.get("mamba_conv_bias", True) is not False, True)
    attention_layers = sum(i % attn_period == attn_offset for i in range(layers))
    experts = _setting(cfg, "num_experts", 16)
    moe_layers = sum(i % expert_period == expert_offset for i in range(layers)) if experts > 1 else 0
    return attention_layers * attention + (layers - attention_layers) * mamba, moe_layers


def pure_mamba_mixers(cfg: Mapping[str, Any], hidden: int, layers: int) -> int | None:
    """The mixers of a model of Mamba layers only (vLLM 0.32.0 models/mamba.py:60-76: a MambaMixer of
    intermediate_size, no norm weights; falcon_mamba's RMS norms hold none, :71-72; models/mamba2.py:55-72:
    a MambaMixer2 of intermediate_size, else expand x hidden); None for another model."""
    model_type = cfg.get("model_type")
    if model_type not in PURE_MAMBA or not hidden or not layers:
        return None
    inner = positive_int(cfg, "intermediate_size") or (positive_int(cfg, "expand") or 2) * hidden
    kernel, bias = positive_int(cfg, "conv_kernel") or 4, cfg.get("use_conv_bias", True) is not False
    if model_type == "mamba2":
        mixer = mamba2_mixer_params(hidden, inner, positive_int(cfg, "num_heads"), positive_int(cfg, "n_groups") or 1,
                                    positive_int(cfg, "state_size"), kernel, bias)
    else:
        rank = positive_int(cfg, "time_step_rank") or -(-hidden // 16)
        mixer = mamba1_mixer_params(hidden, inner, positive_int(cfg, "state_size") or 16, rank, kernel, bias, False)
    return layers * mixer


def falcon_h1_mixers(cfg: Mapping[str, Any], attention: int, hidden: int, layers: int) -> int | None:
    """Falcon-H1's mixers: every layer runs attention and a Mamba2 mixer side by side (vLLM 0.32.0
    models/falcon_h1.py:113-134, :336-362): d_ssm = mamba_d_ssm, else mamba_expand x hidden; the gated norm's
    weight only with mamba_rms_norm. None for another model."""
    if cfg.get("model_type") != FALCON_H1:
        return None
    inner = positive_int(cfg, "mamba_d_ssm") or int((positive_int(cfg, "mamba_expand") or 2) * hidden)
    mamba = mamba2_mixer_params(hidden, inner, positive_int(cfg, "mamba_n_heads"), positive_int(cfg, "mamba_n_groups") or 1,
                                positive_int(cfg, "mamba_d_state"), positive_int(cfg, "mamba_d_conv") or 4,
                                cfg.get("mamba_conv_bias", True) is not False, cfg.get("mamba_rms_norm") is True)
    return layers * (attention + mamba)


def lfm2_mixers(cfg: Mapping[str, Any], attention: int, hidden: int, layers: int) -> int | None:
    """LFM2's mixers from `layer_types` (vLLM 0.32.0 models/lfm2.py): a short convolution (layers/mamba/
    short_conv.py:53-80: in_proj hidden x 3 hidden, conv conv_L_cache x hidden, out_proj hidden x hidden, each
    with a bias under conv_bias) or attention. None for another model or a list that does not name every layer."""
    types = cfg.get("layer_types")
    if cfg.get("model_type") != LFM2 or not isinstance(types, list) or len(types) != layers:
        return None
    bias = 1 if cfg.get("conv_bias") is True else 0
    conv = hidden * 3 * hidden + 3 * hidden * bias + (positive_int(cfg, "conv_L_cache") or 3) * hidden + hidden * bias \
        + hidden * hidden + hidden * bias
    return sum(conv if kind == "conv" else attention for kind in types)


def lfm2_mlp_width(cfg: Mapping[str, Any]) -> int:
    """LFM2's MLP width: intermediate_size, taken to 2/3, times block_ffn_dim_multiplier and rounded up to
    block_multiple_of under block_auto_adjust_ff_dim (vLLM 0.32.0 models/lfm2.py:61-68, :213-219); 0 for another model."""
    width = positive_int(cfg, "intermediate_size")
    if cfg.get("model_type") != LFM2 or not width:
        return 0
    if cfg.get("block_auto_adjust_ff_dim") is True:
        width = int(2 * width / 3)
        given = cfg.get("block_ffn_dim_multiplier")
        if given is not None:
            scaled = positive_number(given) * width
            if not 0 < scaled <= MAX_FIELD:   # vLLM's int() of it would raise, or the MLP holds no width
                raise ConfigError(f"config.json: field 'block_ffn_dim_multiplier' must be a positive number that "
                                  f"keeps the MLP at most {MAX_FIELD} wide, got {str(given)[:40]!r}")
            width = int(scaled)
        step = positive_int(cfg, "block_multiple_of") or 1
        width = step * -(-width // step)
    return width
