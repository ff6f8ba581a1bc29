"""Nemotron-H's parameters block by block (kvwatch/planner/nemotron_h_weights.py), against the shapes
vLLM 0.32.0's nemotron_h.py and mamba_mixer2.py build, worked out by hand for a small config."""
from __future__ import annotations

import pytest
from gpu_log_corpus import all_runs, model_config

from kvwatch.planner.nemotron_h_weights import nemotron_h_params
from kvwatch.planner.weights import count_weights

SMALL = {"model_type": "nemotron_h", "hybrid_override_pattern": "M*-E", "hidden_size": 8, "num_attention_heads": 2,
         "head_dim": 4, "num_key_value_heads": 1, "mamba_num_heads": 2, "mamba_head_dim": 4, "n_groups": 1,
         "ssm_state_size": 2, "conv_kernel": 4, "use_conv_bias": True, "intermediate_size": 6, "n_routed_experts": 3,
         "moe_intermediate_size": 5, "moe_shared_expert_intermediate_size": 7, "n_shared_experts": 1,
         "num_experts_per_tok": 2, "vocab_size": 10, "num_hidden_layers": 4}
# M: in_proj 8 x (2*8 + 2*1*2 + 2) = 176, conv1d (8 + 4) x (4 + 1 bias) = 60, A/D/dt_bias 3 x 2 = 6, norm 8, out 8 x 8 = 64
MAMBA = 176 + 60 + 6 + 8 + 64
ATTENTION = 8 * (2 + 2 * 1) * 4 + 2 * 4 * 8              # qkv, o
DENSE = 2 * 8 * 6                                          # up, down (relu2: no gate)
ROUTER = 8 * 3 + 3                                         # the gate and its score-correction bias
MOE = ROUTER + 3 * 2 * 8 * 5 + 2 * 8 * 7                   # routed experts' up and down, the shared MLP


@pytest.mark.parametrize(("change", "linear", "width"), [
    ({}, MAMBA + ATTENTION + DENSE + MOE, 2 * 5 + 7),
    ({"hybrid_override_pattern": "MMMM"}, 4 * MAMBA, 0),
    ({"hybrid_override_pattern": "-*-", "intermediate_size": [6, 9]}, 2 * 8 * 6 + ATTENTION + 2 * 8 * 9, 9),
    ({"use_conv_bias": False}, MAMBA - 12 + ATTENTION + DENSE + MOE, 17),
    ({"moe_latent_size": 4}, MAMBA + ATTENTION + DENSE + ROUTER + 3 * 2 * 4 * 5 + 2 * 8 * 7 + 2 * 8 * 4, 17),
])
def test_each_block_counts_as_vllm_builds_it(change: dict, linear: int, width: int) -> None:
    params = nemotron_h_params({**SMALL, **change})
    assert params is not None
    assert params.linear == linear and params.mlp_width == width


def test_the_count_keeps_the_experts_without_a_gate() -> None:
    count = count_weights(SMALL)
    assert count is not None
    assert count.linear_params == MAMBA + ATTENTION + DENSE + MOE and count.attention_params == ATTENTION
    assert count.router_params == ROUTER and count.expert_matrices == 3 and count.matrices_per_expert == 2
    assert count.routed_expert_params == 3 * 2 * 8 * 5
    assert count.embedding_params == 2 * 10 * 8   # untied


@pytest.mark.parametrize("change", [
    {"hybrid_override_pattern": None}, {"hybrid_override_pattern": 7}, {"hybrid_override_pattern": ""},
    {"hidden_size": "x"}, {"model_type": "llama"},
])
def test_a_config_that_is_not_nemotron_h_is_left_to_the_generic_count(change: dict) -> None:
    assert nemotron_h_params({**SMALL, **change}) is None


def test_nemotron_3_nano_counts_its_published_size() -> None:
    """Nemotron-3-Nano-30B-A3B (the GB10 start-up of the corpus): 31.6 B parameters as NVIDIA publishes
    them; kvwatch counted 102 B (every layer as attention and 128 experts) and planned no KV cache."""
    run = next(r for r in all_runs() if r["name"] == "search_nemotron3_nano_30b_a3b_gb10_u080_v0202")
    count = count_weights(model_config(run))
    assert count is not None
    assert 31.4e9 < count.params < 31.8e9
