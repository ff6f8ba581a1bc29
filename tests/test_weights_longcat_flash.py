"""LongCat-Flash's blocks as vLLM 0.32.0 builds them (kvwatch/planner/longcat_flash_weights.py): each of
config.json's num_layers blocks holds two MLA attentions (two KV caches) and two dense MLPs beside one MoE
whose router also scores the zero experts. Before this kvwatch refused the published config outright
(config.json: missing field 'num_hidden_layers'): the file names num_layers, ffn_hidden_size and
expert_ffn_hidden_size, which transformers answers as the standard keys."""
from __future__ import annotations

import pytest

from kvwatch.planner.config_keys import standard_keys
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.longcat_flash_weights import flash_blocks, longcat_flash_keys
from kvwatch.planner.weights import count_weights

# A shrunk LongCat-Flash config: 2 blocks of hidden 64, 4 MLA heads, 8 experts of 16 and 4 zero experts.
SHRUNK = {"architectures": ["LongcatFlashForCausalLM"], "model_type": "longcat_flash", "attention_method": "MLA",
          "vocab_size": 128, "hidden_size": 64, "ffn_hidden_size": 48, "expert_ffn_hidden_size": 16,
          "num_layers": 2, "num_attention_heads": 4, "kv_lora_rank": 32, "q_lora_rank": 48,
          "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "n_routed_experts": 8,
          "zero_expert_num": 4, "zero_expert_type": "identity", "moe_topk": 2, "routed_scaling_factor": 6.0,
          "mla_scale_q_lora": True, "mla_scale_kv_lora": True, "rope_theta": 10000000.0,
          "max_position_embeddings": 4096, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
          "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("change", "keys"), [
    ({}, {"num_hidden_layers": 4, "intermediate_size": 48, "moe_intermediate_size": 16}),
    # the standard names the file states win, but num_hidden_layers is always the class's 2 x num_layers
    ({"intermediate_size": 40, "moe_intermediate_size": 8, "num_hidden_layers": 2},
     {"num_hidden_layers": 4, "intermediate_size": 40, "moe_intermediate_size": 8}),
    # no num_layers: transformers' setter halves num_hidden_layers into it
    ({"num_layers": None, "num_hidden_layers": 6}, {"num_hidden_layers": 6}),
])
def test_the_standard_keys_transformers_answers(change: dict, keys: dict) -> None:
    out = longcat_flash_keys({**SHRUNK, **change})
    assert {key: out[key] for key in keys} == keys


def test_the_block_shape() -> None:
    blocks = flash_blocks(standard_keys(SHRUNK))
    assert blocks is not None and (blocks.blocks, blocks.sublayers, blocks.router_outputs) == (2, 4, 12)
    assert flash_blocks({"model_type": "deepseek_v3", "num_hidden_layers": 4}) is None


def test_the_shrunk_model_counts_what_vllms_class_builds() -> None:
    """vLLM 0.32.0's LongcatFlashForCausalLM on the meta device holds 186,776 parameters for SHRUNK, 920 of
    them norms and the routers' score-correction biases (scripts/oracle_param_counts.py); kvwatch counts the
    rest exactly."""
    embeddings = 2 * 128 * 64
    mla = 64 * (48 + 32 + 16) + 48 * 4 * 32 + 32 * 4 * (16 + 16) + 4 * 16 * 64   # q_a/kv_a, q_b, kv_b, o_proj
    per_block = 2 * mla + 2 * 3 * 64 * 48 + 8 * 3 * 64 * 16 + 64 * 12   # two attentions and MLPs, experts, router
    count = count_weights(standard_keys(SHRUNK))
    assert count is not None and count.params == embeddings + 2 * per_block == 186_776 - 920
    assert count.router_params == 2 * 64 * 12 and count.expert_matrices == 2 * 8
    assert count.replicated_linear_params == 4 * 64 * (48 + 32 + 16)


def test_the_kv_cache_has_two_mla_layers_per_block() -> None:
    geometry = geometry_from_config(SHRUNK)
    assert (geometry.attention, geometry.num_layers, geometry.head_size) == ("mla", 4, 32 + 16)
