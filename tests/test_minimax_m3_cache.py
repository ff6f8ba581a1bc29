"""Issue 39: MiniMax-M3's sparse attention and key-only indexer cache, planned as vLLM 0.33 and 0.34 plan them.

vLLM's answers come from its own code (tests/minimax_m3_oracle.py: the releases' config classes,
layer specs, backends' block sizes and grouping functions), run live where the unpacked releases are
(KVWATCH_VLLM_SRC=<root>/<release>/vllm/...) and recorded in tests/fixtures/minimax_m3_oracle.json
by that same script for runs without them; a live run also checks the record.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import oracle_answers, release_tree

from kvwatch.planner.architecture_kinds import PLANNED, verdict
from kvwatch.planner.devices import GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "minimax_m3_oracle.json"
RELEASES = ("0.33.0", "0.34.0")

# MiniMax-M3's text model as the MiniMax-M3-preview checkpoint has it, in the checkpoint's own
# (legacy) schema: the fields vLLM 0.33.0's MiniMaxM3TextConfig defaults to, which its docstring
# says "mirror the text_config of the MiniMax-M3-preview checkpoint" (vLLM 0.33.0,
# vllm/transformers_utils/configs/minimax_m3.py:8-102), under the multimodal wrapper vLLM registers
# (MiniMaxM3SparseForConditionalGeneration, model_type minimax_m3_vl). transformers 5.19's
# MiniMaxM3VLTextConfig has the same defaults. The published config.json itself was not found in
# the public sources searched, so this is not a verbatim copy of it.
PREVIEW_TEXT: dict[str, Any] = {
    "vocab_size": 200064, "hidden_size": 6144, "intermediate_size": 3072, "dense_intermediate_size": 12288,
    "shared_intermediate_size": 3072, "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4,
    "head_dim": 128, "max_position_embeddings": 524288, "rms_norm_eps": 1e-6, "rope_theta": 5000000,
    "rotary_dim": 64, "partial_rotary_factor": 0.5, "num_local_experts": 128, "num_experts_per_tok": 4,
    "n_shared_experts": 1, "routed_scaling_factor": 2.0, "num_mtp_modules": 1, "torch_dtype": "bfloat16",
    "moe_layer_freq": [0] * 3 + [1] * 57,
    "sparse_attention_config": {
        "use_sparse_attention": True, "sparse_index_dim": 128, "sparse_num_index_heads": 4, "sparse_topk_blocks": 16,
        "sparse_block_size": 128, "sparse_disable_index_value": [0] * 3 + [1] * 57, "sparse_score_type": "max",
        "sparse_init_block": 0, "sparse_local_block": 1, "sparse_attention_freq": [0] * 3 + [1] * 57}}
PREVIEW = {"architectures": ["MiniMaxM3SparseForConditionalGeneration"], "model_type": "minimax_m3_vl",
           "text_config": PREVIEW_TEXT}
# The text model alone in transformers' schema (layer_types, index_head_dim), every 4th layer dense:
# 0.34 reads layer_types; 0.33's own config class ignores them and takes the preview's sparse layers.
NEW_SCHEMA = {**{k: v for k, v in PREVIEW_TEXT.items() if k != "sparse_attention_config"},
              "architectures": ["MiniMaxM3SparseForCausalLM"], "model_type": "minimax_m3_vl_text",
              "index_head_dim": 64, "index_n_heads": 4,
              "layer_types": ["full_attention" if i % 4 == 0 else "minimax_m3_sparse" for i in range(60)]}

CASES: dict[str, dict[str, Any]] = {
    "issue 39: TP 4, 40 GiB": {"config": PREVIEW, "tp": 4, "kv_cache_dtype": "auto", "kv_memory_bytes": 40 * GiB},
    "TP 1, fp8 KV, 40 GiB": {"config": PREVIEW, "tp": 1, "kv_cache_dtype": "fp8", "kv_memory_bytes": 40 * GiB},
    "TP 8, 17 GiB, --block-size 256": {"config": PREVIEW, "tp": 8, "kv_cache_dtype": "auto",
                                       "kv_memory_bytes": 17 * GiB, "block_size": 256},
    "PP 2, TP 4, 20 GiB": {"config": PREVIEW, "tp": 4, "pp": 2, "kv_cache_dtype": "auto",
                           "kv_memory_bytes": 20 * GiB},
    "layer_types schema, TP 2, 30 GiB": {"config": NEW_SCHEMA, "tp": 2, "kv_cache_dtype": "auto",
                                         "kv_memory_bytes": 30 * GiB},
}


@cache
def _vllm(release: str) -> dict[str, dict[str, Any]]:
    return oracle_answers(HERE / "minimax_m3_oracle.py", release, CASES, RECORD)


def _plan(case: dict[str, Any], release: str) -> Plan:
    flags = ["-tp", str(case["tp"]), "--kv-cache-memory-bytes", str(case["kv_memory_bytes"]),
             "--kv-cache-dtype", case["kv_cache_dtype"]]
    if case.get("pp"):
        flags += ["-pp", str(case["pp"])]
    if case.get("block_size"):
        flags += ["--block-size", str(case["block_size"])]
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    version = parse_version(release)
    return make_plan(geometry_from_config(case["config"], release), settings, preset("h100"), ruleset_for(release),
                     MemoryInputs(vllm_version=version))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("label", list(CASES))
def test_tokens_block_size_and_groups_equal_vllms(release: str, label: str) -> None:
    truth = _vllm(release)[label]
    plan = _plan(CASES[label], release)
    assert (plan.block_size, plan.kv_cache_groups, plan.bytes_per_block, plan.num_blocks, plan.kv_cache_tokens) == \
        (truth["block_size"], truth["groups"], truth["bytes_per_block"], truth["num_blocks"], truth["tokens"])
    assert plan.source == "exact" and plan.unknown_layer_types == ()


def test_the_issue_figures_are_vllms_and_no_longer_plain_attention() -> None:
    """vLLM: block 128 and 947,840 tokens at 40 GiB (TP 4); kvwatch said block 16 and 1,398,096."""
    truth = _vllm("0.33.0")["issue 39: TP 4, 40 GiB"]
    assert (truth["block_size"], truth["tokens"], truth["sparse_layers"]) == (128, 947_840, 57)
    plain = {**PREVIEW_TEXT, "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2"}
    plan = _plan({**CASES["issue 39: TP 4, 40 GiB"], "config": plain}, "0.33.0")
    assert (plan.block_size, plan.kv_cache_tokens) == (16, 1_398_096)   # what a plain attention model gets


@pytest.mark.skipif(not all(release_tree(r) for r in RELEASES), reason="set KVWATCH_VLLM_SRC to the unpacked releases")
def test_the_record_is_what_vllms_code_answers_now() -> None:
    assert json.loads(RECORD.read_text()) == {r: _vllm(r) for r in RELEASES}


@pytest.mark.parametrize("release", RELEASES)
def test_minimax_m3_is_planned_not_unknown(release: str) -> None:
    assert verdict("MiniMaxM3SparseForCausalLM", release).handling == PLANNED
    assert verdict("MiniMaxM3SparseForConditionalGeneration", release).handling == PLANNED

