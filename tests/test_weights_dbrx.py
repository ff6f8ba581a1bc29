"""DBRX (model_type dbrx) as transformers names its keys and vLLM 0.32.0 builds it (kvwatch/planner/
config_keys.py): d_model, n_heads, n_layers and max_seq_len at the top level, the KV heads in attn_config
and the experts in ffn_config, each section's class filling what the file leaves out. kvwatch refused
databricks/dbrx-instruct's config.json outright before ("missing field 'num_hidden_layers'")."""
from __future__ import annotations

import pytest

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import standard_keys
from kvwatch.planner.geometry import geometry_from_config

DBRX = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 256, "n_heads": 4, "n_layers": 2,
        "max_seq_len": 4096, "vocab_size": 320, "tie_word_embeddings": False,
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2}}


@pytest.mark.parametrize(("change", "keys"), [
    ({}, {"num_key_value_heads": 2, "intermediate_size": 96, "num_local_experts": 4, "num_experts_per_tok": 2}),
    # a section left out: DbrxAttentionConfig's and DbrxFFNConfig's defaults (configuration_dbrx.py:42, :74-76)
    ({"attn_config": None, "ffn_config": None},
     {"num_key_value_heads": 1, "intermediate_size": 3584, "num_local_experts": 4, "num_experts_per_tok": 1}),
    ({"ffn_config": {"moe_num_experts": 16}}, {"num_local_experts": 16, "num_experts_per_tok": 1}),
])
def test_the_keys_vllm_reads(change: dict, keys: dict) -> None:
    out = standard_keys({k: v for k, v in {**DBRX, **change}.items() if v is not None})
    assert {key: out[key] for key in keys} == keys
    assert (out["hidden_size"], out["num_attention_heads"], out["num_hidden_layers"]) == (256, 4, 2)


def test_the_shrunk_model_counts_what_vllm_builds() -> None:
    geometry = geometry_from_config(DBRX)
    head = 256 // 4
    attention = 256 * (4 + 2 * 2) * head + 256 * 256               # Wqkv (2 KV heads) and out_proj (dbrx.py:209-224)
    experts = 4 * 3 * 256 * 96 + 256 * 4                           # w1, v1, w2 of each expert and the router
    assert geometry.weight_count is not None
    assert geometry.weight_count.params == 2 * (attention + experts) + 2 * 320 * 256
    assert (geometry.num_kv_heads, geometry.head_size, geometry.num_layers) == (2, 64, 2)


@pytest.mark.parametrize(("section", "bad"), [("attn_config", {"kv_n_heads": "eight"}),
                                              ("ffn_config", {"ffn_hidden_size": -96}),
                                              ("ffn_config", {"moe_top_k": 2.5})])
def test_a_nested_size_that_is_not_a_count_is_one_clear_error(section: str, bad: dict) -> None:
    with pytest.raises(ConfigError, match=f"DBRX's {section}"):
        standard_keys({**DBRX, section: bad})
