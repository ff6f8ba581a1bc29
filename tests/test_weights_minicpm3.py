"""MiniCPM3's MLA value head (kvwatch/planner/config_defaults.py V_HEAD_DIM_FROM_HIDDEN): openbmb/MiniCPM3-4B's
config.json states no v_head_dim and transformers' MiniCPM3Config derives it as hidden_size / heads, the
width vLLM 0.32.0 builds kv_b_proj's value half and o_proj at (models/minicpm3.py:105-116). kvwatch read
0 and missed both: -11.0 % on the full-size config (tests/fixtures/models/full_configs.json "MiniCPM3-4B")."""
from __future__ import annotations

import pytest

from kvwatch.planner.weights import count_weights

MLA = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
       "intermediate_size": 64, "vocab_size": 128, "q_lora_rank": 32, "kv_lora_rank": 16,
       "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "tie_word_embeddings": True}


@pytest.mark.parametrize(("model_type", "stated", "value_head"), [
    ("minicpm3", None, 256 // 4),   # absent: the class's hidden_size / heads
    ("minicpm3", 32, 32),           # stated: the file wins
    ("deepseek_v3", None, 0),       # a class that fixes a constant: the published files state it
])
def test_the_value_head_vllm_builds(model_type: str, stated: int | None, value_head: int) -> None:
    cfg = {**MLA, "model_type": model_type, **({"v_head_dim": stated} if stated else {})}
    count = count_weights(cfg)
    assert count is not None and count.mla_shape is not None and count.mla_shape[5] == value_head
    kv_b_and_o = 16 * 4 * (8 + value_head) + 4 * value_head * 256
    q = 256 * 32 + 32 * 4 * 16
    assert count.attention_params == 2 * (q + 256 * (16 + 8) + kv_b_and_o)


def test_the_kv_cache_holds_heads_as_wide_as_q_and_k() -> None:
    """vLLM 0.32.0's MiniCPM3 attention (models/minicpm3.py:126-133) caches 40 KV heads of
    qk_nope_head_dim + qk_rope_head_dim = 96 per layer for openbmb/MiniCPM3-4B (its value padded to 96,
    :172-175; read off the class built on the meta device), not hidden / heads = 64: kvwatch planned a third
    fewer bytes per token before."""
    from kvwatch.planner.geometry import geometry_from_config
    cfg = {**MLA, "architectures": ["MiniCPM3ForCausalLM"], "model_type": "minicpm3"}
    geometry = geometry_from_config(cfg)
    assert (geometry.attention, geometry.num_kv_heads, geometry.head_size, geometry.head_size_v) == ("full", 4, 16, 16)
    defaults = geometry_from_config({k: v for k, v in cfg.items() if not k.startswith("qk_")})
    assert defaults.head_size == 64 + 32   # MiniCPM3Config's defaults (configuration_minicpm3.py:111-112)
