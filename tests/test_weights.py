"""Weights from config.json: parameter counts of public models, tied embeddings, quantization."""
from __future__ import annotations

import pytest

from kvwatch.planner.weights import count_weights, linear_bytes_per_param, weights_bytes

GiB = 2**30
LLAMA_3_1_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False}
QWEN_2_5_7B = {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
               "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False}
LLAMA_3_2_1B = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True}


@pytest.mark.parametrize("cfg,published", [
    (LLAMA_3_1_8B, 8.03e9),    # meta-llama/Llama-3.1-8B model card: 8.03B
    (QWEN_2_5_7B, 7.61e9),     # Qwen/Qwen2.5-7B: 7.61B (biases of q/k/v left out: 0.1 M)
    (LLAMA_3_2_1B, 1.24e9),    # meta-llama/Llama-3.2-1B: 1.23B, embeddings tied
])
def test_parameter_counts_match_the_published_ones(cfg: dict, published: float) -> None:
    count = count_weights(cfg)
    assert count is not None and abs(count.params - published) / published < 0.005


def test_gqa_is_not_counted_as_full_attention() -> None:
    full = count_weights({**LLAMA_3_1_8B, "num_key_value_heads": 32})
    gqa = count_weights(LLAMA_3_1_8B)
    assert full is not None and gqa is not None
    assert full.linear_params - gqa.linear_params == 32 * 2 * 4096 * (32 - 8) * 128


def test_tied_embeddings_count_once() -> None:
    tied = count_weights(LLAMA_3_2_1B)
    untied = count_weights({**LLAMA_3_2_1B, "tie_word_embeddings": False})
    assert tied is not None and untied is not None
    assert untied.embedding_params == 2 * tied.embedding_params == 2 * 128256 * 2048


def test_quantization_shrinks_the_linear_layers_only() -> None:
    bf16 = weights_bytes(LLAMA_3_1_8B, 2)
    fp8 = weights_bytes({**LLAMA_3_1_8B, "quantization_config": {"quant_method": "fp8"}}, 2)
    awq = weights_bytes({**LLAMA_3_1_8B, "quantization_config": {"quant_method": "awq", "bits": 4,
                                                                  "group_size": 128}}, 2)
    assert bf16 is not None and fp8 is not None and awq is not None
    assert 14.9 * GiB < bf16 < 15.0 * GiB
    assert 8.4 * GiB < fp8 < 8.5 * GiB          # the FP8 8B checkpoints load as ~8.5 GiB
    assert 5.2 * GiB < awq < 5.4 * GiB
    assert linear_bytes_per_param({"quant_method": "bitsandbytes", "load_in_8bit": True}, 2) == 1.0
    assert linear_bytes_per_param(None, 2) == 2.0


def test_a_config_without_shapes_has_no_estimate() -> None:
    assert count_weights({"num_hidden_layers": 2}) is None
