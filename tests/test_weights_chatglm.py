"""ChatGLM / GLM-4 (model_type chatglm) as vLLM 0.32.0 reads and builds it (kvwatch/planner/config_keys.py):
its own ChatGLMConfig names the layers num_layers and the MLP ffn_hidden_size; the KV heads are
multi_query_group_num only under multi_query_attention (models/chatglm.py:60-65); the embedding and the LM
head have padded_vocab_size rows (:329-346). kvwatch read no intermediate_size (4 x hidden) and a KV head per
query head: +27.4 % on THUDM/glm-4-9b-chat (tests/fixtures/models/full_configs.json)."""
from __future__ import annotations

import pytest

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import standard_keys
from kvwatch.planner.geometry import geometry_from_config

GLM = {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "hidden_size": 256, "num_layers": 2,
       "num_attention_heads": 4, "kv_channels": 64, "ffn_hidden_size": 96, "padded_vocab_size": 320,
       "multi_query_attention": True, "multi_query_group_num": 2, "seq_length": 4096,
       "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("change", "kv_heads", "vocab"), [
    ({}, 2, 320),
    ({"multi_query_attention": False}, 4, 320),      # groups ignored without multi-query attention
    ({"multi_query_attention": None}, 4, 320),       # absent: the class default, off
    ({"vocab_size": 300}, 2, 320),                   # the padded table is what vLLM builds
    ({"padded_vocab_size": None, "vocab_size": 300}, 2, 300),
])
def test_the_keys_vllm_reads(change: dict, kv_heads: int, vocab: int) -> None:
    cfg = {k: v for k, v in {**GLM, **change}.items() if v is not None}
    keys = standard_keys(cfg)
    assert (keys["num_key_value_heads"], keys["vocab_size"], keys["intermediate_size"], keys["num_hidden_layers"]) \
        == (kv_heads, vocab, 96, 2)


def test_the_shrunk_model_counts_what_vllm_builds() -> None:
    geometry = geometry_from_config(GLM)
    head = 256 // 4   # vLLM's head_dim is hidden / heads (chatglm.py:75)
    attention = 256 * (4 + 2 * 2) * head + 4 * head * 256   # query_key_value (2 KV groups) and dense
    mlp = 3 * 256 * 96                                       # dense_h_to_4h (two halves) and dense_4h_to_h
    assert geometry.weight_count is not None
    assert geometry.weight_count.params == 2 * (attention + mlp) + 2 * 320 * 256
    assert (geometry.num_kv_heads, geometry.head_size, geometry.num_layers) == (2, 64, 2)


@pytest.mark.parametrize("bad", ["lots", -1, True, 1.5])
def test_a_padded_vocabulary_that_is_not_a_count_is_one_clear_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="padded_vocab_size"):
        standard_keys({**GLM, "padded_vocab_size": bad})
