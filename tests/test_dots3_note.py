"""Issue 39: Dots3's padded MLA, its indexer keys and their packed groups, as vLLM 0.33 and 0.34 build them.

No Dots3 config.json was found public. tests/fixtures/models/dots3_note_config.json is vLLM's
Dots3NoteConfig (vllm/transformers_utils/configs/dots3_note.py, DeepseekV3Config's defaults under it)
with the fields its layers read that the class leaves unset, at the geometry public Dots3 serving code
checks a checkpoint for (46 layers, 13 DSA and 33 sliding; DSA latent 512 + 64 over 128 heads; sliding
latent 1024 + 64 over 64 heads; sliding_window_size 513; an indexer of 64 heads of 128, top 2048);
which layers are DSA is not published: the fixture takes two of every seven (layers 3, 6, 10, 13, ...),
and max_position_embeddings 131072. The cases vary it. vLLM's answers come from its own code
(tests/dots3_note_oracle.py), run live where the unpacked releases are (KVWATCH_VLLM_SRC=<root>) and
recorded in tests/fixtures/dots3_note_oracle.json by that same script for runs without them; a live
run also checks the record.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packed_plan_support import assert_live_oracle_is_its_record, assert_plan_is_vllms, packed_oracle, packed_plan

from kvwatch.errors import ConfigError
from kvwatch.planner import dots3_note
from kvwatch.planner.architecture_kinds import DRAFT, PLANNED, verdict
from kvwatch.planner.deepseek_v4 import capacity
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.plan import Plan
from kvwatch.values.versions import parse_version

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "dots3_note_oracle.json"
GiB = 1 << 30
BASE: dict[str, Any] = json.loads((HERE / "fixtures" / "models" / "dots3_note_config.json").read_text())
RELEASES = ("0.33.0", "0.34.0")


def _types(dsa: Any) -> list[str]:
    return ["full_attention" if dsa(i) else "sliding_attention" for i in range(46)]


CASES: dict[str, dict[str, Any]] = {
    "fixture, TP 1, 40 GiB, 64k": {"config": BASE, "tp": 1, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
    "fixture, TP 8, 20 GiB, 128k": {"config": BASE, "tp": 8, "kv_memory_bytes": 20 * GiB, "max_model_len": 131072},
    "every 4th layer DSA, TP 2, 30 GiB, 32k": {"config": {**BASE, "layer_types": _types(lambda i: i % 4 == 3)},
                                               "tp": 2, "kv_memory_bytes": 30 * GiB, "max_model_len": 32768},
    "alternating, 10 GiB, 4096": {"config": {**BASE, "layer_types": _types(lambda i: i % 2 == 1)},
                                  "tp": 1, "kv_memory_bytes": 10 * GiB, "max_model_len": 4096},
    "IndexCache: indexer on every 3rd layer, TP 4, 40 GiB, 64k": {
        "config": {**BASE, "index_topk_freq": 3, "index_skip_topk_offset": 1},
        "tp": 4, "kv_memory_bytes": 40 * GiB, "max_model_len": 65536},
}
# The checkpoint's MTP draft, planned with the target: its layers at indices num_hidden_layers on, of mtp_layer_types
# (sliding when unset), "mtp" the speculative tokens k; more than one layer at k > 1 (without
# index_share_for_mtp_iteration in 0.34) keeps k - 1 more tokens in every sliding window.
TWO = {**BASE, "num_nextn_predict_layers": 2, "mtp_layer_types": ["sliding_attention", "full_attention"]}
CASES.update({
    "MTP 1 sliding layer, k 1, TP 1, 40 GiB, 64k": {"config": BASE, "mtp": 1, "tp": 1, "kv_memory_bytes": 40 * GiB,
                                                  "max_model_len": 65536},
    "MTP 1 layer, k 3, TP 8, 20 GiB, 128k": {"config": BASE, "mtp": 3, "tp": 8, "kv_memory_bytes": 20 * GiB,
                                           "max_model_len": 131072},
    "MTP sliding + DSA past IndexCache, k 3, TP 2, 30 GiB, 32k": {
        "config": {**TWO, "index_topk_freq": 3, "index_skip_topk_offset": 1}, "mtp": 3, "tp": 2,
        "kv_memory_bytes": 30 * GiB, "max_model_len": 32768},
    "MTP 3 sliding layers, index_share, k 2, TP 4, 10 GiB, 64k": {
        "config": {**BASE, "num_nextn_predict_layers": 3, "index_share_for_mtp_iteration": True}, "mtp": 2, "tp": 4,
        "kv_memory_bytes": 10 * GiB, "max_model_len": 65536},
})
for _case in CASES.values():   # two concurrent batches (async scheduling) of max_num_batched_tokens 2048
    _case["max_in_flight_tokens"] = 2 * 2048


_vllm = packed_oracle(HERE / "dots3_note_oracle.py", CASES, RECORD)


def _shape(config: dict[str, Any]) -> dots3_note.Dots3Shape:
    shape = dots3_note.dots3_shape(config, config["architectures"])
    assert shape is not None
    return shape


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_specs_groups_block_blocks_and_tokens_equal_vllms(name: str, release: str) -> None:
    case, want = CASES[name], _vllm(release)[name]
    shape = _shape(case["config"])
    assert shape.config_reasons == ""
    mtp = "mtp" in case
    assert [[s.name, s.block_size, s.page_bytes, s.dtype, s.window, align]
            for s, align in dots3_note.layer_specs(shape, mtp)] == \
        [[n, b, p, d, w, a] for n, _, b, p, d, w, a in want["specs"]]
    kv = dots3_note.packing(shape, mtp)
    assert (dots3_note.BLOCK_SIZE, "BLHNC") == (want["block_size"], want["layout"])
    assert [(len(g.pages), g.block_size, g.page_bytes) for g in kv.groups] == \
        [(g["layers"], g["block_size"], g["page_size_bytes"]) for g in want["groups"]]
    assert kv.bytes_per_block == want["bytes_per_block"]
    blocks = case["kv_memory_bytes"] // kv.bytes_per_block
    assert blocks == want["num_blocks"]
    retained = dots3_note.retained_tokens(shape, case["mtp"], parse_version(release)) if mtp else 0
    tokens, _ = capacity(kv.groups, blocks, case["max_model_len"], case["max_in_flight_tokens"], retained)
    assert tokens == want["tokens"]


def _plan(case: dict[str, Any], release: str = "0.34.0", card: str = "h100", *flags: str) -> Plan:
    if case.get("mtp"):   # the command drafts with the checkpoint's MTP head
        flags = ("--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": case["mtp"]}), *flags)
    return packed_plan("rednote-hilab/dots3-note", case, release, card, *flags)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", CASES)
def test_the_plan_has_vllms_block_groups_blocks_and_tokens(name: str, release: str) -> None:
    assert_plan_is_vllms(_plan(CASES[name], release), _vllm(release)[name])


@pytest.mark.parametrize("release", RELEASES)
def test_live_oracle_matches_its_record(release: str) -> None:
    assert_live_oracle_is_its_record(_vllm, RECORD, release)


@pytest.mark.parametrize(("release", "card", "flags", "reason"), [
    ("0.32.0", "h100", (), "vLLM 0.32.0: only 0.33 and 0.34 are checked"),
    ("0.34.0", "b200", (), "cuda SM 10.0: only CUDA SM 9.0 is checked"),
    ("0.34.0", "h100", ("--kv-cache-dtype", "fp8"), "a model or KV cache other than bf16"),
    ("0.34.0", "h100", ("--block-size", "128"), "--block-size set"),
    ("0.34.0", "h100", ("-pp", "2"), "pipeline parallelism"),
    ("0.34.0", "h100", ("--attention-backend", "TRITON_MLA"), "--attention-backend set"),
    ("0.34.0", "h100", ("-tp", "3"), "TP 3 not dividing the attention heads"),
    ("0.34.0", "h100", ("--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 1}'),
     "method 'eagle3': only Dots3's MTP draft is planned"),
])
def test_outside_the_scope_the_plan_is_unsure(release: str, card: str, flags: tuple[str, ...], reason: str) -> None:
    plan = _plan(CASES["fixture, TP 1, 40 GiB, 64k"], release, card, *flags)
    assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


@pytest.mark.parametrize(("change", "reason"), [
    ({}, ""),
    ({"index_topk": None}, "no index_topk (the DSA layers need it: model.py:586-591)"),
    ({"layer_types": None}, "no layer_types (vLLM reads config.layer_types per layer: model.py:525-529); "
                            "not a sliding and DSA hybrid"),
    ({"index_head_dim": 64}, "index_head_dim 64 (only 128 is checked)"),
    ({"swa_kv_lora_rank": 512}, "a sliding latent of 576 (its backend takes 1088 only)"),
    ({"kv_lora_rank": 1536}, "a DSA latent wider than the sliding one (vLLM asserts it: model.py:234)"),
    ({"layer_types": ["sliding_attention"] * 46}, "not a sliding and DSA hybrid"),
])
def test_config_out_of_scope(change: dict[str, Any], reason: str) -> None:
    config = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    assert _shape(config).config_reasons == reason


def test_the_command_scope_is_a_table() -> None:
    shape = _shape(BASE)

    def scope(*flags: str, card: str = "h100", release: str = "0.34.0", dtype: str | None = "bfloat16") -> str:
        settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
        return dots3_note.out_of_scope(shape, settings, preset(card), parse_version(release), dtype)
    assert [scope(), scope(release="0.33.0"), scope("--kv-cache-dtype", "bfloat16"), scope("-tp", "8")] == [""] * 4
    assert scope(dtype="float16") == "a model or KV cache other than bf16"
    assert scope("--disable-hybrid-kv-cache-manager") == "--disable-hybrid-kv-cache-manager"
    assert scope("-tp", "128") == "TP 128 not dividing the attention heads (vLLM asserts it: model.py:373)"


@pytest.mark.parametrize(("change", "indexed"), [
    ({}, [i for i in range(46) if i % 7 in (3, 6)]),
    ({"index_topk_freq": 3, "index_skip_topk_offset": 1}, [3, 6, 24, 27, 45]),
    ({"index_topk_pattern": "S" * 10 + "F" * 36}, [i for i in range(10, 46) if i % 7 in (3, 6)]),
    ({"index_topk_pattern": ["S"] * 10}, [i for i in range(10, 46) if i % 7 in (3, 6)]),   # past its end: kept
])
def test_which_dsa_layers_keep_indexer_keys(change: dict[str, Any], indexed: list[int]) -> None:
    assert [i for i, kept in enumerate(_shape({**BASE, **change}).indexer) if kept] == indexed


def test_dots3_is_planned_and_its_mtp_draft_with_it() -> None:
    for release in ("0.32.0", *RELEASES):
        assert verdict("Dots3NoteForCausalLM", release).handling == PLANNED
        mtp = verdict("Dots3NoteMTPModel", release)
        assert mtp.handling == DRAFT and "planned with its target (planner/dots3_note.py)" in mtp.reason


def test_the_draft_adds_its_layers_and_a_multi_module_one_widens_the_windows() -> None:
    target, drafted = _vllm()["fixture, TP 1, 40 GiB, 64k"], _vllm()["MTP 1 sliding layer, k 1, TP 1, 40 GiB, 64k"]
    assert sum(g["layers"] for g in drafted["groups"]) == sum(g["layers"] for g in target["groups"]) + 1
    assert drafted["num_blocks"] <= target["num_blocks"] and drafted["tokens"] <= target["tokens"]
    shared = "MTP 3 sliding layers, index_share, k 2, TP 4, 10 GiB, 64k"   # one more token a window in 0.33
    assert _vllm("0.33.0")[shared]["tokens"] < _vllm("0.34.0")[shared]["tokens"]
    shape = _shape(TWO)
    assert [s.name for s, _ in dots3_note.layer_specs(shape, mtp=True)[-3:]] == ["attn", "indexer.k_cache", "mla_attn"]
    assert [dots3_note.retained_tokens(shape, k, parse_version("0.34.0")) for k in (1, 2, 5)] == [0, 1, 4]
    shared = _shape({**BASE, "num_nextn_predict_layers": 3, "index_share_for_mtp_iteration": True})
    assert [dots3_note.retained_tokens(shared, 3, parse_version(r)) for r in RELEASES] == [2, 0]


@pytest.mark.parametrize(("change", "reason"), [
    ({"model_type": "dots3"}, "a config.json of model_type 'dots3', which vLLM does not map to its MTP head"),
    ({"num_nextn_predict_layers": 0}, "num_nextn_predict_layers 0: an MTP draft of 1 to 64 layers is planned"),
    ({"mtp_layer_types": ["sliding_attention"] * 2}, "mtp_layer_types not one entry per MTP layer (vLLM refuses it"),
])
def test_an_mtp_head_kvwatch_does_not_plan_is_unsure(change: dict[str, Any], reason: str) -> None:
    assert _shape({**BASE, **change}).mtp_reasons.startswith(reason)
    if "model_type" not in change:   # kvwatch reads a Dots3 config.json by its model_type
        plan = _plan({**CASES["MTP 1 sliding layer, k 1, TP 1, 40 GiB, 64k"], "config": {**BASE, **change}})
        assert plan.source == "unknown" and reason in plan.unknown_layer_types[0]


@pytest.mark.parametrize("change", [{"layer_types": ["full_attention"] * 3}, {"swa_kv_lora_rank": None},
                                    {"sliding_window_size": "513"}, {"num_hidden_layers": None}])
def test_a_config_vllm_cannot_build_is_a_config_error(change: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        dots3_note.dots3_shape({**BASE, **change}, ["Dots3NoteForCausalLM"])
