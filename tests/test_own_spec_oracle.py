"""Families whose layers build KV cache specs of their own (issue 39), against vLLM's own code.

vLLM's answers come from the release's own layer classes (Inkling: InklingModelConfig,
InklingConvState, InklingAttention), spec classes and get_kv_cache_groups, run on this CPU by
scripts/oracle_own_specs.py and recorded per release by tests/record_own_spec_oracle.py into
tests/fixtures/models/own_spec_oracle.json, on real config.json files
(tests/fixtures/models/own_spec_configs.py). kvwatch's plans are computed here; where the unpacked
releases are present (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), the oracle is run again.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.models.own_spec_configs import OWN_SPEC_CONFIGS, text_config
from record_own_spec_oracle import BATCHED, MAX_MODEL_LEN, MEMORY, RELEASES, cases, label, run_oracle
from vllm_sources import unpacked_root

from kvwatch.errors import ConfigError
from kvwatch.planner.architecture_kinds import PLANNED, verdict
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.inkling import inkling_layers
from kvwatch.planner.layers import FULL, SLIDING
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.architectures import ARCHITECTURES

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "models" / "own_spec_oracle.json").read_text())
CASES = {label(c): c for c in cases()}


def _plan(case: dict[str, Any], release: str) -> Plan:
    argv = ["vllm", "serve", "m", "--kv-cache-memory-bytes", str(MEMORY), "--max-model-len", str(MAX_MODEL_LEN),
            "--max-num-batched-tokens", str(BATCHED), "--block-size", str(case["block_size"]),
            "--tensor-parallel-size", str(case["tp"])]
    if case["kv_cache_dtype"] != "auto":
        argv += ["--kv-cache-dtype", case["kv_cache_dtype"]]
    if case["dtype"] != "bfloat16":
        argv += ["--dtype", case["dtype"]]
    if case["disable_hybrid"]:
        argv += ["--disable-hybrid-kv-cache-manager"]
    # the real config.json, its text_config as the case has it (a derived case empties local_layer_ids)
    config = {**OWN_SPEC_CONFIGS[case["name"].split("+")[0]]["config"], "text_config": case["config"]}
    geometry = geometry_from_config(config, release)
    return make_plan(geometry, EngineCommand.parse(argv).settings(), preset("h100"), ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release)))


def _rows() -> list[tuple[str, str, Any]]:
    return [(release, row["case"], row["vllm"]) for release, rows in FIXTURE["releases"].items() for row in rows]


def test_the_fixture_covers_both_releases_and_every_case() -> None:
    assert tuple(FIXTURE["releases"]) == RELEASES and FIXTURE["memory"] == MEMORY
    for rows in FIXTURE["releases"].values():
        assert [row["case"] for row in rows] == list(CASES)


@pytest.mark.parametrize(("release", "case_label", "vllm"), _rows())
def test_plan_equals_vllms_groups_blocks_and_tokens(release: str, case_label: str, vllm: Any) -> None:
    """At a 40 GiB budget: the groups, bytes per block, blocks and logged tokens of vLLM's own
    planning equal kvwatch's; where vLLM's layer asserts (TP beyond the rings' KV heads), kvwatch
    refuses the configuration; a float16 model gets the rings' bfloat16 assertion as a refusal."""
    case = CASES[case_label]
    if isinstance(vllm, str) and case["dtype"] != "bfloat16":
        # the plan predicts vLLM's assertion, in its words, certain, with the flag that avoids it
        refused = [w for w in _plan(case, release).warnings if "sconv SWA cache" in w.message]
        assert len(refused) == 1 and refused[0].certain
        assert refused[0].message.startswith(vllm.removeprefix("error: "))
        assert refused[0].fix.as_flags() == {"--dtype": "bfloat16"}
        return
    if isinstance(vllm, str) and case["disable_hybrid"]:
        refused = [w for w in _plan(case, release).warnings if "same window size" in w.message]
        assert len(refused) == 1 and refused[0].certain
        assert refused[0].message.startswith(vllm.removeprefix("error: "))
        assert refused[0].fix.as_flags() == {"--disable-hybrid-kv-cache-manager": None}
        return
    if isinstance(vllm, str):
        assert vllm.startswith("error: AssertionError: sconv SWA cache supports tp_size <= num_kv_heads")
        with pytest.raises(ConfigError, match="tensor parallelism up to its 8 KV heads"):
            _plan(case, release)
        return
    plan = _plan(case, release)
    assert not plan.will_fail
    # the engine's block size: the smallest group's, the rings' (promoted: the full layers')
    assert plan.block_size == min(g["block_size"] for g in vllm["groups"])
    assert ("rings" in plan.block_size_source) == (plan.block_size < case["block_size"])
    assert (plan.kv_cache_groups, plan.bytes_per_block, plan.num_blocks, plan.kv_cache_tokens) == \
        (len(vllm["groups"]), vllm["bytes_per_block"], vllm["num_blocks"], vllm["tokens"])
    assert plan.unknown_layer_types == ()


@pytest.mark.parametrize(("release", "case_label", "vllm"),
                         [r for r in _rows() if not isinstance(r[2], str) and not CASES[r[1]]["disable_hybrid"]])
def test_each_layers_page_equals_vllms_spec(release: str, case_label: str, vllm: Any) -> None:
    """The pages of vLLM's specs before unification: the ring's (block sconv_kernel_size, window
    sconv_kernel_size, bfloat16 whatever the KV dtype) and the attention layers' (the block size in
    force; sliding ones on local_layer_ids with window sliding_window_size)."""
    case = CASES[case_label]
    layers = inkling_layers(case["config"], case["config"]["num_hidden_layers"])
    dtype_bytes = 1 if case["kv_cache_dtype"] == "fp8" else 2
    kvwatch: dict[tuple[str, int, int, int | None], int] = {}
    for ring in layers.rings:
        key = ("SlidingWindowSpec", ring.kernel, ring.page_bytes(case["tp"]), ring.kernel)
        kvwatch[key] = kvwatch.get(key, 0) + 1
    for local, heads, size in zip(layers.local, layers.kv_heads, layers.head_sizes, strict=True):
        page = case["block_size"] * max(1, heads // case["tp"]) * 2 * size * dtype_bytes
        key = ("SlidingWindowSpec", case["block_size"], page, layers.window) if local else \
            ("FullAttentionSpec", case["block_size"], page, None)
        kvwatch[key] = kvwatch.get(key, 0) + 1
    vllms = {(s["class"], s["block_size"], s["page_bytes"], s["window"]): s["layers"] for s in vllm["specs"]}
    assert kvwatch == vllms


def test_inkling_small_figures() -> None:
    """Inkling-Small at TP 1, bf16: 42 rings of 4 tokens x 8 heads x 2,048 (2 x 128 + 2 x 4096 / 8 =
    1,280, rounded up to a power of two) x 2 B = 131,072 B, twice the 16-token attention page, so
    vLLM scales the attention blocks to 32: 12 groups of 7 layers, 917,504 B a block."""
    layers = inkling_layers(text_config("inkling_small"), 42)
    assert {r.head_size for r in layers.rings} == {2048} and layers.rings[0].page_bytes(1) == 131_072
    assert sum(layers.local) == 35 and layers.window == 512
    geometry = geometry_from_config(OWN_SPEC_CONFIGS["inkling_small"]["config"], "0.33.0")
    assert geometry.layout.kinds.count(SLIDING) == 35 and geometry.layout.kinds.count(FULL) == 7
    assert len(geometry.layout.conv_rings) == 42
    assert FIXTURE["releases"]["0.33.0"][0]["vllm"]["bytes_per_block"] == 917_504
    assert {g["block_size"] for g in FIXTURE["releases"]["0.33.0"][0]["vllm"]["groups"]} == {4, 32}


def test_inkling_flagships_rings_match_across_layer_kinds() -> None:
    """The flagship's sliding layers have 16 KV heads, its global ones 8: the packed widths (1,024 and
    2,048 after rounding) make every ring's page the same 131,072 B, as the class intends."""
    layers = inkling_layers(text_config("inkling"), 66)
    assert {r.head_size for r in layers.rings} == {1024, 2048}
    assert {r.page_bytes(1) for r in layers.rings} == {131_072}


@pytest.mark.parametrize("release", RELEASES)
def test_inkling_architectures_are_planned(release: str) -> None:
    inkling = [a for a in ARCHITECTURES[release] if a.startswith("Inkling")]
    assert inkling and all(verdict(a, release).handling == PLANNED for a in inkling)


def _source_root() -> Path | None:
    return unpacked_root(RELEASES, "vllm/models/inkling")


@pytest.mark.skipif(_source_root() is None, reason="the unpacked releases (KVWATCH_VLLM_SRC) are not here")
@pytest.mark.parametrize("release", RELEASES)
def test_the_recorded_answers_are_vllms_own(release: str) -> None:
    pytest.importorskip("torch")
    root = _source_root()
    assert root is not None
    live = run_oracle(root / release, cases())
    assert live == [row["vllm"] for row in FIXTURE["releases"][release]]


@pytest.mark.parametrize(("field", "value", "named"), [
    ("local_layer_ids", "0,1,2", "local_layer_ids"), ("local_layer_ids", [0, True], "local_layer_ids"),
    ("sconv_kernel_size", 0, "sconv_kernel_size"), ("swa_num_key_value_heads", "8", "swa_num_key_value_heads"),
    ("hidden_size", None, "hidden_size")])
def test_a_malformed_inkling_config_names_its_field(field: str, value: Any, named: str) -> None:
    """A config.json vLLM's InklingModelConfig could not read is a ConfigError naming the field, not a
    crash or a silent default."""
    config = OWN_SPEC_CONFIGS["inkling_small"]["config"]
    text = {**text_config("inkling_small"), field: value}
    if value is None:
        del text[field]
    with pytest.raises(ConfigError, match=named):
        geometry_from_config({**config, "text_config": text}, "0.33.0")
