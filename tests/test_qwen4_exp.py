"""Issue 39: Qwen4-Exp's caches, block size and packed groups, as vLLM 0.33 and 0.34 build them, on one scope.

No Qwen4-Exp config.json is public (transformers names the checkpoint Qwen/Qwen4-Exp):
tests/fixtures/models/qwen4_exp_config.json is transformers' Qwen4ExpTextConfig defaults
(models/qwen4_exp/configuration_qwen4_exp.py; its derived layer list left out, so that the cases can
change the layer count) with torch_dtype bfloat16, an eos_token_id (transformers needs one for PLE
layers) and the fields its defaults leave unset that the QSA layers need: indexer_n_heads 16,
indexer_kv_heads 1 (the only value transformers takes), indexer_head_dim 128, indexer_budget 2048 and
indexer_compress_ratio 4 (a 128-wide index head and a power-of-two ratio take vLLM's fused QSA path,
nvidia/qsa_indexer.py:64-86), a partial_rotary_factor of 0.25 (a 64-wide RoPE, the same path) and
max_position_embeddings 262144 (the default 32768 would refuse the longer cases' --max-model-len).
The cases vary it. vLLM's answers come from its own code (tests/qwen4_exp_oracle.py), run live where
the unpacked releases are (KVWATCH_VLLM_SRC=<root>) and recorded in tests/fixtures/qwen4_exp_oracle.json
by that same script for runs without them; a live run also checks the record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packed_plan_support import assert_live_oracle_is_its_record, assert_plan_is_vllms, packed_oracle, packed_plan

from kvwatch.errors import ConfigError
from kvwatch.planner import qwen4_exp
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.deepseek_v4 import capacity
from kvwatch.planner.plan import Plan

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "qwen4_exp_oracle.json"
GiB = 1 << 30
BASE: dict[str, Any] = json.loads((HERE / "fixtures" / "models" / "qwen4_exp_config.json").read_text())
VL = "Qwen4ExpForConditionalGeneration"
ONE_IN_THREE = ["linear_attention" if i % 3 else "full_attention" for i in range(48)]
MROPE = {**BASE["rope_parameters"], "mrope_section": [11, 11, 10], "mrope_interleaved": True}

CASES: dict[str, dict[str, Any]] = {
    "fixture, TP 1, 40 GiB, 64k": {"config": BASE, "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "fixture, TP 2, 20 GiB, 128k": {"config": BASE, "tp": 2, "kv_memory_bytes": 20 * GiB, "max_model_len": 131072},
    "PLE on 3 layers, TP 2, 20 GiB, 128k": {"config": {**BASE, "ple_layer_ids": [1, 2, 5]}, "tp": 2,
                                            "kv_memory_bytes": 20 * GiB, "max_model_len": 131072},
    "PLE's state sets the block, TP 8, 10 GiB, 32k": {"config": {**BASE, "ple_layer_ids": [1, 6, 7, 38]}, "tp": 8,
                                                      "kv_memory_bytes": 10 * GiB, "max_model_len": 32768},
    "ratio 16, float32 SSM state, TP 4, 20 GiB, 64k": {
        "config": {**BASE, "indexer_compress_ratio": 16, "mamba_ssm_dtype": "float32"}, "tp": 4,
        "kv_memory_bytes": 20 * GiB, "max_model_len": 65536},
    "1 QSA in 3 of 48 layers named full_attention, ratio 8, TP 1, 60 GiB, 128k": {
        "config": {**BASE, "num_hidden_layers": 48, "layer_types": ONE_IN_THREE, "indexer_compress_ratio": 8},
        "tp": 1, "kv_memory_bytes": 60 * GiB, "max_model_len": 131072},
    "VL wrapper with M-RoPE, TP 1, 40 GiB, 64k": {
        "config": {**BASE, "architectures": [VL], "rope_parameters": MROPE}, "tp": 1, "kv_memory_bytes": 40 * GiB,
        "max_model_len": 65536},
}
# The checkpoint's MTP draft, planned with the target: mtp_num_hidden_layers (1 when unset) QSA layers at indices
# num_hidden_layers on, "mtp" the speculative tokens k (GDN and PLE states k rows wider, k more state blocks a
# request, raw-key rings of round_up(ratio + k, ratio) rows).
CASES.update({
    "MTP 1 layer, k 1, TP 1, 40 GiB, 64k": {"config": BASE, "mtp": 1, "tp": 1, "kv_memory_bytes": 40 * GiB,
                                          "max_model_len": 65536},
    "MTP 2 layers, k 3, PLE on 3 layers, TP 2, 20 GiB, 128k": {
        "config": {**BASE, "ple_layer_ids": [1, 2, 5], "mtp_num_hidden_layers": 2}, "mtp": 3, "tp": 2,
        "kv_memory_bytes": 20 * GiB, "max_model_len": 131072},
    "MTP, k 4, PLE's state sets the block, TP 8, 10 GiB, 32k": {
        "config": {**BASE, "ple_layer_ids": [1, 6, 7, 38]}, "mtp": 4, "tp": 8, "kv_memory_bytes": 10 * GiB,
        "max_model_len": 32768},
    "MTP 3 layers, k 7, ratio 16, float32 SSM state, TP 4, 20 GiB, 64k": {
        "config": {**BASE, "indexer_compress_ratio": 16, "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 3},
        "mtp": 7, "tp": 4, "kv_memory_bytes": 20 * GiB, "max_model_len": 65536},
    "MTP, k 2, VL wrapper with M-RoPE, TP 1, 40 GiB, 64k": {
        "config": {**BASE, "architectures": [VL], "rope_parameters": MROPE}, "mtp": 2, "tp": 1,
        "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
})
for _case in CASES.values():   # two concurrent batches (async scheduling) of max_num_batched_tokens 2048
    _case["max_in_flight_tokens"] = 2 * 2048


_vllm = packed_oracle(HERE / "qwen4_exp_oracle.py", CASES, RECORD)


def _shape(config: dict[str, Any]) -> qwen4_exp.Qwen4ExpShape:
    shape = qwen4_exp.qwen4_exp_shape(config, config["architectures"])
    assert shape is not None
    return shape


RELEASES = ("0.33.0", "0.34.0")


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_block_groups_blocks_and_tokens_equal_vllms(name: str, release: str) -> None:
    case, want = CASES[name], _vllm(release)[name]
    shape = _shape(case["config"])
    assert shape.config_reasons == ""
    kv = qwen4_exp.packing(shape, case["tp"], case.get("mtp", 0), mtp="mtp" in case)
    assert (kv.block_size, "BLNHC") == (want["block_size"], want["layout"])
    assert [(len(g.pages), g.block_size, g.page_bytes) for g in kv.groups] == \
        [(g["layers"], g["block_size"], g["page_size_bytes"]) for g in want["groups"]]
    assert kv.bytes_per_block == want["bytes_per_block"]
    blocks = case["kv_memory_bytes"] // kv.bytes_per_block
    assert blocks == want["num_blocks"]
    assert capacity(kv.groups, blocks, case["max_model_len"], case["max_in_flight_tokens"])[0] == want["tokens"]


def _wrapped(case: dict[str, Any]) -> dict[str, Any]:
    """A VL case as its checkpoint lays it out: the wrapper's config.json with the text model inside."""
    if case["config"]["architectures"] != [VL]:
        return case
    return {**case, "config": {"architectures": [VL], "model_type": "qwen4_exp", "text_config":
                               {**case["config"], "model_type": "qwen4_exp_text"}}}


def _plan(case: dict[str, Any], release: str = "0.34.0", card: str = "h100", *flags: str) -> Plan:
    if case.get("mtp"):   # the command drafts with the checkpoint's MTP head
        flags = ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": case["mtp"]}), *flags)
    return packed_plan("Qwen/Qwen4-Exp", _wrapped(case), release, card, *flags)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_the_plan_has_vllms_block_groups_blocks_and_tokens(name: str, release: str) -> None:
    assert_plan_is_vllms(_plan(CASES[name], release), _vllm(release)[name])


def test_the_vl_wrappers_ring_keeps_the_mrope_positions() -> None:
    text, vl = _vllm()["fixture, TP 1, 40 GiB, 64k"], _vllm()["VL wrapper with M-RoPE, TP 1, 40 GiB, 64k"]
    rings = [[g["page_size_bytes"] for g in answer["groups"] if g["block_size"] == 4] for answer in (text, vl)]
    assert rings == [[10 * 4 * 128 * 2], [10 * 4 * (128 + 12) * 2]]


@pytest.mark.parametrize(("release", "card", "flags", "reason"), [
    ("0.32.0", "h100", (), "vLLM 0.32.0: only 0.33 and 0.34 are checked"),
    ("0.34.0", "b200", (), "cuda SM 10.0: only CUDA SM 9.0 is checked"),
    ("0.34.0", "h100", ("--kv-cache-dtype", "fp8"), "a model or KV cache other than bf16"),
    ("0.34.0", "h100", ("--block-size", "256"), "--block-size set"),
    ("0.34.0", "h100", ("-pp", "2"), "pipeline parallelism"),
    ("0.34.0", "h100", ("-tp", "3"), "TP 3 not dividing the heads"),
    ("0.34.0", "h100", ("--no-enable-prefix-caching",), "no prefix caching or another Mamba cache mode"),
    ("0.34.0", "h100", ("--mamba-ssm-cache-dtype", "float32"), "a Mamba cache dtype set"),
    ("0.34.0", "h100", ("--attention-backend", "FLASH_ATTN"), "--attention-backend set"),
    ("0.34.0", "h100", ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'),
     "method 'ngram': only Qwen4-Exp's MTP draft is planned"),
])
def test_outside_the_scope_the_plan_is_unsure(release: str, card: str, flags: tuple[str, ...], reason: str) -> None:
    plan = _plan(CASES["fixture, TP 1, 40 GiB, 64k"], release, card, *flags)
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


@pytest.mark.parametrize("release", RELEASES)
def test_live_oracle_matches_its_record(release: str) -> None:
    assert_live_oracle_is_its_record(_vllm, RECORD, release)


@pytest.mark.parametrize(("change", "reason"), [
    ({}, ""),
    ({"indexer_n_heads": None}, "no QSA indexer (indexer_n_heads unset: Qwen3-Next attention layers)"),
    ({"indexer_budget": None}, "a QSA field unset (transformers refuses the config)"),
    ({"indexer_kv_heads": 2}, "indexer_kv_heads other than 1 (transformers refuses it)"),
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "indexed_attention"] * 10},
     "layer types sliding_attention (transformers refuses them)"),
    ({"indexer_compress_ratio": 128}, "indexer_compress_ratio 128 not dividing 64 (vLLM refuses it)"),
    ({"layer_types": ["linear_attention"] * 40}, "not a GDN and QSA hybrid"),
    ({"ple_layer_ids": [4]}, "ple_layer_ids off the linear_attention layers (transformers refuses them)"),
    ({"ple_layer_ids": [41]}, "ple_layer_ids off the linear_attention layers (transformers refuses them)"),
    ({"hc_count": 1}, "hc_count 1 (vLLM refuses it)"),
    ({"mamba_ssm_dtype": "float64"}, "mamba_ssm_dtype float64 (only float32, bfloat16 and float16 are checked)"),
    ({"mamba_ssm_dtype": ["float32"]}, "mamba_ssm_dtype ['float32'] (only float32, bfloat16 and float16 are checked)"),
])
def test_config_out_of_scope(change: dict[str, Any], reason: str) -> None:
    assert _shape({**BASE, **change}).config_reasons == reason
    if reason:   # the plan of such a config is unsure, naming why
        plan = _plan({**CASES["fixture, TP 1, 40 GiB, 64k"], "config": {**BASE, **change}})
        assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


@pytest.mark.parametrize(("change", "qsa"), [
    ({}, [i % 4 == 3 for i in range(40)]),
    ({"full_attention_interval": 2, "num_hidden_layers": 6}, [False, True] * 3),
    ({"num_hidden_layers": 4, "layer_types": ["full_attention", "linear_attention", "qwen_sparse_attention",
                                              "indexed_attention"]}, [True, False, True, True]),
])
def test_layer_kinds(change: dict[str, Any], qsa: list[bool]) -> None:
    assert list(_shape({**BASE, **change}).qsa) == qsa


def test_qwen4_exp_is_planned_and_its_mtp_draft_with_it() -> None:
    for release in ("0.33.0", "0.34.0"):
        assert verdict("Qwen4ExpForCausalLM", release).handling == PLANNED
        assert verdict(VL, release).handling == PLANNED
        mtp = verdict("Qwen4ExpMTP", release)
        assert mtp.handling == DRAFT and "planned with its target (planner/qwen4_exp.py)" in mtp.reason


def test_the_draft_adds_qsa_layers_and_widens_the_targets_states_and_rings() -> None:
    target, drafted = _vllm()["fixture, TP 1, 40 GiB, 64k"], _vllm()["MTP 1 layer, k 1, TP 1, 40 GiB, 64k"]
    # one QSA layer: its ring, compressed key and K/V; the rings twice as long (round_up(4 + 1, 4) rows)
    assert sum(g["layers"] for g in drafted["groups"]) == sum(g["layers"] for g in target["groups"]) + 3
    assert [g["block_size"] for g in drafted["groups"] if g["block_size"] < 64] == [8]
    assert drafted["tokens"] < target["tokens"]
    shape = _shape(BASE)
    assert [qwen4_exp.ring_rows(shape, k) for k in (0, 1, 4, 5)] == [4, 8, 8, 12]
    assert qwen4_exp.gdn_state_bytes(shape, 1, 2) > qwen4_exp.gdn_state_bytes(shape, 1, 1)
    assert [g.speculative_blocks for g in qwen4_exp.packing(shape, 1, 3, mtp=True).groups if g.kind == "mamba"] \
        == [3] * 3


@pytest.mark.parametrize(("change", "k", "reason"), [
    ({"mtp_num_hidden_layers": 0}, 1, "mtp_num_hidden_layers 0: an MTP draft of 1 to 64 layers is planned"),
    ({"mtp_num_hidden_layers": None}, 1, "mtp_num_hidden_layers None"),
    # TP 8, PLE on 4 layers: a block of 256 tokens at k 5, a ring of round_up(4 + 5, 4) = 12 rows (vLLM's own
    # oracle raises the same assertion)
    ({"ple_layer_ids": [1, 6, 7, 38]}, 5, "a QSA ring of 12 rows not dividing the block of 256 (vLLM asserts it"),
])
def test_an_mtp_head_kvwatch_does_not_plan_is_unsure(change: dict[str, Any], k: int, reason: str) -> None:
    plan = _plan({**CASES["MTP 1 layer, k 1, TP 1, 40 GiB, 64k"], "config": {**BASE, **change}, "mtp": k, "tp": 8})
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


def test_only_a_qwen4_exp_model_type_finds_the_mtp_head() -> None:
    assert _shape({**BASE, "model_type": "qwen4_exp"}).mtp_reasons == ""
    assert _shape({**BASE, "model_type": "qwen3_5_text"}).mtp_reasons.startswith(
        "a config.json of model_type 'qwen3_5_text', which vLLM does not map to its MTP head")


@pytest.mark.parametrize("change", [{"layer_types": "linear_attention"}, {"indexer_head_dim": "wide"},
                                    {"num_hidden_layers": -1}, {"ple_layer_ids": "1,2"},
                                    {"layer_types": ["linear_attention"] * 3}])
def test_a_config_vllm_cannot_build_is_a_config_error(change: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        qwen4_exp.qwen4_exp_shape({**BASE, **change}, ["Qwen4ExpForCausalLM"])
