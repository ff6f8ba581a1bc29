"""Step3's text decoder as vLLM 0.32.0 builds it (kvwatch/planner/step3_text_weights.py): a low-rank query
beside one KV head, experts only on the layers moe_layers_enum names, a shared MLP of share_expert_dim
beside them. Before this kvwatch counted 64 KV heads' k and v, a full-width q, experts on all 61 layers and
no shared MLP: +11.6 % on the full-size config (tests/fixtures/models/full_configs.json "Step3 text")."""
from __future__ import annotations

import pytest

from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.step3_text_weights import step3_attention, step3_moe_layers
from kvwatch.planner.weights import count_weights

# A shrunk Step3 text config: 3 layers of hidden 64, 4 heads of 16, share_q_dim 32, experts on layers 1-2.
SHRUNK = {"architectures": ["Step3TextForCausalLM"], "model_type": "step3_text", "hidden_size": 64,
          "intermediate_size": 40, "num_attention_heads": 4, "num_attention_groups": 1, "num_hidden_layers": 3,
          "vocab_size": 128, "moe_intermediate_size": 8, "moe_num_experts": 4, "moe_top_k": 2,
          "share_expert_dim": 24, "share_q_dim": 32, "head_dim": 16, "moe_layers_enum": "1,2",
          "max_position_embedding": 4096, "max_seq_len": 4096, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("field", "value", "layers"), [
    ("moe_layers_enum", "0,2", [0, 2]),                  # the published form: a comma-separated string
    ("moe_layers_enum", " 1, 2 ,", [1, 2]),              # spaces and a trailing comma, as str.split reads them
    ("moe_layers_enum", [2, 1], [1, 2]),                 # a list (vLLM's class default is a tuple)
    ("moe_layers_enum", "1,2,99", [1, 2]),               # an index past the last layer builds nothing
    ("moe_layers_enum", None, [1, 2]),                   # absent: every layer but the first (step3_text.py:253-254)
])
def test_the_moe_layers_are_the_ones_moe_layers_enum_names(field: str, value: object, layers: list[int]) -> None:
    assert step3_moe_layers({**SHRUNK, field: value}, 3) == layers


@pytest.mark.parametrize(("hidden", "heads", "head_dim", "share_q", "per_layer", "replicated"), [
    # the published shape: qkv 7168 x (2048 + 2 x 256), wq 2048 x 64 x 256, o_proj 64 x 256 x 7168
    (7168, 64, 256, 2048, 7168 * 2560 + 2048 * 16384 + 16384 * 7168, 7168 * 2560),
    (64, 4, 16, 32, 64 * 64 + 32 * 64 + 64 * 64, 64 * 64),
    (64, 4, 16, None, 64 * 48 + 16 * 64 + 64 * 64, 64 * 48),   # no share_q_dim: q is head_dim wide (:169)
])
def test_one_layer_of_attention(hidden: int, heads: int, head_dim: int, share_q: int | None, per_layer: int,
                                replicated: int) -> None:
    cfg = {"model_type": "step3_text", "share_q_dim": share_q}
    attention = step3_attention(cfg, hidden, heads, head_dim)
    assert attention is not None and (attention.per_layer, attention.replicated) == (per_layer, replicated)


def test_the_shrunk_decoder_counts_what_vllms_class_builds() -> None:
    """vLLM 0.32.0's Step3TextForCausalLM on the meta device holds 77,344 parameters for SHRUNK, 544 of them
    norms (scripts/oracle_param_counts.py); kvwatch counts the rest exactly."""
    embeddings = 2 * 128 * 64                                  # embed_tokens and its own lm_head
    attention = 3 * (64 * 64 + 32 * 64 + 64 * 64)              # qkv_proj, wq, o_proj
    dense = 3 * 64 * 40                                        # layer 0's MLP
    moe = 2 * (4 * 3 * 64 * 8 + 64 * 4 + 3 * 64 * 24)          # experts, router, shared MLP on layers 1-2
    count = count_weights(SHRUNK)
    assert count is not None and count.params == embeddings + attention + dense + moe == 77_344 - 544
    assert count.replicated_linear_params == 3 * 64 * 64 and count.expert_matrices == 2 * 4


def test_the_kv_cache_is_one_head_per_layer() -> None:
    geometry = geometry_from_config(SHRUNK)
    assert (geometry.num_kv_heads, geometry.head_size, geometry.num_layers) == (1, 16, 3)


def test_another_family_is_left_alone() -> None:
    assert step3_attention({"model_type": "step5", "share_q_dim": 32}, 64, 4, 16) is None
    assert step3_moe_layers({"model_type": "step5", "moe_layers_enum": "1"}, 3) is None
