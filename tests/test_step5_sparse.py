"""Issue 39: Step5's caches and their packed groups, as vLLM 0.34 builds them, on one scope.

No Step5 config.json is public: tests/fixtures/models/step5_config.json is vLLM 0.34.0's Step5Config
defaults (vllm/transformers_utils/configs/step5.py) with the three fields the DSA layers need set:
head_dim 192 (the only one STEP5_DSA takes; the default, hidden_size // heads, is 128), a
sliding_window of 512 and an empty sparse_config section (vLLM refuses a checkpoint without one),
and max_seq_len 131072 (the default 4096 would refuse the longer cases' --max-model-len).
The cases vary it. vLLM's answers come from its own code (tests/step5_oracle.py), run live where the
unpacked releases are (KVWATCH_VLLM_SRC=<root>) and recorded in tests/fixtures/step5_oracle.json by
that same script for runs without them; a live run also checks the record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packed_plan_support import assert_live_oracle_is_its_record, assert_plan_is_vllms, packed_oracle, packed_plan

from kvwatch.errors import ConfigError
from kvwatch.planner import step5_sparse
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.deepseek_v4 import capacity
from kvwatch.planner.plan import Plan

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "step5_oracle.json"
GiB = 1 << 30
BASE: dict[str, Any] = json.loads((HERE / "fixtures" / "models" / "step5_config.json").read_text())
ALTERNATING = ["sliding_attention", "full_attention"] * 24

CASES: dict[str, dict[str, Any]] = {
    "fixture, TP 1, 40 GiB, 64k": {"config": BASE, "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "fixture, TP 2, 20 GiB, 128k": {"config": BASE, "tp": 2, "kv_memory_bytes": 20 * GiB, "max_model_len": 131072},
    "no window: every layer DSA, TP 8, 10 GiB, 4096": {"config": {**BASE, "sliding_window": None}, "tp": 8,
                                                       "kv_memory_bytes": 10 * GiB, "max_model_len": 4096},
    "3 sliding : 1 DSA, TP 1, 40 GiB, 32k": {"config": {**BASE, "layer_types": ["sliding_attention"] * 3 * 12
                                                        + ["full_attention"] * 12},
                                             "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 32768},
    "sliding layers of 4 KV heads (attention_other_setting), TP 2, 30 GiB, 64k": {
        "config": {**BASE, "layer_types": ALTERNATING, "swa_num_attention_heads": 64,
                   "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 64,
                                               "num_attention_groups": 4, "head_dim": 192}},
        "tp": 2, "kv_memory_bytes": 30 * GiB, "max_model_len": 65536},
}
# The checkpoint's MTP draft, planned with the target (issue 39): its layers at indices 48 on, their kinds
# by the layer types (the parity default: an even index slides), "mtp" the speculative tokens k.
CASES.update({
    "MTP 1 layer (sliding), k 1, TP 1, 40 GiB, 64k": {"config": {**BASE, "num_nextn_predict_layers": 1}, "mtp": 1,
                                                      "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "MTP 3 layers, k 3 (multi-module: windows keep 2 more), TP 2, 20 GiB, 128k": {
        "config": {**BASE, "num_nextn_predict_layers": 3}, "mtp": 3, "tp": 2, "kv_memory_bytes": 20 * GiB,
        "max_model_len": 131072},
    "MTP 2 layers, k 1 (one module drafts), TP 1, 40 GiB, 64k": {
        "config": {**BASE, "num_nextn_predict_layers": 2}, "mtp": 1, "tp": 1, "kv_memory_bytes": 40 * GiB,
        "max_model_len": 65536},
    "MTP 1 DSA layer (layer_types_with_mtp), k 2, TP 8, 10 GiB, 4096": {
        "config": {**BASE, "num_nextn_predict_layers": 1, "layer_types_with_mtp": ALTERNATING + ["full_attention"]},
        "mtp": 2, "tp": 8, "kv_memory_bytes": 10 * GiB, "max_model_len": 4096},
})
for _case in CASES.values():   # two concurrent batches (async scheduling) of max_num_batched_tokens 2048
    _case["max_in_flight_tokens"] = 2 * 2048


_vllm = packed_oracle(HERE / "step5_oracle.py", CASES, RECORD)


def _shape(config: dict[str, Any]) -> step5_sparse.Step5Shape:
    shape = step5_sparse.step5_shape(config, config["architectures"])
    assert shape is not None
    return shape


def _scope(shape: step5_sparse.Step5Shape, **settings: Any) -> str:
    args: dict[str, Any] = {"sm": (9, 0), "kv_cache_dtype": "auto", "dtype": "bfloat16", "block_size": None,
                            "num_speculative_tokens": 0, **settings}
    return step5_sparse.out_of_scope(shape, **args)


@pytest.mark.parametrize("name", CASES)
def test_groups_block_blocks_and_tokens_equal_vllms(name: str) -> None:
    case, want = CASES[name], _vllm()[name]
    shape, k = _shape(case["config"]), case.get("mtp", 0)
    assert _scope(shape, num_speculative_tokens=k, mtp=k > 0) == ""
    kv = step5_sparse.packing(step5_sparse.per_rank(shape, case["tp"], mtp=k > 0))
    assert (step5_sparse.BLOCK_SIZE, step5_sparse.LAYOUT) == (want["block_size"], want["layout"])
    assert [(len(g.pages), g.block_size, g.page_bytes) for g in kv.groups] == \
        [(g["layers"], g["block_size"], g["page_size_bytes"]) for g in want["groups"]]
    assert kv.bytes_per_block == want["bytes_per_block"]
    blocks = step5_sparse.num_blocks(kv, case["kv_memory_bytes"])
    assert blocks == want["num_blocks"]
    retained = step5_sparse.draft_retained_tokens(shape, k) if k else 0
    tokens, _ = capacity(kv.groups, blocks, case["max_model_len"], case["max_in_flight_tokens"], retained)
    assert tokens == want["tokens"]


def _plan(case: dict[str, Any], release: str = "0.34.0", card: str = "h100", *flags: str) -> Plan:
    if case.get("mtp"):   # the command drafts with the checkpoint's MTP head
        flags = ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": case["mtp"]}), *flags)
    return packed_plan("stepfun/step5", case, release, card, *flags)


@pytest.mark.parametrize("name", CASES)
def test_the_plan_has_vllms_block_groups_blocks_and_tokens(name: str) -> None:
    assert_plan_is_vllms(_plan(CASES[name]), _vllm()[name])


def test_the_draft_adds_its_layers_to_the_targets_groups() -> None:
    target, drafted = _vllm()["fixture, TP 1, 40 GiB, 64k"], _vllm()["MTP 1 layer (sliding), k 1, TP 1, 40 GiB, 64k"]
    assert sum(g["layers"] for g in drafted["groups"]) == sum(g["layers"] for g in target["groups"]) + 1
    assert drafted["num_blocks"] < target["num_blocks"]
    assert _plan(CASES["MTP 1 layer (sliding), k 1, TP 1, 40 GiB, 64k"]).num_blocks == drafted["num_blocks"]


@pytest.mark.parametrize(("modules", "k", "index_share", "retained"), [
    (1, 1, False, 0), (1, 4, False, 0), (2, 1, False, 0), (3, 3, False, 2), (2, 5, False, 4), (3, 3, True, 0)])
def test_a_multi_module_draft_keeps_k_minus_1_more_tokens_in_each_window(modules: int, k: int, index_share: bool,
                                                                          retained: int) -> None:
    shape = _shape({**BASE, "num_nextn_predict_layers": modules, "index_share_for_mtp_iteration": index_share})
    assert step5_sparse.draft_retained_tokens(shape, k) == retained


@pytest.mark.parametrize(("change", "flags", "reason"), [
    ({}, ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'),
     "num_nextn_predict_layers 0 (vLLM refuses it"),
    ({"num_nextn_predict_layers": 1, "moe_layers_enum": "1,2,48"},
     ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'), "an MoE MTP layer (vLLM refuses it"),
    ({"num_nextn_predict_layers": 1}, ("--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 1}'),
     "method 'eagle3': only Step5's MTP draft is planned"),
    ({"num_nextn_predict_layers": 1}, ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 50}'),
     "a CSA tail ring of 48 rows, short of 57 (vLLM refuses it)"),
])
def test_a_draft_vllm_refuses_or_kvwatch_does_not_plan_is_unsure(change: dict[str, Any], flags: tuple[str, ...],
                                                                  reason: str) -> None:
    # TP 8: one KV head a rank, a main page of 64 x 2 x 192 x 2 B, 48 ring rows
    plan = _plan({**CASES["fixture, TP 1, 40 GiB, 64k"], "tp": 8, "config": {**BASE, **change}}, "0.34.0", "h100",
                 *flags)
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


def test_the_vl_wrapper_plans_as_its_text_model() -> None:
    case = CASES["fixture, TP 1, 40 GiB, 64k"]
    wrapped = {**case, "config": {"architectures": ["Step5ForConditionalGeneration"], "model_type": "step5_vl",
                                  "text_config": case["config"]}}
    assert verdict("Step5ForConditionalGeneration", "0.34.0").handling == PLANNED
    assert _plan(wrapped).num_blocks == _plan(case).num_blocks == _vllm()["fixture, TP 1, 40 GiB, 64k"]["num_blocks"]


@pytest.mark.parametrize(("release", "card", "flags", "reason"), [
    ("0.33.0", "h100", (), "vLLM 0.33: only 0.34 is checked"),
    ("0.34.0", "b200", (), "cuda SM 10.0: only CUDA SM 9.0 is checked"),
    ("0.34.0", "h100", ("--kv-cache-dtype", "fp8"), "a KV cache other than bf16"),
    ("0.34.0", "h100", ("--block-size", "16"), "--block-size set"),
    ("0.34.0", "h100", ("-pp", "2"), "pipeline parallelism"),
    ("0.34.0", "h100", ("-tp", "3"), "TP 3 not dividing the heads"),
    ("0.34.0", "h100", ("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 1}'),
     "method 'ngram': only Step5's MTP draft is planned"),
])
def test_outside_the_scope_the_plan_is_unsure(release: str, card: str, flags: tuple[str, ...], reason: str) -> None:
    plan = _plan(CASES["fixture, TP 1, 40 GiB, 64k"], release, card, *flags)
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


def test_live_oracle_matches_its_record() -> None:
    assert_live_oracle_is_its_record(_vllm, RECORD)


@pytest.mark.parametrize(("change", "settings", "reason"), [
    ({}, {}, ""),
    ({"sparse_config": None}, {}, "no sparse_config section (vLLM refuses the model); no DSA layer; "
                                  "a full-attention layer without DSA"),
    ({"sparse_config": {"enabled": False}}, {}, "no DSA layer; a full-attention layer without DSA"),
    ({"head_dim": 128}, {}, "a head_dim other than 192"),
    ({}, {"sm": (10, 0)}, "cuda SM 10.0: only CUDA SM 9.0 is checked"),
    ({}, {"kv_cache_dtype": "fp8"}, "a KV cache other than bf16"),
    ({}, {"dtype": "float16"}, "a KV cache other than bf16"),
    ({}, {"block_size": 16}, "--block-size set"),
    ({}, {"num_speculative_tokens": 2}, "speculative decoding"),
    ({}, {"num_speculative_tokens": 2, "mtp": True},
     "an MTP draft of num_nextn_predict_layers 0 (vLLM refuses it: models/step5/nvidia/mtp.py:185-189)"),
    ({}, {"minor": (0, 33)}, "vLLM 0.33: only 0.34 is checked"),
    ({"sparse_config": {"enabled": True, "topk": 2048, "proxy_dim": 128, "index_tp_size": 4,
                        "attention_impl": " Sparse_GQA "}}, {},
     "sparse_config proxy_dim, topk other than vLLM's defaults (which kvwatch checked)"),
    ({"step3p5_sparse_config": {}}, {},
     "a step5_sparse_config or step3p5_sparse_config section (vLLM refuses it: common/config.py:55-62)"),
    ({"att_impl_type": "MFA"}, {}, "an att_impl_type other than GQA (vLLM refuses it)"),
    ({"sparse_config": {"apply_to_layer_types": ["sliding_attention"]}}, {},
     "apply_to_layer_types other than full_attention (vLLM refuses it)"),
])
def test_out_of_scope(change: dict[str, Any], settings: dict[str, Any], reason: str) -> None:
    assert _scope(_shape({**BASE, **change}), **settings) == reason


@pytest.mark.parametrize(("change", "kinds"), [
    ({}, ["sliding", "dsa"] * 24),
    ({"sliding_window": None}, ["dsa"] * 48),
    ({"layer_types": ["full_attention"] * 47 + ["sliding_attention"]}, ["dsa"] * 47 + ["sliding"]),
])
def test_layer_kinds(change: dict[str, Any], kinds: list[str]) -> None:
    assert [layer.kind for layer in _shape({**BASE, **change}).layers] == kinds


def test_step5_is_planned_and_its_mtp_draft_with_it() -> None:
    assert verdict("Step5ForCausalLM", "0.34.0").handling == PLANNED
    mtp = verdict("Step5MTP", "0.34.0")
    assert mtp.handling == DRAFT and "planned with its target" in mtp.reason


@pytest.mark.parametrize("change", [{"layer_types": ["full_attention"] * 3}, {"num_attention_groups": "eight"},
                                    {"num_hidden_layers": None}])
def test_a_config_vllm_cannot_build_is_a_config_error(change: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        step5_sparse.step5_shape({**BASE, **change}, ["Step5ForCausalLM"])
