"""Issue 39: Mistral Large 4's latents and indexer keys, as vLLM 0.34 reads its params.json and builds them.

No Mistral Large 4 params.json is public. tests/fixtures/models/mistral_large4_params.json is a
Mistral-format params.json with every field vLLM's adapt_config_dict requires of one with a `dsa`
section (vllm/transformers_utils/configs/mistral.py:33-41, :380-445): DeepSeek-V3's latent (512 + 64,
no q-LoRA, which vLLM asserts), 60 layers sharing KV in pairs (`kv_sharing.source_layers_str`), an
indexer on every other layer (`dsa.sharing` "full,shared") of 64 heads of 128, top 2048, a MoE with one
shared expert; its sizes are this test's choice. The cases vary it, and the DSpark cases give it an
`mtp` section (the shape get_mistral_large_4_dspark_config documents, configs/mistral.py:480-490) and
draft with --speculative-config method dspark. vLLM's answers come from its own
code (tests/mistral_large4_oracle.py), run live where the unpacked release is (KVWATCH_VLLM_SRC=<root>)
and recorded in tests/fixtures/mistral_large4_oracle.json by that same script for runs without it; a
live run also checks the record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packed_plan_support import assert_live_oracle_is_its_record, assert_plan_is_vllms, packed_oracle, serve_plan

from kvwatch.boundary.model_source import load_model_source
from kvwatch.errors import ConfigError
from kvwatch.planner import mistral_large4
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.deepseek_v4 import capacity
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.plan import Plan
from kvwatch.values.versions import parse_version

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "mistral_large4_oracle.json"
GiB = 1 << 30
BASE: dict[str, Any] = json.loads((HERE / "fixtures" / "models" / "mistral_large4_params.json").read_text())
_DSA = BASE["dsa"]
_MTP: dict[str, Any] = {"n_layers": 2, "depth": 4, "target_activation_layers": "10,30,59", "ragged_attention": None,
                        "dspark": {"markov_rank": 256}}

CASES: dict[str, dict[str, Any]] = {
    "fixture, TP 1, 40 GiB, 64k": {"params": BASE, "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "fixture, TP 8, 20 GiB, 256k": {"params": BASE, "tp": 8, "kv_memory_bytes": 20 * GiB, "max_model_len": 262144},
    "no KV sharing, an indexer on every layer, no max_position_embeddings, TP 2, 30 GiB, 32k": {
        "params": {**{k: v for k, v in BASE.items() if k not in ("kv_sharing", "max_position_embeddings")},
                   "dsa": {k: v for k, v in _DSA.items() if k != "sharing"}},
        "tp": 2, "kv_memory_bytes": 30 * GiB, "max_model_len": 32768},
    "KV in threes, NoPE threes, an indexer every third layer, TP 4, 10 GiB, 4096": {
        "params": {**BASE, "nope": "nope,nope,nope,rope,rope,rope",
                   "kv_sharing": {"source_layers_str": ",".join(str(i - i % 3) for i in range(60))},
                   "dsa": {**_DSA, "sharing": "full,shared,shared"}},
        "tp": 4, "kv_memory_bytes": 10 * GiB, "max_model_len": 4096},
    "prefixed dsa keys, KV sharing but every layer indexed, yarn, TP 1, 40 GiB, 128k": {
        "params": {**BASE, "yarn": {"factor": 4.0, "original_max_position_embeddings": 65536, "beta": 32, "alpha": 1},
                   "dsa": {"index_topk": 1024, "index_n_heads": 32, "index_head_dim": 128,
                                   "indexer_norm_eps": 1e-06, "indexer_ssmax_scaling": True}},
        "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 131072},
    # the DSpark draft (issue 39): mtp.n_layers dense MLA layers whose latents join the one group
    "DSpark 2 layers, fixture, TP 1, 40 GiB, 64k": {
        "params": {**BASE, "mtp": _MTP}, "dspark": 4, "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "DSpark 3 layers, rnn head, position-specific masks, no KV sharing, TP 8, 20 GiB, 256k": {
        "params": {**{k: v for k, v in BASE.items() if k != "kv_sharing"},
                   "mtp": {**_MTP, "n_layers": 3, "depth": 8, "ragged_attention": "",
                           "dspark": {"markov_rank": 128, "head_type": "rnn", "draft_input": "position_specific"}}},
        "dspark": 8, "tp": 8, "kv_memory_bytes": 20 * GiB, "max_model_len": 262144},
}
for _case in CASES.values():   # two concurrent batches (async scheduling) of max_num_batched_tokens 2048
    _case["max_in_flight_tokens"] = 2 * 2048
    _case["config"] = mistral_large4.hf_config(_case["params"])   # what packed_plan_support plans


_vllm = packed_oracle(HERE / "mistral_large4_oracle.py", CASES, RECORD)


def _shape(params: dict[str, Any]) -> mistral_large4.Large4Shape:
    shape = mistral_large4.large4_shape(mistral_large4.hf_config(params), ["MistralLarge4ForCausalLM"])
    assert shape is not None
    return shape


@pytest.mark.parametrize("name", CASES)
def test_reading_params_json_gives_vllms_config(name: str) -> None:
    config = mistral_large4.hf_config(CASES[name]["params"])
    assert {k: config.get(k) for k in _vllm()[name]["config"]} == _vllm()[name]["config"]


@pytest.mark.parametrize("name", CASES)
def test_specs_group_block_blocks_and_tokens_equal_vllms(name: str) -> None:
    case, want = CASES[name], _vllm()[name]
    shape = _shape(case["params"])
    assert shape.config_reasons == ""
    dspark = bool(case.get("dspark"))
    assert [list(p) for p in mistral_large4.layer_pages(shape, dspark)] == \
        [[n, p, a] for n, _, _, p, _, a in want["specs"]]
    group = mistral_large4.group(shape, dspark)
    assert (mistral_large4.BLOCK_SIZE, want["layout"]) == (want["block_size"], "LBNHC")
    assert [(len(group.pages), group.block_size)] == [(g["layers"], g["block_size"]) for g in want["groups"]]
    assert group.page_bytes == want["bytes_per_block"]
    blocks = case["kv_memory_bytes"] // group.page_bytes
    assert blocks == want["num_blocks"]
    assert capacity((group,), blocks, case["max_model_len"], case["max_in_flight_tokens"])[0] == want["tokens"]


def _plan(case: dict[str, Any], release: str = "0.34.0", card: str = "h100", *flags: str) -> Plan:
    if case.get("dspark"):
        flags = ("--speculative-config", json.dumps({"method": "dspark", "num_speculative_tokens": case["dspark"]}),
                 *flags)
    return serve_plan(case["config"], release, "mistralai/Mistral-Large-4", "-tp", str(case["tp"]),
                      "--kv-cache-memory-bytes", str(case["kv_memory_bytes"]), "--max-model-len",
                      str(case["max_model_len"]), "--max-num-batched-tokens", str(case["max_in_flight_tokens"] // 2),
                      *flags, card=card)


@pytest.mark.parametrize("name", CASES)
def test_the_plan_has_vllms_block_group_blocks_and_tokens(name: str) -> None:
    assert_plan_is_vllms(_plan(CASES[name]), _vllm()[name])


def test_live_oracle_matches_its_record() -> None:
    assert_live_oracle_is_its_record(_vllm, RECORD)


def test_kvwatch_reads_the_checkpoints_params_json(tmp_path: Path) -> None:
    (tmp_path / "params.json").write_text(json.dumps(BASE))
    assert load_model_source(str(tmp_path)).config == CASES["fixture, TP 1, 40 GiB, 64k"]["config"]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral3"}))   # vLLM: params.json only with
    assert load_model_source(str(tmp_path)).config == {"model_type": "mistral3"}     # consolidated weights
    (tmp_path / "consolidated-00001-of-00002.safetensors").write_bytes(b"")
    assert load_model_source(str(tmp_path)).config["architectures"] == ["MistralLarge4ForCausalLM"]
    (tmp_path / "params.json").write_text(json.dumps({k: v for k, v in BASE.items() if k != "max_position_embeddings"}))
    assert load_model_source(str(tmp_path)).config["max_position_embeddings"] == 128_000   # vLLM's default
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mistral3", "text_config": {
        "max_position_embeddings": 32768}}))   # vLLM takes the HF config's where params.json names none
    assert load_model_source(str(tmp_path)).config["max_position_embeddings"] == 32768
    (tmp_path / "params.json").write_text(json.dumps({k: v for k, v in BASE.items() if k != "dsa"}))
    assert load_model_source(str(tmp_path)).config["model_type"] == "mistral3"   # not Mistral Large 4


@pytest.mark.parametrize(("flags", "card", "release", "reason"), [
    ((), "h100", "0.33.0", "vLLM 0.33.0: only 0.34 is checked"),
    ((), "b200", "0.34.0", "cuda SM 10.0: only CUDA SM 9.0 is checked"),
    (("--kv-cache-dtype", "fp8"), "h100", "0.34.0", "a model or latent other than bf16"),
    (("--block-size", "128"), "h100", "0.34.0", "--block-size set"),
    (("-pp", "2"), "h100", "0.34.0", "pipeline parallelism"),
    (("-tp", "5"), "h100", "0.34.0", "TP 5 not dividing the attention heads"),
    (("--speculative-config", '{"method": "dspark", "num_speculative_tokens": 2}'), "h100", "0.34.0",
     "method dspark with no mtp.dspark section in params.json"),
    (("--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 2}'), "h100", "0.34.0",
     "speculative decoding with method 'eagle3' (only DSpark's draft is checked)"),
])
def test_outside_the_scope_the_plan_is_unsure(flags: tuple[str, ...], card: str, release: str, reason: str) -> None:
    plan = _plan(CASES["fixture, TP 1, 40 GiB, 64k"], release, card, *flags)
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


def test_the_latent_dtype_is_a_table() -> None:
    def scope(params: dict[str, Any], *flags: str) -> str:
        settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
        return mistral_large4.out_of_scope(_shape(params), settings, preset("h100"), parse_version("0.34.0"), "bfloat16")
    fp8 = {**BASE, "dsa": {**_DSA, "fp8_kv_cache": True}}
    assert [scope(BASE), scope(BASE, "--kv-cache-dtype", "bfloat16"), scope(fp8, "--kv-cache-dtype", "bfloat16")] \
        == [""] * 3
    assert scope(fp8).startswith("a model or latent other than bf16")


@pytest.mark.parametrize(("change", "reason"), [
    ({"dsa": {**_DSA, "head_dim": 64}}, "index_head_dim 64 (only 128 is checked)"),
    ({"q_lora_rank": 1536}, "a q_lora_rank (vLLM asserts none: attention.py:72)"),
])
def test_config_out_of_scope(change: dict[str, Any], reason: str) -> None:
    assert _shape({**BASE, **change}).config_reasons == reason


@pytest.mark.parametrize("change", [
    {"kv_sharing": {"source_layers_str": "1,0"}}, {"kv_sharing": {"source_layers_str": ",".join(["0", "0", "1"] * 20)}},
    {"nope": "nope,rope"},
    {"dsa": {**_DSA, "sharing": "shared,full"}}, {"dsa": {k: v for k, v in _DSA.items() if k != "topk"}},
    {"moe": None}, {"dsa": {**_DSA, "fp8_indexer": False}}, {"quantization": {"qformat_weight": "int4"}},
    # hostile values: a clear ConfigError, never a TypeError or AttributeError
    {"moe": {**BASE["moe"], "num_shared_experts": "x"}}, {"moe": "x"}, {"kv_sharing": {"source_layers_str": -1}},
    {"kv_sharing": [1]}, {"dsa": "full"}])
def test_a_params_json_vllm_refuses_is_a_config_error(change: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        mistral_large4.hf_config({**BASE, **change})


def test_mistral_large4_is_planned_and_its_dspark_draft_with_it() -> None:
    assert verdict("MistralLarge4ForCausalLM", "0.34.0").handling == PLANNED
    draft = verdict("MistralLarge4DSparkModel", "0.34.0")
    assert draft.handling == DRAFT and "planned with its target (planner/mistral_large4.py)" in draft.reason


def test_the_dspark_draft_adds_one_target_latent_per_layer() -> None:
    target, drafted = _vllm()["fixture, TP 1, 40 GiB, 64k"], _vllm()["DSpark 2 layers, fixture, TP 1, 40 GiB, 64k"]
    assert drafted["specs"][:-2] == target["specs"]
    latent = [s for s in target["specs"] if s[0] == "attn"][0]
    assert drafted["specs"][-2:] == [[*latent[:5], 1]] * 2   # FLASH_ATTN_MLA: no stride alignment
    assert drafted["bytes_per_block"] == target["bytes_per_block"] + 2 * latent[3]
    assert _shape(CASES["DSpark 2 layers, fixture, TP 1, 40 GiB, 64k"]["params"]).dspark_layers == 2
    # an mtp section without a dspark block, or without n_layers, plans no draft (vLLM reads them only to draft)
    assert [_shape({**BASE, "mtp": mtp}).dspark_layers for mtp in (
        {k: v for k, v in _MTP.items() if k != "dspark"}, {k: v for k, v in _MTP.items() if k != "n_layers"})] == [0, 0]


def test_a_windowed_dspark_draft_is_unsure() -> None:
    case = CASES["DSpark 2 layers, fixture, TP 1, 40 GiB, 64k"]
    windowed = {**case, "config": mistral_large4.hf_config({**BASE, "mtp": {**_MTP, "ragged_attention": "4096"}})}
    plan = _plan(windowed)
    assert plan.source == "unknown" and "mtp.ragged_attention" in plan.unknown_layer_types[0]
