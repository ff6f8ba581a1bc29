"""Issue 39: Bailing MoE V2.5's lightning-attention state (vLLM's LINEAR kind) and MLA layers, planned as
vLLM 0.32, 0.33 and 0.34 plan them (kvwatch/planner/bailing_linear.py).

vLLM's answers come from its own code (tests/bailing_v25_oracle.py: the release's layer rule, state
shape and dtype, layer specs, mamba cache mode, hybrid block-size alignment and grouping functions),
run live where the unpacked releases are (KVWATCH_VLLM_SRC) and recorded in
tests/fixtures/bailing_v25_oracle.json by that same script for runs without them; a live run also
checks the record. The attention backend and the block size a case starts from are kvwatch's choice
(tested against vLLM in test_release_oracles.py); each case names them and the plan must have chosen
them.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import oracle_answers, release_tree

from kvwatch.planner.architecture_kinds import PLANNED, verdict
from kvwatch.planner.bailing_linear import bailing_linear_layout, is_linear_layer
from kvwatch.planner.devices import GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.layers import FULL, MAMBA
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "bailing_v25_oracle.json"
RELEASES = ("0.32.0", "0.33.0", "0.34.0")

# Bailing MoE V2.5 as its model code's configuration class defaults it (inclusionAI/Ring-V2.5,
# models/configuration_bailing_moe_v2_5.py, BailingMoeV2_5Config.__init__; the MoE and rope fields
# this plan does not read are left out), under the architecture and model_type vLLM registers and
# reads for it (model_type bailing_hybrid: vLLM 0.34.0, vllm/config/speculative.py:1069-1070), with
# the model's dtype named. The published Ring-2.5-1T config.json was not found in the public sources
# searched, so this is not a copy of it.
RING_V25: dict[str, Any] = {
    "architectures": ["BailingMoeV2_5ForCausalLM"], "model_type": "bailing_hybrid", "torch_dtype": "bfloat16",
    "vocab_size": 157184, "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 20,
    "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06, "rope_theta": 600000.0, "layer_group_size": 5, "group_norm_size": 4,
    "linear_silu": False, "use_qk_norm": True, "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "num_experts": 256, "num_shared_experts": 1,
    "num_experts_per_tok": 8, "moe_intermediate_size": 512, "first_k_dense_replace": 1}
# Every 4th layer MLA, 32 heads of 64 (head_dim from hidden_size), 24 layers.
SMALL_HEADS = {**{k: v for k, v in RING_V25.items() if k != "head_dim"}, "num_hidden_layers": 24,
               "layer_group_size": 4, "num_attention_heads": 32}

CASES: dict[str, dict[str, Any]] = {
    "TP 1, 20 GiB": {"config": RING_V25, "tp": 1, "backend": "FLASH_ATTN_MLA", "kv_cache_dtype": "auto",
                     "prefix_caching": True, "kv_memory_bytes": 20 * GiB},
    "TP 4, no prefix caching, 30 GiB": {"config": RING_V25, "tp": 4, "backend": "FLASH_ATTN_MLA",
                                        "kv_cache_dtype": "auto", "prefix_caching": False,
                                        "kv_memory_bytes": 30 * GiB},
    "TP 2, --block-size 256, 10 GiB": {"config": RING_V25, "tp": 2, "backend": "FLASH_ATTN_MLA", "block_size": 256,
                                       "kv_cache_dtype": "auto", "prefix_caching": True, "kv_memory_bytes": 10 * GiB},
    "TP 1, float32 state, 20 GiB": {"config": RING_V25, "tp": 1, "backend": "FLASH_ATTN_MLA",
                                    "kv_cache_dtype": "auto", "mamba_cache_dtype": "float32",
                                    "prefix_caching": True, "kv_memory_bytes": 20 * GiB},
    "head_dim from hidden_size, TP 2, 12 GiB": {"config": SMALL_HEADS, "tp": 2, "backend": "FLASH_ATTN_MLA",
                                                "kv_cache_dtype": "auto", "prefix_caching": True,
                                                "kv_memory_bytes": 12 * GiB},
}


@cache
def _vllm(release: str) -> dict[str, dict[str, Any]]:
    return oracle_answers(HERE / "bailing_v25_oracle.py", release, CASES, RECORD)


def _plan(case: dict[str, Any], release: str) -> Plan:
    flags = ["-tp", str(case["tp"]), "--kv-cache-memory-bytes", str(case["kv_memory_bytes"]),
             "--kv-cache-dtype", case["kv_cache_dtype"],
             "--enable-prefix-caching" if case["prefix_caching"] else "--no-enable-prefix-caching"]
    if case.get("block_size"):
        flags += ["--block-size", str(case["block_size"])]
    if case.get("mamba_cache_dtype"):
        flags += ["--mamba-cache-dtype", case["mamba_cache_dtype"]]
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    return make_plan(geometry_from_config(case["config"], release), settings, preset("h100"), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("label", list(CASES))
def test_block_size_groups_state_page_and_blocks_equal_vllms(release: str, label: str) -> None:
    truth = _vllm(release)[label]
    plan = _plan(CASES[label], release)
    assert plan.backend == CASES[label]["backend"]
    assert (plan.block_size, plan.kv_cache_groups, plan.num_blocks) == \
        (truth["block_size"], truth["groups"], truth["num_blocks"])
    assert plan.page_size_bytes == truth["state_page"]   # the state padded to the attention page
    assert plan.source == "exact" and plan.unknown_layer_types == ()


@pytest.mark.parametrize("release", RELEASES)
def test_linear_layers_are_vllms(release: str) -> None:
    for label, case in CASES.items():
        cfg = case["config"]
        layout = bailing_linear_layout(cfg, cfg["architectures"], cfg["num_hidden_layers"])
        assert layout is not None and layout.kinds.count(MAMBA) == _vllm(release)[label]["linear_layers"]


def test_layer_rule_table() -> None:
    """is_linear_layer: each group's last layer attends; a group size of 0 (or 1) makes every layer MLA."""
    assert [is_linear_layer(i, 5) for i in range(10)] == [True] * 4 + [False] + [True] * 4 + [False]
    assert not any(is_linear_layer(i, 1) for i in range(8)) and not any(is_linear_layer(i, 0) for i in range(8))
    plain = {**RING_V25, "layer_group_size": 1}
    layout = bailing_linear_layout(plain, plain["architectures"], 20)
    assert layout is not None and layout.kinds == (FULL,) * 20 and layout.state is None
    assert bailing_linear_layout(RING_V25, ("DeepseekV3ForCausalLM",), 20) is None


@pytest.mark.skipif(not all(release_tree(r) for r in RELEASES), reason="set KVWATCH_VLLM_SRC to the unpacked releases")
def test_the_record_is_what_vllms_code_answers_now() -> None:
    assert json.loads(RECORD.read_text()) == {r: _vllm(r) for r in RELEASES}


@pytest.mark.parametrize("release", RELEASES)
def test_bailing_v25_is_planned_not_unknown(release: str) -> None:
    assert verdict("BailingMoeV2_5ForCausalLM", release).handling == PLANNED
