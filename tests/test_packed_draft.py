"""The weights of Step5's, GLM-5-Next's and Qwen4-Exp's MTP drafts come out of the KV budget (issues 38, 39).

planner/packed_draft.py counts what each draft head loads beside the target, as vLLM 0.34.0 builds it
(its docstring cites the modules); a plan that drafts with the head and estimates the KV memory (no
--kv-cache-memory-bytes) gives the KV cache exactly those weights' bytes per rank less.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import ModelGeometry, geometry_from_config
from kvwatch.planner.packed_draft import DOTS3, GLM5_NEXT, QWEN4_EXP, STEP5, DraftHead, dspark_weights, head_weights
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.weights import WeightCount, gpu_weights_bytes, replicated_linear_bytes
from kvwatch.values.versions import parse_version
from tests.fixtures.models.newest import NEWEST

MODELS = Path(__file__).resolve().parent / "fixtures" / "models"
H, HEADS, HEAD_DIM, KV_HEADS, WIDTH, VOCAB = 64, 4, 16, 2, 96, 1000
ATTENTION = 2 * H * HEADS * HEAD_DIM + 2 * H * KV_HEADS * HEAD_DIM   # q, o, k, v
DENSE = {"hidden_size": H, "num_attention_heads": HEADS, "head_dim": HEAD_DIM, "num_key_value_heads": KV_HEADS,
         "intermediate_size": WIDTH, "vocab_size": VOCAB, "num_hidden_layers": 30}
EXPERTS, MOE_WIDTH = 8, 32
MOE = {**DENSE, "n_routed_experts": EXPERTS, "moe_intermediate_size": MOE_WIDTH, "num_experts_per_tok": 2}
MOE_LAYER = ATTENTION + EXPERTS * 3 * H * MOE_WIDTH + H * EXPERTS   # attention, experts, router

# (config, layers, head) -> (linear params, of them held whole and unquantized, embedding/LM head params)
CASES: dict[str, tuple[dict[str, Any], int, DraftHead, tuple[int, int, int]]] = {
    # Step5: dense layers whatever the experts, an nn.Linear eh_proj and a ParallelLMHead per layer
    "Step5, 2 layers": (DENSE, 2, STEP5, (2 * (ATTENTION + 3 * H * WIDTH) + 2 * 2 * H * H, 2 * 2 * H * H, 2 * VOCAB * H)),
    "Step5, experts in the config, 1 layer": (MOE, 1, STEP5, (ATTENTION + 3 * H * WIDTH + 2 * H * H, 2 * H * H, VOCAB * H)),
    # GLM-5-Next: the target's MoE layer and an nn.Linear eh_proj per layer, no LM head
    "GLM-5-Next, 3 layers": (MOE, 3, GLM5_NEXT, (3 * MOE_LAYER + 3 * 2 * H * H, 3 * H * EXPERTS + 3 * 2 * H * H, 0)),
    # Qwen4-Exp: fc_embedding and fc_hidden once (split, quantized), no LM head
    "Qwen4-Exp, 1 layer": (MOE, 1, QWEN4_EXP, (MOE_LAYER + 2 * H * H, H * EXPERTS, 0)),
    "Qwen4-Exp, 2 layers": (MOE, 2, QWEN4_EXP, (2 * MOE_LAYER + 2 * H * H, 2 * H * EXPERTS, 0)),
    # Dots3: the target's MoE layer and a ReplicatedLinear eh_proj (quantized, whole) per layer, its own embedding
    "Dots3, 2 layers": (MOE, 2, DOTS3, (2 * MOE_LAYER + 2 * 2 * H * H, 2 * H * EXPERTS, VOCAB * H)),
    "no layer": (DENSE, 0, GLM5_NEXT, (0, 0, 0)),
}


@pytest.mark.parametrize("name", CASES)
def test_each_heads_parameters(name: str) -> None:
    cfg, layers, head, (linear, whole, embedding) = CASES[name]
    count = head_weights(cfg, layers, head)
    got = (0, 0, 0) if count is None else (count.linear_params, count.router_params, count.embedding_params)
    assert got == (linear, whole, embedding)
    if count is not None:   # only Dots3's projection is a quantized layer held whole
        assert count.replicated_linear_params == (2 * layers * H * H if head is DOTS3 else 0)


RANK, TARGETS, HEAD_DIM_V4 = 16, 3, 32
DSPARK = {**MOE, "dspark_markov_rank": RANK, "dspark_target_layer_ids": [5, 6, 7], "head_dim": HEAD_DIM_V4}
ATTENTION_V4 = 2 * H * HEADS * HEAD_DIM_V4 + 2 * H * KV_HEADS * HEAD_DIM_V4
MOE_LAYER_V4 = ATTENTION_V4 + EXPERTS * 3 * H * MOE_WIDTH + H * EXPERTS
# DSpark: MoE layers; main_proj and context_wkv_proj whole on every rank (quantized); the Markov head's two
# vocab x rank matrices whole and unquantized; (layers) -> (linear, whole unquantized, whole quantized)
DSPARK_CASES = {
    "3 layers (the default)": (DSPARK, 3, (3 * MOE_LAYER_V4 + TARGETS * H * H + 3 * H * HEAD_DIM_V4 + 2 * VOCAB * RANK,
                                           3 * H * EXPERTS + 2 * VOCAB * RANK, TARGETS * H * H + 3 * H * HEAD_DIM_V4)),
    "1 layer, a draft vocabulary of 500": ({**DSPARK, "draft_vocab_size": 500}, 1,
                                           (MOE_LAYER_V4 + TARGETS * H * H + H * HEAD_DIM_V4 + (VOCAB + 500) * RANK,
                                            H * EXPERTS + (VOCAB + 500) * RANK, TARGETS * H * H + H * HEAD_DIM_V4)),
}


@pytest.mark.parametrize("name", DSPARK_CASES)
def test_dspark_parameters(name: str) -> None:
    cfg, layers, want = DSPARK_CASES[name]
    count = dspark_weights(cfg, layers)
    assert count is not None
    assert (count.linear_params, count.router_params, count.replicated_linear_params) == want
    assert count.embedding_params == 0   # the target's embedding and LM head


def _config(name: str, **change: Any) -> dict[str, Any]:
    return {**json.loads((MODELS / f"{name}_config.json").read_text()), **change}


DRAFTS = {
    "Step5, 1 MTP layer, TP 1": (_config("step5", num_nextn_predict_layers=1), 1),
    "Step5, 2 MTP layers, TP 2": (_config("step5", num_nextn_predict_layers=2), 2),
    "GLM-5-Next, 1 MTP layer, TP 8": (_config("glm5_next", model_type="glm5_next", num_nextn_predict_layers=1), 8),
    "Qwen4-Exp, 1 MTP layer, TP 1": (_config("qwen4_exp"), 1),
    "Qwen4-Exp, 1 MTP layer, TP 2": (_config("qwen4_exp"), 2),
    # The fixture is vLLM's Dots3NoteConfig with no hidden_size: DeepseekV3Config's defaults, which it inherits
    # (transformers' configuration_deepseek_v3.py), give the shapes the weights need.
    "Dots3, 1 MTP layer, TP 8": (_config("dots3_note", hidden_size=7168, vocab_size=129280, intermediate_size=18432,
                                         moe_intermediate_size=2048, n_shared_experts=1), 8),
    "DeepSeek-V4-Flash, DSpark, TP 2": (NEWEST["deepseek_v4_flash"]["config"], 2),
    "DeepSeek-V4.1-Flash, DSpark, TP 4": (NEWEST["deepseek_v41_flash"]["config"], 4),
}
MTP = ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
DSPARK_FLAGS = ("--speculative-config", '{"method": "dspark", "num_speculative_tokens": 3}')


def _plan(geometry: ModelGeometry, tp: int, *flags: str) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", "--tensor-parallel-size", str(tp), "--max-model-len", "8192",
                                    *flags]).settings()
    return make_plan(geometry, settings, preset("h200"), ruleset_for("0.34.0"),
                     MemoryInputs(vllm_version=parse_version("0.34.0")))


def _per_rank(draft: WeightCount, geometry: ModelGeometry, tp: int) -> int:
    """The draft's weights (bf16, or the checkpoint's quantization) on one rank: an even share of every
    parameter, and the parts every rank holds whole (nn.Linear projections, MoE routers, the Markov head,
    replicated projections) in full."""
    whole = 2 * draft.router_params + replicated_linear_bytes(draft, geometry.quantization, 2)
    return gpu_weights_bytes(draft, geometry.quantization, 2) // tp + whole - whole // tp


@pytest.mark.parametrize("name", DRAFTS)
def test_the_kv_budget_shrinks_by_the_drafts_weights_per_rank(name: str) -> None:
    cfg, tp = DRAFTS[name]
    geometry = geometry_from_config(cfg, "0.34.0")
    draft = geometry.packed_draft
    assert draft is not None and draft.linear_params > 0
    flags = DSPARK_FLAGS if geometry.deepseek_v4 is not None else MTP   # DeepSeek-V4/V4.1: the DSpark draft
    with_draft, without = _plan(geometry, tp, *flags), _plan(replace(geometry, packed_draft=None), tp, *flags)
    assert with_draft.gpu_budget is not None and without.gpu_budget is not None
    assert with_draft.gpu_budget.weights_bytes - without.gpu_budget.weights_bytes == _per_rank(draft, geometry, tp)
    assert with_draft.kv_memory_bytes > 0
    assert without.kv_memory_bytes - with_draft.kv_memory_bytes == _per_rank(draft, geometry, tp)


@pytest.mark.parametrize("name", DRAFTS)
def test_without_the_draft_the_weights_are_the_targets(name: str) -> None:
    """No draft, n-gram matching (no draft model), and for DeepSeek-V4 its own MTP head (not this draft)."""
    cfg, tp = DRAFTS[name]
    geometry = geometry_from_config(cfg, "0.34.0")
    others = [(), ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 1}'),
              *([MTP] if geometry.deepseek_v4 is not None else [])]
    target = _plan(replace(geometry, packed_draft=None), tp).gpu_budget
    assert target is not None and target.weights_bytes > 0
    for flags in others:
        budget = _plan(geometry, tp, *flags).gpu_budget
        assert budget is not None and budget.weights_bytes == target.weights_bytes, flags
