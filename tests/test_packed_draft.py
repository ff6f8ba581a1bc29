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
from kvwatch.planner.packed_draft import GLM5_NEXT, QWEN4_EXP, STEP5, DraftHead, head_weights
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.weights import WeightCount
from kvwatch.values.versions import parse_version

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
    "no layer": (DENSE, 0, GLM5_NEXT, (0, 0, 0)),
}


@pytest.mark.parametrize("name", CASES)
def test_each_heads_parameters(name: str) -> None:
    cfg, layers, head, (linear, whole, embedding) = CASES[name]
    count = head_weights(cfg, layers, head)
    got = (0, 0, 0) if count is None else (count.linear_params, count.router_params, count.embedding_params)
    assert got == (linear, whole, embedding)


def _config(name: str, **change: Any) -> dict[str, Any]:
    return {**json.loads((MODELS / f"{name}_config.json").read_text()), **change}


DRAFTS = {
    "Step5, 1 MTP layer, TP 1": (_config("step5", num_nextn_predict_layers=1), 1),
    "Step5, 2 MTP layers, TP 2": (_config("step5", num_nextn_predict_layers=2), 2),
    "GLM-5-Next, 1 MTP layer, TP 8": (_config("glm5_next", model_type="glm5_next", num_nextn_predict_layers=1), 8),
    "Qwen4-Exp, 1 MTP layer, TP 1": (_config("qwen4_exp"), 1),
    "Qwen4-Exp, 1 MTP layer, TP 2": (_config("qwen4_exp"), 2),
}


def _plan(geometry: ModelGeometry, tp: int, *flags: str) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", "--tensor-parallel-size", str(tp), "--max-model-len", "8192",
                                    *flags]).settings()
    return make_plan(geometry, settings, preset("h200"), ruleset_for("0.34.0"),
                     MemoryInputs(vllm_version=parse_version("0.34.0")))


def _per_rank(draft: WeightCount, tp: int) -> int:
    """bf16 weights: an even share of every parameter, and the parts every rank holds whole (nn.Linear
    projections, MoE routers, MLA's replicated projections) in full."""
    whole = 2 * (draft.router_params + draft.replicated_linear_params)
    return 2 * (draft.linear_params + draft.embedding_params) // tp + whole - whole // tp


@pytest.mark.parametrize("name", DRAFTS)
def test_the_kv_budget_shrinks_by_the_drafts_weights_per_rank(name: str) -> None:
    cfg, tp = DRAFTS[name]
    geometry = geometry_from_config(cfg, "0.34.0")
    draft = geometry.packed_draft
    assert draft is not None and draft.linear_params > 0
    mtp = ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
    with_draft, without = _plan(geometry, tp, *mtp), _plan(replace(geometry, packed_draft=None), tp, *mtp)
    assert with_draft.gpu_budget is not None and without.gpu_budget is not None
    assert with_draft.gpu_budget.weights_bytes - without.gpu_budget.weights_bytes == _per_rank(draft, tp)
    assert with_draft.kv_memory_bytes > 0
    assert without.kv_memory_bytes - with_draft.kv_memory_bytes == _per_rank(draft, tp)


@pytest.mark.parametrize("name", DRAFTS)
def test_without_the_draft_the_weights_are_the_targets(name: str) -> None:
    cfg, tp = DRAFTS[name]
    geometry = geometry_from_config(cfg, "0.34.0")
    plain, ngram = _plan(geometry, tp), _plan(geometry, tp, "--speculative-config",
                                               '{"method": "ngram", "num_speculative_tokens": 1}')
    target = _plan(replace(geometry, packed_draft=None), tp)
    assert plain.gpu_budget is not None and ngram.gpu_budget is not None and target.gpu_budget is not None
    assert plain.gpu_budget.weights_bytes == ngram.gpu_budget.weights_bytes == target.gpu_budget.weights_bytes > 0
