"""The Mamba2 mixer's parameters and Granite 4.0's hybrids layer by layer
(kvwatch/planner/mamba_mixer_weights.py), against vLLM 0.32.0's mamba_mixer2.py and granitemoehybrid.py."""
from __future__ import annotations

import pytest

from kvwatch.errors import ConfigError
from kvwatch.planner.mamba_mixer_weights import (
    granite_hybrid_mixers,
    jamba_layers,
    lfm2_mlp_width,
    mamba1_mixer_params,
    mamba2_mixer_params,
)
from kvwatch.planner.weights import count_weights

# ibm-granite/granite-4.0-h-tiny's config.json (40 layers: 5 Mamba2, attention, 4 Mamba2 per 10)
H_TINY = {"architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 1536,
          "num_hidden_layers": 40, "layer_types": (["mamba"] * 5 + ["attention"] + ["mamba"] * 4) * 4,
          "num_attention_heads": 12, "num_key_value_heads": 4, "mamba_expand": 2, "mamba_n_heads": 48,
          "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_conv_bias": True,
          "num_local_experts": 64, "num_experts_per_tok": 6, "intermediate_size": 512, "shared_intermediate_size": 1024,
          "vocab_size": 100352, "tie_word_embeddings": True}


@pytest.mark.parametrize(("shape", "params"), [
    # in_proj 8 x (16 + 4 + 2), conv1d 12 x (4 + 1), A/D/dt_bias 3 x 2, norm 8, out_proj 8 x 8
    ((8, 8, 2, 1, 2, 4, True), 176 + 60 + 6 + 8 + 64),
    ((8, 8, 2, 1, 2, 4, False), 176 + 48 + 6 + 8 + 64),
    # Granite 4.0-H-Tiny's mixer: 1536 x (6144 + 256 + 48), (3072 + 256) x 5, 144, 3072, 3072 x 1536
    ((1536, 3072, 48, 1, 128, 4, True), 1536 * 6448 + 3328 * 5 + 144 + 3072 + 3072 * 1536),
])
def test_a_mamba2_mixer_holds_vllms_parameters(shape: tuple, params: int) -> None:
    assert mamba2_mixer_params(*shape) == params


def test_granite_hybrids_count_a_mamba2_mixer_where_the_layer_says_so() -> None:
    attention = 2 * 1536 * 12 * 128 + 2 * 1536 * 4 * 128
    mamba = mamba2_mixer_params(1536, 3072, 48, 1, 128, 4, True)
    assert granite_hybrid_mixers(H_TINY, attention, 1536, 40) == 36 * mamba + 4 * attention
    assert granite_hybrid_mixers({**H_TINY, "layer_types": ["mamba"] * 39}, attention, 1536, 40) is None
    assert granite_hybrid_mixers({**H_TINY, "model_type": "granitemoe"}, attention, 1536, 40) is None


def test_granite_h_tiny_counts_its_published_size() -> None:
    """6.9 B parameters as IBM publishes granite-4.0-h-tiny; kvwatch counted 6.45 B when its Mamba2
    layers were read as attention and its shared MLP (shared_intermediate_size) was left out."""
    count = count_weights(H_TINY)
    assert count is not None and 6.88e9 < count.params < 6.98e9


# ai21labs/Jamba-v0.1's config.json; Jamba 1.5 Large differs in the fields below (its model card's 398 B)
JAMBA_V01 = {"model_type": "jamba", "architectures": ["JambaForCausalLM"], "hidden_size": 4096,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "attn_layer_period": 8,
             "attn_layer_offset": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 16,
             "num_experts_per_tok": 2, "intermediate_size": 14336, "vocab_size": 65536, "mamba_d_state": 16,
             "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 256, "mamba_conv_bias": True,
             "mamba_proj_bias": False, "tie_word_embeddings": False}
JAMBA_15_LARGE = {**JAMBA_V01, "hidden_size": 8192, "num_hidden_layers": 72, "num_attention_heads": 64,
                  "intermediate_size": 24576, "mamba_dt_rank": 512}


def test_a_mamba1_mixer_holds_vllms_parameters() -> None:
    # hidden 8, inner 16, state 2, rank 3, kernel 4: in_proj 8 x 32, conv1d 16 x 4 + 16, x_proj 16 x (3 + 4),
    # dt_proj 3 x 16 + 16, A 16 x 2, D 16, out_proj 16 x 8, the three RMS norms 3 + 2 + 2
    expected = 256 + 64 + 16 + 112 + 48 + 16 + 32 + 16 + 128 + 7
    assert mamba1_mixer_params(8, 16, 2, 3, 4, True, True) == expected
    assert mamba1_mixer_params(8, 16, 2, 3, 4, False, False) == expected - 16 - 7


@pytest.mark.parametrize(("config", "low", "high"), [
    (JAMBA_V01, 51.4e9, 51.8e9),        # 51.6 B published (kvwatch counted 92.1 B: every layer attention and MoE)
    (JAMBA_15_LARGE, 397e9, 400e9),     # 398 B published
])
def test_jamba_counts_its_mamba_layers_and_moe_every_other_layer(config: dict, low: float, high: float) -> None:
    count = count_weights(config)
    assert count is not None and low < count.params < high


def test_jambas_layer_plan_follows_its_periods() -> None:
    attention = 1000
    mixers, moe_layers = jamba_layers(JAMBA_V01, attention, 4096, 32) or (0, 0)
    mamba = mamba1_mixer_params(4096, 8192, 16, 256, 4, True, True)
    assert (mixers, moe_layers) == (4 * attention + 28 * mamba, 16)
    assert jamba_layers({**JAMBA_V01, "num_experts": 1}, attention, 4096, 32) == (mixers, 0)
    assert jamba_layers({**JAMBA_V01, "model_type": "llama"}, attention, 4096, 32) is None


@pytest.mark.parametrize("multiplier", [float("inf"), float("nan"), -2.0, 0, 1e308, "x", True])
def test_a_hostile_lfm2_width_multiplier_is_one_config_error(multiplier: object) -> None:
    """vLLM's int() of a non-finite product raises (models/lfm2.py:65): kvwatch says which field, no traceback."""
    config = {"model_type": "lfm2", "intermediate_size": 1024, "block_auto_adjust_ff_dim": True,
              "block_multiple_of": 256, "block_ffn_dim_multiplier": multiplier}
    with pytest.raises(ConfigError, match="block_ffn_dim_multiplier"):
        lfm2_mlp_width(config)


@pytest.mark.parametrize(("change", "width"), [
    ({}, 768),                                             # 2/3 of 1024 = 682, up to a multiple of 256
    ({"block_ffn_dim_multiplier": 1.5}, 1024),             # 1023, up to 1024
    ({"block_ffn_dim_multiplier": None}, 768),             # not given: no multiplier
    ({"block_auto_adjust_ff_dim": False}, 1024),           # intermediate_size as it is
    ({"model_type": "llama"}, 0),
])
def test_lfm2s_mlp_width_is_vllms(change: dict, width: int) -> None:
    config = {"model_type": "lfm2", "intermediate_size": 1024, "block_auto_adjust_ff_dim": True,
              "block_multiple_of": 256, **change}
    assert lfm2_mlp_width(config) == width
