"""The rotary cos/sin cache and the model-file buffers loaded with the weights (vllm_releases/rope_cache.py)."""
from __future__ import annotations

import pytest

from kvwatch.errors import ConfigError
from kvwatch.vllm_releases.rope_cache import cache_positions, deepstack_levels, rope_cache_elements, rotary_dim

LLAMA_31 = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}}
QWEN3_VL_TEXT = {"model_type": "qwen3_vl_moe_text", "hidden_size": 2048, "num_attention_heads": 32, "head_dim": 128,
                 "max_position_embeddings": 262144}
DEEPSEEK_R1 = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "max_position_embeddings": 163840,
               "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}}
QWEN3_NEXT = {"model_type": "qwen3_next", "hidden_size": 2048, "num_attention_heads": 16, "head_dim": 256,
              "partial_rotary_factor": 0.25, "max_position_embeddings": 262144, "rope_scaling": None}


@pytest.mark.parametrize(("cfg", "multimodal", "positions", "dim"), [
    (LLAMA_31, False, 131072, 128),                     # llama3: the base class's cache over max_position
    (QWEN3_VL_TEXT, True, 4 * 262144, 128),             # M-RoPE: four times the positions
    ({**QWEN3_VL_TEXT, "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20]}}, False,
     4 * 262144, 128),                                  # mrope_section in the config says the same
    (QWEN3_VL_TEXT, False, 262144, 128),                # the same text config outside a VL checkpoint
    (DEEPSEEK_R1, False, 4096 * 40, 64),                # YaRN: the original length x factor; MLA's rope part
    (QWEN3_NEXT, False, 262144, 64),                    # partial rotary
    # transformers 5 keeps the factor in rope_parameters only (Qwen3.5/3.6), where get_rope reads it
    ({**QWEN3_NEXT, "partial_rotary_factor": None, "rope_scaling": None, "rope_parameters": {
        "rope_type": "default", "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25}}, False, 4 * 262144, 64),
    ({**QWEN3_NEXT, "partial_rotary_factor": None, "rope_parameters": {"rope_type": "default", "rope_dim": 32}},
     False, 262144, 32),                                # an explicit rope_dim wins
    ({**LLAMA_31, "rope_scaling": None, "rotary_emb_fraction": 0.5}, False, 131072, 64),   # a legacy name
    ({**LLAMA_31, "rope_scaling": {"type": "linear", "factor": 4.0}}, False, 4 * 131072, 128),
    # no length in the file: the class's default (LlamaConfig's 2048), which is what vLLM's model sees
    ({**LLAMA_31, "rope_scaling": None, "max_position_embeddings": None}, False, 2048, 128),
    ({**LLAMA_31, "model_type": "unknown_family", "rope_scaling": None, "max_position_embeddings": None}, False,
     8192, 128),                                        # no class known: the models' getattr fall-back
    ({"model_type": "gpt2", "hidden_size": 768, "num_attention_heads": 12, "max_position_embeddings": 1024},
     False, 0, 64),                                     # learned positions: no rotary cache
    ({"model_type": "bloom", "hidden_size": 1024, "num_attention_heads": 16}, False, 0, 64),   # ALiBi
])
def test_the_rotary_cache_holds_the_positions_its_scaling_type_computes(cfg: dict, multimodal: bool, positions: int,
                                                                        dim: int) -> None:
    assert cache_positions(cfg, multimodal) == positions
    assert rotary_dim(cfg) == dim
    assert rope_cache_elements(cfg, multimodal) == positions * dim


def test_llama_31s_cache_is_the_32_mib_its_logged_weights_carry() -> None:
    """Every Llama-3.1-8B start-up of the corpus logs 14.99 GiB of weights, 0.033 above the checkpoint's tensors."""
    assert rope_cache_elements(LLAMA_31) * 2 == 32 * 2**20


@pytest.mark.parametrize(("config", "levels"), [
    ({"model_type": "qwen3_vl_moe", "vision_config": {"deepstack_visual_indexes": [8, 16, 24]}}, 3),
    ({"model_type": "qwen3_vl", "vision_config": {"deepstack_visual_indexes": [5, 11, 17]}}, 3),
    ({"model_type": "qwen2_5_vl", "vision_config": {"depth": 32}}, 0),
    ({"model_type": "llama"}, 0),
])
def test_only_qwen3_vl_allocates_deepstack_buffers(config: dict, levels: int) -> None:
    assert deepstack_levels(config) == levels


GEMMA3_TEXT = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
               "max_position_embeddings": 131072, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}


@pytest.mark.parametrize(("cfg", "elements"), [
    # google/gemma-3-4b-it's text_config: the global layers' linear x8 cache, the sliding layers' own unscaled one
    (GEMMA3_TEXT, 8 * 131072 * 256 + 131072 * 256),
    # the same in transformers 5's form, one set per layer type
    ({**GEMMA3_TEXT, "rope_scaling": None, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, 8 * 131072 * 256 + 131072 * 256),
    # Gemma 4: the full layers rotate a quarter of their global head size
    ({"model_type": "gemma4_text", "hidden_size": 5376, "num_attention_heads": 32, "head_dim": 256,
      "global_head_dim": 512, "max_position_embeddings": 262144, "rope_parameters": {
          "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, 262144 * 128 + 262144 * 256),
    # OLMo 3's two layer types share one set: get_rope builds one cache
    ({"model_type": "olmo3", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 65536,
      "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
                          "full_attention": {"rope_type": "default", "rope_theta": 5e5}}}, 65536 * 128),
    # a Gemma 3 file without rope_scaling (the 1B): both unscaled, still two bases
    ({**GEMMA3_TEXT, "rope_scaling": None}, 131072 * 256 * 2),
    # one set: Gemma 2 has no per-layer-type parameters
    ({"model_type": "gemma2", "hidden_size": 3584, "num_attention_heads": 16, "head_dim": 256,
      "max_position_embeddings": 8192}, 8192 * 256),
])
def test_a_model_whose_layer_types_rotate_differently_builds_one_cache_per_type(cfg: dict, elements: int) -> None:
    assert rope_cache_elements(cfg) == elements


def test_a_text_config_without_positions_takes_its_class_default() -> None:
    """google/gemma-3-*-it's text_config names no max_position_embeddings: transformers' Gemma3TextConfig fills
    131,072 (the generated class defaults), which vLLM's model passes to get_rope (models/gemma3.py:227)."""
    without = {k: v for k, v in GEMMA3_TEXT.items() if k != "max_position_embeddings"}
    assert cache_positions(without) == 8 * 131072
    assert rope_cache_elements(without) == rope_cache_elements(GEMMA3_TEXT)


def test_a_rotary_factor_above_one_is_refused_as_get_rope_refuses_it() -> None:
    with pytest.raises(ConfigError, match="partial_rotary_factor=7"):
        rotary_dim({**QWEN3_NEXT, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 7}})
