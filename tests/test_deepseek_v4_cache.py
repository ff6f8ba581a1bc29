"""Issue 39: DeepSeek-V4's five cache kinds and their packed groups, as vLLM 0.34 builds them.

vLLM's answers come from its own code (tests/deepseek_v4_oracle.py: transformers' DeepseekV4Config,
the layers' get_kv_cache_spec methods, get_kv_cache_groups and get_kv_cache_config_from_groups),
run live where the unpacked releases are (KVWATCH_VLLM_SRC=<root>, holding <root>/<release>/vllm)
and recorded in tests/fixtures/deepseek_v4_oracle.json by that same script for runs without them; a
live run also checks the record. kvwatch's plan (make_plan) is held to the same figures at a fixed
KV budget, at TP 1 and 2, with fp8 and auto KV, with and without MTP. The config is DeepSeek-V4-Flash's published config.json
(tests/fixtures/models/newest.py, with its source).
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import oracle_answers, release_tree

from kvwatch.planner import deepseek_v4
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.weights import gpu_weights_bytes
from kvwatch.values.versions import parse_version
from tests.fixtures.models.newest import NEWEST

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "deepseek_v4_oracle.json"
RELEASES = ("0.33.0", "0.34.0")
GiB = 1 << 30
FLASH = NEWEST["deepseek_v4_flash"]["config"]

# TP and --kv-cache-dtype auto/fp8 change no spec (one TP-replicated latent head; both dtypes become
# fp8_ds_mla), so the cases vary the budget and MTP; the oracle is asked each combination anyway.
# max_in_flight_tokens: two concurrent batches (async scheduling) of max_num_batched_tokens.
CASES: dict[str, dict[str, Any]] = {
    "issue 39 run: MTP, 10.29 GiB, 1M": {"config": FLASH, "mtp": True, "kv_memory_bytes": int(10.29 * GiB),
                                         "max_model_len": 1048576, "max_in_flight_tokens": 2 * 8192},
    "no MTP, 10.29 GiB, 1M": {"config": FLASH, "mtp": False, "kv_memory_bytes": int(10.29 * GiB),
                              "max_model_len": 1048576, "max_in_flight_tokens": 2 * 8192},
    "no MTP, 40 GiB, 128k": {"config": FLASH, "mtp": False, "kv_memory_bytes": 40 * GiB,
                             "max_model_len": 131072, "max_in_flight_tokens": 2 * 2048},
    "MTP, 3 GiB, 4096, batches of 16k": {"config": FLASH, "mtp": True, "kv_memory_bytes": 3 * GiB,
                                         "max_model_len": 4096, "max_in_flight_tokens": 2 * 16384},
    # the DSpark draft (issue 39): n_mtp_layers sliding-only layers, 3 where config.json names none
    "DSpark 3 layers, 10.29 GiB, 1M": {"config": FLASH, "mtp": False, "dspark": True,
                                       "kv_memory_bytes": int(10.29 * GiB), "max_model_len": 1048576,
                                       "max_in_flight_tokens": 2 * 8192},
    "DSpark n_mtp_layers 2, 3 GiB, 4096, batches of 16k": {
        "config": {**FLASH, "n_mtp_layers": 2}, "mtp": False, "dspark": True, "kv_memory_bytes": 3 * GiB,
        "max_model_len": 4096, "max_in_flight_tokens": 2 * 16384},
}


@cache
def _vllm(release: str = "0.34.0") -> dict[str, dict[str, Any]]:
    return oracle_answers(HERE / "deepseek_v4_oracle.py", release, CASES, RECORD)


def _shape(case: dict[str, Any]) -> deepseek_v4.DeepseekV4Shape:
    shape = deepseek_v4.deepseek_v4_shape(case["config"], case["config"]["architectures"])
    assert shape is not None
    return shape


def _specs(case: dict[str, Any]) -> list[deepseek_v4.CacheSpec]:
    return [s for layer in deepseek_v4.layer_specs(_shape(case), case["mtp"], case.get("dspark", False)) for s in layer]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("label", list(CASES))
def test_groups_and_blocks_equal_vllms(release: str, label: str) -> None:
    case, truth = CASES[label], _vllm(release)[label]
    groups = deepseek_v4.packed_groups(_specs(case))
    assert [(g.block_size, len(g.pages), g.page_bytes) for g in groups] == \
        [(g["block_size"], g["layers"], g["page_size_bytes"]) for g in truth["groups"]]
    blocks = deepseek_v4.num_blocks(_shape(case), case["kv_memory_bytes"], case["mtp"], case.get("dspark", False))
    assert blocks == truth["num_blocks"]
    tokens, _ = deepseek_v4.capacity(groups, blocks, case["max_model_len"], case["max_in_flight_tokens"])
    assert tokens == truth["tokens"]


@pytest.mark.parametrize("label", list(CASES))
def test_each_kind_page_block_and_dtype_equal_vllms(label: str) -> None:
    names = {"swa_cache": "swa_cache", "latent": "latent", "indexer": "indexer.k_cache",
             "indexer.state": "indexer.compressor.state_cache", "state": "compressor.state_cache"}
    ours: dict[str, dict[str, Any]] = {}
    for spec in _specs(CASES[label]):
        entry = ours.setdefault(f"{names[spec.name]} block {spec.block_size}",
                                {"page_size_bytes": [], "dtype": spec.dtype, "window": spec.window})
        entry["page_size_bytes"].append(spec.page_bytes)
    assert ours == _vllm()[label]["kinds"]


def test_the_packing_splits_the_sliding_layers_in_two() -> None:
    """43 sliding caches, 21 + 21 block-4 states, 20 block-8 states: vLLM packs 22 layers a group."""
    truth = _vllm()["no MTP, 10.29 GiB, 1M"]
    assert [g["layers"] for g in truth["groups"]][:2] == [22, 21]
    assert len(deepseek_v4.packed_groups(_specs(CASES["no MTP, 10.29 GiB, 1M"]))) == len(truth["groups"]) == 5


@pytest.mark.skipif(not all(release_tree(r) for r in RELEASES), reason="set KVWATCH_VLLM_SRC to the unpacked releases")
def test_the_record_is_what_vllms_code_answers_now() -> None:
    assert json.loads(RECORD.read_text()) == {r: _vllm(r) for r in RELEASES}


def _plan(case: dict[str, Any], release: str, tp: int, kv_dtype: str, card: str = "h100") -> Plan:
    flags = ["-tp", str(tp), "--kv-cache-memory-bytes", str(case["kv_memory_bytes"]), "--kv-cache-dtype", kv_dtype,
             "--max-model-len", str(case["max_model_len"]),
             "--max-num-batched-tokens", str(case["max_in_flight_tokens"] // 2)]
    if case["mtp"]:
        flags += ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    if case.get("dspark"):   # vLLM takes the draft's block size when no num_speculative_tokens is given
        flags += ["--speculative-config", '{"method": "dspark"}']
    settings = EngineCommand.parse(["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash", *flags]).settings()
    return make_plan(geometry_from_config(case["config"], release), settings, preset(card), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("kv_dtype", ["fp8", "auto"])
@pytest.mark.parametrize("label", list(CASES))
def test_the_plan_has_vllms_groups_blocks_and_tokens(release: str, tp: int, kv_dtype: str, label: str) -> None:
    """TP and the KV dtype change no DeepSeek-V4 spec: one TP-replicated latent head, fp8_ds_mla for both."""
    truth = _vllm(release)[label]
    plan = _plan(CASES[label], release, tp, kv_dtype)
    assert (plan.kv_cache_groups, plan.bytes_per_block, plan.num_blocks, plan.kv_cache_tokens) == \
        (len(truth["groups"]), max(g["page_size_bytes"] for g in truth["groups"]), truth["num_blocks"], truth["tokens"])
    assert plan.source == "exact" and plan.unknown_layer_types == () and not plan.will_fail


def test_the_issue_run_plans_its_logged_kv_and_no_certain_failure() -> None:
    """Issue 39: MTP 2, TP 2 on RTX PRO 6000 (SM 12.0), fp8 KV, 1M context logged 10.29 GiB a rank.
    kvwatch planned 0 KV and a certain TRITON_MLA failure whose fix rewrote --kv-cache-dtype."""
    plan = _plan(CASES["issue 39 run: MTP, 10.29 GiB, 1M"], "0.34.0", 2, "fp8", "rtx-pro-6000")
    assert plan.backend == "FLASHINFER_MLA_SPARSE_DSV4" and plan.num_blocks == 11_024
    assert abs(plan.planned_kv_bytes - 10.29 * GiB) < 0.001 * GiB
    assert not plan.will_fail and plan.fixes().empty


@pytest.mark.parametrize("release", RELEASES)
def test_deepseek_v4_is_planned_and_its_dspark_draft_with_it(release: str) -> None:
    for arch in ("DeepseekV4ForCausalLM", "DeepseekV4ForConditionalGeneration", "DeepSeekV4MTPModel"):
        assert verdict(arch, release).handling == PLANNED
    draft = verdict("DSparkDraftModel", release)
    assert draft.handling == DRAFT and "planned with its target (planner/deepseek_v4.py)" in draft.reason


def test_the_dspark_draft_adds_its_sliding_layers_to_the_targets() -> None:
    target, drafted = _vllm()["no MTP, 10.29 GiB, 1M"], _vllm()["DSpark 3 layers, 10.29 GiB, 1M"]
    assert sum(g["layers"] for g in drafted["groups"]) == sum(g["layers"] for g in target["groups"]) + 3
    swa = target["kinds"]["swa_cache block 64"]["page_size_bytes"]   # every layer's sliding latent: one page size
    assert drafted["kinds"]["swa_cache block 64"]["page_size_bytes"] == swa + swa[:1] * 3
    assert {k: v for k, v in drafted["kinds"].items() if k != "swa_cache block 64"} == \
        {k: v for k, v in target["kinds"].items() if k != "swa_cache block 64"}
    assert _shape(CASES["DSpark n_mtp_layers 2, 3 GiB, 4096, batches of 16k"]).dspark_layers == 2
    assert _shape({"config": {**FLASH, "n_mtp_layers": 0}}).dspark_layers == 3   # `or 3` (dspark.py:106)


def test_another_draft_or_an_unchecked_release_is_unsure() -> None:
    case = CASES["no MTP, 10.29 GiB, 1M"]
    settings = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory-bytes", str(case["kv_memory_bytes"]),
                                    "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 4}']).settings()
    drafted = make_plan(geometry_from_config(FLASH, "0.34.0"), settings, preset("h100"), ruleset_for("0.34.0"),
                        MemoryInputs(vllm_version=parse_version("0.34.0")))
    assert drafted.source == "unknown" and "'eagle3'" in drafted.unknown_layer_types[0]
    older = make_plan(geometry_from_config(FLASH, "0.32.0"), settings, preset("h100"), ruleset_for("0.32.0"),
                      MemoryInputs(vllm_version=parse_version("0.32.0")))
    assert older.source == "unknown" and "not vLLM 0.32.0" in older.unknown_layer_types[0]


def test_the_issue_run_estimated_is_within_a_tenth_of_its_logged_kv() -> None:
    """Issue 39's GPU start-up (DeepSeek-V4-Flash, MTP 2, TP 2 on RTX PRO 6000, fp8 KV, 1M context)
    logged 10.29 GiB of KV cache a rank; kvwatch planned 0 (its routed experts counted as FP8 bytes,
    not the MXFP4 vLLM loads them as) and a certain failure."""
    flags = ["-tp", "2", "--kv-cache-dtype", "fp8", "--max-model-len", "1048576",
             "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    settings = EngineCommand.parse(["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash", *flags]).settings()
    plan = make_plan(geometry_from_config(FLASH, "0.34.0"), settings, preset("rtx-pro-6000"), ruleset_for("0.34.0"),
                     MemoryInputs(vllm_version=parse_version("0.34.0")))
    assert plan.source == "estimated" and not plan.will_fail and plan.fixes(certain_only=False).empty
    assert abs(plan.planned_kv_bytes / (10.29 * GiB) - 1) < 0.10


def test_the_routed_experts_weigh_as_mxfp4_and_the_rest_as_fp8() -> None:
    geometry = geometry_from_config(FLASH, "0.34.0")
    assert geometry.quantization is not None and geometry.quantization["expert_dtype"] == "fp4"
    base = geometry_from_config({**FLASH, "expert_dtype": "fp8"}, "0.34.0")   # Flash-Base: FP8 experts
    count = geometry.weight_count
    assert count is not None
    experts = count.expert_matrices * 3 * count.hidden_size * count.moe_width
    fp4 = gpu_weights_bytes(count, geometry.quantization, 2)
    fp8 = gpu_weights_bytes(count, base.quantization, 2)
    # FP8 experts carry a float32 scale per 128 x 128 block (the config's weight_block_size)
    fp8_rate = 1 + 4 / (128 * 128)
    assert fp8 - fp4 == int(experts * (fp8_rate - deepseek_v4.MXFP4_BYTES_PER_PARAM))


def test_another_backend_than_cudas_default_is_unsure() -> None:
    """FLASHINFER_MLA_SPARSE_DSV4 on SM 10.0 stores plain rows (use_fp8_ds_mla_layout False): other pages."""
    settings = EngineCommand.parse(["vllm", "serve", "m", "--kv-cache-memory-bytes", str(10 * GiB),
                                    "--attention-backend", "FLASHINFER_MLA_SPARSE_DSV4"]).settings()
    plan = make_plan(geometry_from_config(FLASH, "0.34.0"), settings, preset("b200"), ruleset_for("0.34.0"),
                     MemoryInputs(vllm_version=parse_version("0.34.0")))
    assert plan.source == "unknown" and "FLASHINFER_MLA_SPARSE_DSV4" in plan.unknown_layer_types[0]


@pytest.mark.parametrize("flags,certain", [
    (["--kv-cache-memory-bytes", "1000000"], True),      # the flag sets it: a certain refusal
    (["-tp", "1"], False),                               # estimated: 284B parameters on one H100 leave none
])
def test_a_packed_plan_with_no_block_says_so(flags: list[str], certain: bool) -> None:
    """The packed path (DeepSeek-V4, V4.1, Step5, GLM-5-Next) warns of no KV memory as any other plan does."""
    settings = EngineCommand.parse(["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash", *flags]).settings()
    plan = make_plan(geometry_from_config(FLASH, "0.34.0"), settings, preset("h100"), ruleset_for("0.34.0"),
                     MemoryInputs(vllm_version=parse_version("0.34.0")))
    assert plan.num_blocks <= 1
    found = [w for w in plan.warnings if w.kind == "no_kv_cache_memory"]
    assert len(found) == 1 and "no memory is left for KV cache blocks" in found[0].message
    assert found[0].certain == certain and plan.will_fail == certain
