"""Issue 39: extract_hidden_states' hidden-state cache beside a full-attention target, as vLLM 0.33 and 0.34
group it (kvwatch/planner/hidden_states.py).

The target is Llama-3.1-8B's config.json (32 layers, 8 KV heads of 128, hidden size 4096, bf16); the
cases vary TP, the KV dtype and the aux layers. vLLM's answers come from its own code
(tests/hidden_state_oracle.py), run live where the unpacked releases are (KVWATCH_VLLM_SRC=<root>) and
recorded in tests/fixtures/hidden_state_oracle.json by that same script for runs without them; a live run
also checks the record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.corpus import CORPUS
from packed_plan_support import assert_live_oracle_is_its_record, assert_plan_is_vllms, packed_oracle, serve_plan

from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.hidden_states import hidden_state_page
from kvwatch.planner.plan import Plan

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "hidden_state_oracle.json"
RELEASES = ("0.33.0", "0.34.0")
GiB = 1 << 30
LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": False}

# name: (TP, --kv-cache-dtype, aux layer ids, KV budget, max_model_len)
_RUNS: dict[str, tuple[int, str, list[int], int, int]] = {
    "3 aux layers, TP 1, 20 GiB, 8k": (1, "auto", [2, 16, 29], 20 * GiB, 8192),
    "3 aux layers, TP 8, 8 GiB, 128k": (8, "auto", [2, 16, 29], 8 * GiB, 131072),
    "1 aux layer, fp8 KV, TP 2, 10 GiB, 32k": (2, "fp8", [31], 10 * GiB, 32768),
}


def _case(tp: int, kv_dtype: str, aux: list[int], budget: int, max_len: int) -> dict[str, Any]:
    return {"layers": 32, "kv_heads": 8 // tp, "head_size": 128, "kv_cache_dtype": kv_dtype,
            "dtype": "bfloat16", "aux_layers": len(aux), "hidden_size": 4096, "tp": tp, "kv_memory_bytes": budget,
            "max_model_len": max_len, "max_in_flight_tokens": 2 * 2048}


CASES = {name: _case(*run) for name, run in _RUNS.items()}
_vllm = packed_oracle(HERE / "hidden_state_oracle.py", CASES, RECORD)


def _spec(aux: list[int], tokens: int = 1) -> str:
    return json.dumps({"method": "extract_hidden_states", "num_speculative_tokens": tokens,
                       "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": aux}}})


def _plan(name: str, release: str, config: dict[str, Any] = LLAMA, spec: str | None = None) -> Plan:
    tp, kv_dtype, aux, budget, max_len = _RUNS[name]
    return serve_plan(config, release, "meta-llama/Llama-3.1-8B-Instruct", "-tp", str(tp), "--kv-cache-dtype", kv_dtype,
                      "--kv-cache-memory-bytes", str(budget), "--max-model-len", str(max_len),
                      "--max-num-batched-tokens", "2048", "--speculative-config", spec or _spec(aux))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_the_plan_has_vllms_block_group_blocks_and_tokens(release: str, name: str) -> None:
    assert_plan_is_vllms(_plan(name, release), _vllm(release)[name])


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_one_group_whose_block_holds_one_hidden_state_page_more(release: str, name: str) -> None:
    case, want = CASES[name], _vllm(release)[name]
    block = want["block_size"]
    hidden = hidden_state_page(block, case["aux_layers"], 4096, 2)   # bf16, whatever the KV dtype
    assert [g["type"] for g in want["groups"]] == ["UniformTypeKVCacheSpecs"]
    assert ["HiddenStateCacheSpec", block, hidden] in want["specs"]
    target = [s for s in want["specs"] if s[0] == "FullAttentionSpec"]
    assert len(target) == 1 and want["bytes_per_block"] == 32 * target[0][2] + hidden


@pytest.mark.parametrize("release", RELEASES)
def test_live_oracle_matches_its_record(release: str) -> None:
    assert_live_oracle_is_its_record(_vllm, RECORD, release)


def test_the_aux_layer_ids_are_read_from_the_speculative_config() -> None:
    def aux(value: str) -> int:
        return EngineCommand.parse(["vllm", "serve", "m", "--speculative-config", value]).settings().speculative_aux_layers
    assert [aux(_spec([1, 2, 3])), aux('{"method": "extract_hidden_states"}'),
            aux('{"draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": 3}}}')] == [3, 0, 0]


@pytest.mark.parametrize(("release", "config", "spec", "reason"), [
    ("0.34.0", LLAMA, json.dumps({"method": "extract_hidden_states", "num_speculative_tokens": 1}),
     "no draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids"),
    ("0.34.0", LLAMA, _spec([2], 2), "num_speculative_tokens not 1"),
    ("0.32.0", LLAMA, _spec([2]), "vLLM 0.32.0: only 0.33's and 0.34's grouping of it is checked"),
    ("0.34.0", {**LLAMA, "model_type": "mistral", "architectures": ["MistralForCausalLM"], "sliding_window": 4096,
                "max_position_embeddings": 32768},
     _spec([2]), "a target with layers other than full attention"),
    ("0.34.0", CORPUS["deepseek_v3"]["config"], _spec([2]), "an MLA target"),
])
def test_outside_the_checked_cases_the_hidden_state_cache_is_named_unplanned(
        release: str, config: dict[str, Any], spec: str, reason: str) -> None:
    plan = _plan("3 aux layers, TP 1, 20 GiB, 8k", release, config, spec)
    assert plan.source == "unknown"
    assert any("'extract_hidden_states': the draft's KV cache and weights are not counted in this plan (its "
               "hidden-state cache: " in u and reason in u for u in plan.unknown_layer_types)
