"""Issue 39: DeepSeek-V4.1's caches and their packed groups on CUDA SM 9.x, as vLLM 0.34 builds them.

vLLM's answers come from its own code (tests/deepseek_v41_oracle.py: the V4.1 layers' get_kv_cache_spec
methods, the platform's block-size choice for their backends, get_kv_cache_groups,
get_kv_cache_config_from_groups and get_kv_cache_capacity), run live where the unpacked release is
(KVWATCH_VLLM_SRC=<root>, holding <root>/0.34.0/vllm) and recorded in
tests/fixtures/deepseek_v41_oracle.json by that same script for runs without it; a live run also checks
the record. kvwatch's plan (make_plan) is held to the same groups, block, blocks and tokens at a fixed
KV budget on an H100 (SM 9.0). The config is DeepSeek-V4.1-Flash's published config.json
(tests/fixtures/models/newest.py, with its source).
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import oracle_answers, release_tree

from kvwatch.errors import ConfigError
from kvwatch.planner import deepseek_v4, deepseek_v41
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from tests.fixtures.models.newest import NEWEST

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "deepseek_v41_oracle.json"
RELEASE = "0.34.0"
GiB = 1 << 30
FLASH = NEWEST["deepseek_v41_flash"]["config"]

# max_in_flight_tokens: two concurrent batches (async scheduling) of max_num_batched_tokens.
CASES: dict[str, dict[str, Any]] = {
    "10.29 GiB, 1M, batches of 8k": {"config": FLASH, "kv_memory_bytes": int(10.29 * GiB),
                                     "max_model_len": 1048576, "max_in_flight_tokens": 2 * 8192},
    "40 GiB, 128k, batches of 2k": {"config": FLASH, "kv_memory_bytes": 40 * GiB,
                                    "max_model_len": 131072, "max_in_flight_tokens": 2 * 2048},
    "3 GiB, 4096, batches of 16k": {"config": FLASH, "kv_memory_bytes": 3 * GiB,
                                    "max_model_len": 4096, "max_in_flight_tokens": 2 * 16384},
    # the DSpark draft (issue 39): the config's 3 num_nextn_predict_layers as sliding layers, k wider rings
    "DSpark k 5 (the config's block), 10.29 GiB, 1M": {"config": FLASH, "dspark": 5,
                                                       "kv_memory_bytes": int(10.29 * GiB),
                                                       "max_model_len": 1048576, "max_in_flight_tokens": 2 * 8192},
    "DSpark k 15, 3 GiB, 4096, batches of 16k": {"config": FLASH, "dspark": 15, "kv_memory_bytes": 3 * GiB,
                                                 "max_model_len": 4096, "max_in_flight_tokens": 2 * 16384},
    "DSpark n_mtp_layers 2, k 2, 40 GiB, 128k": {
        "config": {**FLASH, "text_config": {**FLASH["text_config"], "n_mtp_layers": 2}}, "dspark": 2,
        "kv_memory_bytes": 40 * GiB, "max_model_len": 131072, "max_in_flight_tokens": 2 * 2048},
}
# the kvwatch command of each case: its budget, length and batch (two in flight, as above)
ARGS = {label: ("--kv-cache-memory-bytes", str(c["kv_memory_bytes"]), "--max-model-len", str(c["max_model_len"]),
                "--max-num-batched-tokens", str(c["max_in_flight_tokens"] // 2),
                # k 5 is the config's dspark_block_size: the command leaves it to vLLM
                *(("--speculative-config", json.dumps({"method": "dspark"} if c["dspark"] == 5 else
                                                      {"method": "dspark", "num_speculative_tokens": c["dspark"]}))
                  if c.get("dspark") else ()))
        for label, c in CASES.items()}


@cache
def _vllm() -> dict[str, dict[str, Any]]:
    return oracle_answers(HERE / "deepseek_v41_oracle.py", RELEASE, CASES, RECORD)


def _shape(config: dict[str, Any] = FLASH) -> deepseek_v41.DeepseekV41Shape:
    shape = deepseek_v41.deepseek_v41_shape(config["text_config"], config["architectures"])
    assert shape is not None
    return shape


def _plan(label: str, *extra: str, device: str = "h100", release: str = RELEASE) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", *ARGS[label], *extra]).settings()
    return make_plan(geometry_from_config(CASES[label]["config"], release), settings, preset(device), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


@pytest.mark.parametrize("label", list(CASES))
def test_specs_groups_and_blocks_equal_vllms(label: str) -> None:
    case, truth = CASES[label], _vllm()[label]
    assert truth["block_size"] == deepseek_v41.BLOCK
    shape, k = _shape(case["config"]), case.get("dspark", 0)
    specs = [s for layer in deepseek_v41.layer_specs(shape, k) for s in layer]
    assert [(s.block_size, s.page_bytes) for s in specs] == [(b, p) for _, _, b, p in truth["specs"]]
    groups = deepseek_v41.groups_for(shape, k)
    assert [(g.block_size, len(g.pages), g.page_bytes) for g in groups] == \
        [(g["block_size"], g["layers"], g["page_size_bytes"]) for g in truth["groups"]]
    blocks = deepseek_v41.num_blocks(shape, case["kv_memory_bytes"], k)
    assert blocks == truth["num_blocks"]
    tokens, _ = deepseek_v4.capacity(groups, blocks, case["max_model_len"], case["max_in_flight_tokens"])
    assert tokens == truth["tokens"]


@pytest.mark.parametrize("label", list(CASES))
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("tp", ["1", "2"])   # one latent head, replicated: no spec changes with TP
def test_the_plan_on_an_h100_is_vllms(label: str, kv_dtype: str, tp: str) -> None:
    truth = _vllm()[label]
    plan = _plan(label, "--kv-cache-dtype", kv_dtype, "-tp", tp)
    assert plan.source == "exact" and not plan.unknown_layer_types
    assert plan.backend == deepseek_v41.BACKEND and plan.block_size == truth["block_size"]
    assert plan.kv_cache_groups == len(truth["groups"])
    assert plan.bytes_per_block == max(g["page_size_bytes"] for g in truth["groups"])
    assert (plan.num_blocks, plan.kv_cache_tokens) == (truth["num_blocks"], truth["tokens"])


@pytest.mark.parametrize(("extra", "device", "release", "says"), [
    ((), "b200", RELEASE, "SM 10.0: only CUDA SM 9.x"),
    (("--attention-backend", "FLASHINFER_MLA_SPARSE_DSV41"), "h100", RELEASE, "only FlashMLA sparse"),
    (("--kv-cache-dtype", "bfloat16"), "h100", RELEASE, "only the fp8_ds_mla layout"),
    (("--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 4}'), "h100", RELEASE, "'eagle3'"),
    (("--block-size", "128"), "h100", RELEASE, "--block-size 128"),
    ((), "h100", "0.33.0", "not vLLM 0.33.0"),
])
def test_outside_the_checked_scope_the_plan_says_why(extra: tuple[str, ...], device: str, release: str,
                                                    says: str) -> None:
    plan = _plan("40 GiB, 128k, batches of 2k", *extra, device=device, release=release)
    assert plan.source == "unknown" and any(says in r for r in plan.unknown_layer_types)


def test_v41_is_planned_and_its_dspark_draft_with_it() -> None:
    assert verdict("DeepseekV41ForCausalLM", RELEASE).handling == PLANNED
    draft = verdict("DSparkV41DraftModel", RELEASE)
    assert draft.handling == DRAFT and "planned with its target (planner/deepseek_v41.py)" in draft.reason


def test_the_dspark_draft_adds_sliding_layers_and_widens_the_rings() -> None:
    target, drafted = _vllm()["10.29 GiB, 1M, batches of 8k"], _vllm()["DSpark k 5 (the config's block), 10.29 GiB, 1M"]
    assert len(drafted["specs"]) == len(target["specs"]) + 3   # one sliding cache each, no source past the backbone
    rings = {tuple(s[1:]) for s in drafted["specs"] if s[0].endswith("compressor.state_cache")}
    assert {b for _, b, _ in rings} == {deepseek_v41.ring_rows(5)} == {8}
    wide = {s[2] for s in _vllm()["DSpark k 15, 3 GiB, 4096, batches of 16k"]["specs"]
            if s[0].endswith("compressor.state_cache")}
    assert wide == {deepseek_v41.ring_rows(15)} == {32}


def test_a_dspark_draft_with_no_block_is_unsure() -> None:
    config = {**FLASH, "text_config": {k: v for k, v in FLASH["text_config"].items() if k != "dspark_block_size"}}
    settings = EngineCommand.parse(["vllm", "serve", "m", *ARGS["40 GiB, 128k, batches of 2k"],
                                    "--speculative-config", '{"method": "dspark"}']).settings()
    plan = make_plan(geometry_from_config(config, RELEASE), settings, preset("h100"), ruleset_for(RELEASE),
                     MemoryInputs(vllm_version=parse_version(RELEASE)))
    assert plan.source == "unknown" and "names no DSpark block" in plan.unknown_layer_types[0]


@pytest.mark.parametrize(("change", "says"), [
    ({"compress_ratios": [4] * 40}, "compress ratio 4"),
    ({"kv_source_layer_ids": []}, "kv_source_layer_ids"),
    ({"index_source_layer_ids": "2"}, "index_source_layer_ids"),
])
def test_a_config_vllm_refuses_is_refused(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        deepseek_v41.deepseek_v41_shape({**FLASH["text_config"], **change}, FLASH["architectures"])


def test_the_record_is_the_live_oracle() -> None:
    if release_tree(RELEASE) is None:
        pytest.skip("vLLM 0.34.0 is not unpacked (KVWATCH_VLLM_SRC)")
    assert json.loads(RECORD.read_text()) == {RELEASE: _vllm()}
