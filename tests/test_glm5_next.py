"""Issue 39: GLM-5-Next's caches, block size and packed groups, as vLLM 0.34 builds them, on one scope.

No GLM-5-Next config.json is public (transformers names the checkpoint zai-org/GLM-5.3-Flash):
tests/fixtures/models/glm5_next_config.json is transformers' Glm5NextTextConfig defaults (its derived
layer lists left out, so that the cases can change the layer count), with torch_dtype bfloat16.
The cases vary it. vLLM's answers come from its own code (tests/glm5_next_oracle.py), run live where
the unpacked releases are (KVWATCH_VLLM_SRC=<root>) and recorded in tests/fixtures/glm5_next_oracle.json
by that same script for runs without them; a live run also checks the record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packed_plan_support import assert_live_oracle_is_its_record, assert_plan_is_vllms, packed_oracle, packed_plan

from kvwatch.errors import ConfigError
from kvwatch.planner import glm5_next
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.deepseek_v4 import capacity
from kvwatch.planner.plan import Plan

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "glm5_next_oracle.json"
GiB = 1 << 30
BASE: dict[str, Any] = json.loads((HERE / "fixtures" / "models" / "glm5_next_config.json").read_text())
ONE_IN_THREE = ["linear_attention" if i % 3 else "indexed_attention" for i in range(48)]

CASES: dict[str, dict[str, Any]] = {
    "fixture, TP 1, 60 GiB, 64k": {"config": BASE, "tp": 1, "kv_memory_bytes": 60 * GiB, "max_model_len": 65536},
    "fixture, TP 2, 30 GiB, 128k": {"config": BASE, "tp": 2, "kv_memory_bytes": 30 * GiB, "max_model_len": 131072},
    "fixture, TP 4, 20 GiB, 32k": {"config": BASE, "tp": 4, "kv_memory_bytes": 20 * GiB, "max_model_len": 32768},
    "1 MLA in 3 of 48 layers, kpool 8, TP 1, 40 GiB, 64k": {
        "config": {**BASE, "num_hidden_layers": 48, "layer_types": ONE_IN_THREE, "index_kpool": 8},
        "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "kpool 32, TP 8, 10 GiB, 16k": {"config": {**BASE, "index_kpool": 32}, "tp": 8, "kv_memory_bytes": 10 * GiB,
                                    "max_model_len": 16384},
    "kpool 4, TP 2, 30 GiB, 64k": {"config": {**BASE, "index_kpool": 4}, "tp": 2, "kv_memory_bytes": 30 * GiB,
                                   "max_model_len": 65536},
}
# The checkpoint's MTP draft, planned with the target (issue 39): its MLA layers at indices num_hidden_layers on,
# "mtp" the speculative tokens k (wider KDA conv states, k more state blocks, tail rings of kpool x 2 past kpool - k).
# vLLM finds the head for a config.json of model_type glm5_next only (Glm5NextConfig, which takes flat text fields).
MTP = {**BASE, "model_type": "glm5_next", "num_nextn_predict_layers": 1}
CASES.update({
    "MTP 1 layer, k 1, TP 1, 60 GiB, 64k": {"config": MTP, "mtp": 1, "tp": 1, "kv_memory_bytes": 60 * GiB,
                                          "max_model_len": 65536},
    "MTP 1 layer, k 3, TP 2, 30 GiB, 128k": {"config": MTP, "mtp": 3, "tp": 2, "kv_memory_bytes": 30 * GiB,
                                           "max_model_len": 131072},
    "MTP 3 layers, k 3, TP 4, 20 GiB, 32k": {"config": {**MTP, "num_nextn_predict_layers": 3}, "mtp": 3, "tp": 4,
                                           "kv_memory_bytes": 20 * GiB, "max_model_len": 32768},
    "MTP 2 layers, kpool 8, k 12 (a ring of 32 rows), TP 8, 10 GiB, 16k": {
        "config": {**MTP, "num_nextn_predict_layers": 2, "index_kpool": 8}, "mtp": 12, "tp": 8,
        "kv_memory_bytes": 10 * GiB, "max_model_len": 16384},
})
for _case in CASES.values():   # two concurrent batches (async scheduling) of max_num_batched_tokens 2048
    _case["max_in_flight_tokens"] = 2 * 2048


_vllm = packed_oracle(HERE / "glm5_next_oracle.py", CASES, RECORD)


def _shape(config: dict[str, Any]) -> glm5_next.Glm5NextShape:
    shape = glm5_next.glm5_next_shape(config, config["architectures"])
    assert shape is not None
    return shape


@pytest.mark.parametrize("name", CASES)
def test_block_groups_blocks_and_tokens_equal_vllms(name: str) -> None:
    case, want = CASES[name], _vllm()[name]
    shape = _shape(case["config"])
    assert shape.config_reasons == ""
    kv = glm5_next.packing(shape, case["tp"], case.get("mtp", 0), mtp="mtp" in case)
    assert (kv.block_size, "BLHNC") == (want["block_size"], want["layout"])
    assert [(len(g.pages), g.block_size, g.page_bytes) for g in kv.groups] == \
        [(g["layers"], g["block_size"], g["page_size_bytes"]) for g in want["groups"]]
    assert kv.bytes_per_block == want["bytes_per_block"]
    blocks = case["kv_memory_bytes"] // kv.bytes_per_block
    assert blocks == want["num_blocks"]
    assert capacity(kv.groups, blocks, case["max_model_len"], case["max_in_flight_tokens"])[0] == want["tokens"]


def _plan(case: dict[str, Any], release: str = "0.34.0", card: str = "h100", *flags: str) -> Plan:
    if case.get("mtp"):   # the command drafts with the checkpoint's MTP head
        flags = ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": case["mtp"]}), *flags)
    return packed_plan("zai-org/GLM-5.3-Flash", case, release, card, *flags)


@pytest.mark.parametrize("name", CASES)
def test_the_plan_has_vllms_block_groups_blocks_and_tokens(name: str) -> None:
    assert_plan_is_vllms(_plan(CASES[name]), _vllm()[name])


@pytest.mark.parametrize(("release", "card", "flags", "reason"), [
    ("0.33.0", "h100", (), "vLLM 0.33.0: only 0.34 is checked"),
    ("0.34.0", "b200", (), "cuda SM 10.0: only CUDA SM 9.0 is checked"),
    ("0.34.0", "h100", ("--kv-cache-dtype", "fp8"), "a model or KV cache other than bf16"),
    ("0.34.0", "h100", ("--block-size", "256"), "--block-size set"),
    ("0.34.0", "h100", ("-pp", "2"), "pipeline parallelism"),
    ("0.34.0", "h100", ("-tp", "3"), "TP 3 not dividing the KDA heads"),
    ("0.34.0", "h100", ("--no-enable-prefix-caching",), "no prefix caching or another Mamba cache mode"),
    ("0.34.0", "h100", ("--attention-backend", "FLASHMLA_SPARSE"), "--attention-backend set"),
    ("0.34.0", "h100", ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'),
     "model_type 'glm5_next_text', which vLLM does not map to its MTP head"),
    ("0.34.0", "h100", ("--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 1}'),
     "method 'eagle3': only GLM-5-Next's MTP draft is planned"),
])
def test_outside_the_scope_the_plan_is_unsure(release: str, card: str, flags: tuple[str, ...], reason: str) -> None:
    plan = _plan(CASES["fixture, TP 1, 60 GiB, 64k"], release, card, *flags)
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


def test_live_oracle_matches_its_record() -> None:
    assert_live_oracle_is_its_record(_vllm, RECORD)


@pytest.mark.parametrize(("change", "reason"), [
    ({}, ""),
    ({"index_topk": None}, "no index_topk (full MLA, no indexer)"),
    ({"layer_types": ["indexed_attention"] * 45}, "not a KDA and MLA hybrid"),
    ({"qk_rope_head_dim": 64}, "an MLA latent of 576 (only 512 is checked)"),
    ({"index_head_dim": 64}, "index_head_dim 64 (vLLM asserts 128)"),
    ({"index_kpool": 1}, "index_kpool 1 (vLLM asserts > 1)"),
    ({"linear_lower_bound": None}, "KDA without FlashKDA (its head_dim 128 and a bounded gate, common/kda.py:141-164)"),
])
def test_config_out_of_scope(change: dict[str, Any], reason: str) -> None:
    assert _shape({**BASE, **change}).config_reasons == reason


@pytest.mark.parametrize(("change", "kda"), [
    ({}, [i % 4 != 3 for i in range(45)]),
    ({"num_hidden_layers": 6, "layer_types": ["linear_attention"] * 4}, [True] * 4 + [False] * 2),
])
def test_layer_kinds(change: dict[str, Any], kda: list[bool]) -> None:
    assert list(_shape({**BASE, **change}).kda) == kda


def test_glm5_next_is_planned_and_its_mtp_draft_with_it() -> None:
    assert verdict("Glm5NextForCausalLM", "0.34.0").handling == PLANNED
    assert verdict("Glm5NextForConditionalGeneration", "0.34.0").handling == PLANNED
    mtp = verdict("Glm5NextMTPModel", "0.34.0")
    assert mtp.handling == DRAFT and "planned with its target (planner/glm5_next.py)" in mtp.reason


def test_the_draft_adds_its_layers_and_widens_the_targets_states() -> None:
    target, drafted = _vllm()["fixture, TP 1, 60 GiB, 64k"], _vllm()["MTP 1 layer, k 1, TP 1, 60 GiB, 64k"]
    assert sum(g["layers"] for g in drafted["groups"]) == sum(g["layers"] for g in target["groups"]) + 3
    assert drafted["num_blocks"] <= target["num_blocks"] and drafted["tokens"] < target["tokens"]
    shape = _shape(MTP)
    assert glm5_next.kda_state_bytes(shape, 1, 1) > glm5_next.kda_state_bytes(shape, 1)


@pytest.mark.parametrize(("kpool", "k", "rows"), [(16, 0, 16), (16, 1, 32), (16, 16, 32), (16, 17, 64), (8, 12, 32),
                                                  (4, 1, 8), (4, 13, 32)])
def test_the_tail_ring_holds_a_power_of_two_of_pools_past_the_drafts(kpool: int, k: int, rows: int) -> None:
    assert glm5_next.tail_rows(_shape({**BASE, "index_kpool": kpool}), k) == rows


@pytest.mark.parametrize(("change", "k", "reason"), [
    ({"model_type": "glm5_next_text", "num_nextn_predict_layers": 1}, 1,
     "a config.json of model_type 'glm5_next_text', which vLLM does not map to its MTP head"),
    ({"num_nextn_predict_layers": None}, 1, "no num_nextn_predict_layers (vLLM's MTP mapping reads it"),
    ({"num_nextn_predict_layers": 0}, 1, "num_nextn_predict_layers 0: an MTP draft of 1 to 64 layers is planned"),
    ({"num_nextn_predict_layers": "one"}, 1, "num_nextn_predict_layers 'one'"),
    # TP 8, kpool 4: a block of 1,408 tokens at k 126, a ring of 4 x 64 pools (cdiv(130, 4) = 33, rounded up to a power of two)
    ({"num_nextn_predict_layers": 1, "index_kpool": 4}, 126,
     "a tail ring of 256 rows not dividing the block of 1408 (vLLM asserts it"),
])
def test_an_mtp_head_kvwatch_does_not_plan_is_unsure(change: dict[str, Any], k: int, reason: str) -> None:
    plan = _plan({**CASES["MTP 1 layer, k 1, TP 1, 60 GiB, 64k"], "config": {**MTP, **change}, "mtp": k, "tp": 8})
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


@pytest.mark.parametrize("change", [{"layer_types": "linear_attention"}, {"index_kpool": "sixteen"},
                                    {"num_hidden_layers": -1}])
def test_a_config_vllm_cannot_build_is_a_config_error(change: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        glm5_next.glm5_next_shape({**BASE, **change}, ["Glm5NextForCausalLM"])
