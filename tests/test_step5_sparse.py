"""Issue 39: Step5's caches and their packed groups, as vLLM 0.34 builds them, on one scope.

No Step5 config.json is public: tests/fixtures/models/step5_config.json is vLLM 0.34.0's Step5Config
defaults (vllm/transformers_utils/configs/step5.py) with the three fields the DSA layers need set:
head_dim 192 (the only one STEP5_DSA takes; the default, hidden_size // heads, is 128), a
sliding_window of 512 and an empty sparse_config section (vLLM refuses a checkpoint without one).
The cases vary it. vLLM's answers come from its own code (tests/step5_oracle.py), run live where the
unpacked releases are (KVWATCH_VLLM_SRC=<root>) and recorded in tests/fixtures/step5_oracle.json by
that same script for runs without them; a live run also checks the record.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from vllm_sources import oracle_answers, release_tree

from kvwatch.planner import step5_sparse

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "step5_oracle.json"
GiB = 1 << 30
BASE: dict[str, Any] = json.loads((HERE / "fixtures" / "models" / "step5_config.json").read_text())
ALTERNATING = ["sliding_attention", "full_attention"] * 24

CASES: dict[str, dict[str, Any]] = {
    "fixture, TP 1, 40 GiB": {"config": BASE, "tp": 1, "kv_memory_bytes": 40 * GiB},
    "fixture, TP 2, 20 GiB": {"config": BASE, "tp": 2, "kv_memory_bytes": 20 * GiB},
    "no window: every layer DSA, TP 8, 10 GiB": {"config": {**BASE, "sliding_window": None}, "tp": 8,
                                                 "kv_memory_bytes": 10 * GiB},
    "3 sliding : 1 DSA, TP 1, 40 GiB": {"config": {**BASE, "layer_types": ["sliding_attention"] * 3 * 12
                                                   + ["full_attention"] * 12}, "tp": 1, "kv_memory_bytes": 40 * GiB},
    "sliding layers of 4 KV heads (attention_other_setting), TP 2, 30 GiB": {
        "config": {**BASE, "layer_types": ALTERNATING, "swa_num_attention_heads": 64,
                   "attention_other_setting": {"attention_type": "sliding_attention", "num_attention_heads": 64,
                                               "num_attention_groups": 4, "head_dim": 192}},
        "tp": 2, "kv_memory_bytes": 30 * GiB},
}


@cache
def _vllm(release: str = "0.34.0") -> dict[str, dict[str, Any]]:
    return oracle_answers(HERE / "step5_oracle.py", release, CASES, RECORD)


def _ours(case: dict[str, Any]) -> tuple[step5_sparse.Step5Packing, list[step5_sparse.Step5Layer]]:
    layers = step5_sparse.step5_layers(case["config"], case["tp"])
    scope = step5_sparse.out_of_scope(case["config"], layers, sm=step5_sparse.SM, kv_cache_dtype="auto",
                                      dtype="bfloat16", block_size=None, num_speculative_tokens=0)
    return step5_sparse.packing(layers, scope), layers


@pytest.mark.parametrize("name", CASES)
def test_groups_block_and_blocks_equal_vllms(name: str) -> None:
    case, want = CASES[name], _vllm()[name]
    kv, _ = _ours(case)
    assert kv.out_of_scope == ""
    assert (step5_sparse.BLOCK_SIZE, step5_sparse.LAYOUT) == (want["block_size"], want["layout"])
    assert [(len(g.pages), g.block_size, g.page_bytes) for g in kv.groups] == \
        [(g["layers"], g["block_size"], g["page_size_bytes"]) for g in want["groups"]]
    assert kv.bytes_per_block == want["bytes_per_block"]
    assert step5_sparse.num_blocks(kv, case["kv_memory_bytes"]) == want["num_blocks"]


def test_live_oracle_matches_its_record() -> None:
    if release_tree("0.34.0") is None:
        pytest.skip("vLLM 0.34.0 is not unpacked (KVWATCH_VLLM_SRC)")
    assert json.loads(RECORD.read_text())["0.34.0"] == _vllm()


@pytest.mark.parametrize(("change", "settings", "reason"), [
    ({}, {}, ""),
    ({"sparse_config": None}, {}, "no sparse_config section (vLLM refuses the model); no DSA layer; "
                                     "a full-attention layer without DSA"),
    ({"sparse_config": {"enabled": False}}, {}, "no DSA layer; a full-attention layer without DSA"),
    ({"head_dim": 128}, {}, "a head_dim other than 192"),
    ({}, {"sm": (10, 0)}, "SM 10.0: only SM 9.0 is checked"),
    ({}, {"kv_cache_dtype": "fp8"}, "a KV cache other than bf16"),
    ({}, {"dtype": "float16"}, "a KV cache other than bf16"),
    ({}, {"block_size": 16}, "--block-size set"),
    ({}, {"num_speculative_tokens": 2}, "speculative decoding"),
    ({"sparse_config": {"apply_to_layer_types": ["sliding_attention"]}}, {},
     "apply_to_layer_types other than full_attention (vLLM refuses it)"),
])
def test_out_of_scope(change: dict[str, Any], settings: dict[str, Any], reason: str) -> None:
    cfg = {**BASE, **change}
    layers = step5_sparse.step5_layers(cfg, 1)
    args: dict[str, Any] = {"sm": (9, 0), "kv_cache_dtype": "auto", "dtype": "bfloat16", "block_size": None,
                            "num_speculative_tokens": 0, **settings}
    assert step5_sparse.out_of_scope(cfg, layers, **args) == reason


@pytest.mark.parametrize(("change", "kinds"), [
    ({}, ["sliding", "dsa"] * 24),
    ({"sliding_window": None}, ["dsa"] * 48),
    ({"layer_types": ["full_attention"] * 47 + ["sliding_attention"]}, ["dsa"] * 47 + ["sliding"]),
])
def test_layer_kinds(change: dict[str, Any], kinds: list[str]) -> None:
    assert [layer.kind for layer in step5_sparse.step5_layers({**BASE, **change}, 1)] == kinds
