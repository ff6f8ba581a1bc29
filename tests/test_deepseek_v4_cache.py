"""Issue 39: DeepSeek-V4's five cache kinds and their packed groups, as vLLM 0.34 builds them.

vLLM's answers come from its own code (tests/deepseek_v4_oracle.py: transformers' DeepseekV4Config,
the layers' get_kv_cache_spec methods, get_kv_cache_groups and get_kv_cache_config_from_groups),
run live where the unpacked release is (KVWATCH_VLLM_SRC=<root>, holding <root>/0.34.0/vllm) and
recorded in tests/fixtures/deepseek_v4_oracle.json by that same script for runs without it; a live
run also checks the record. The config is DeepSeek-V4-Flash's published config.json
(tests/fixtures/models/newest.py, with its source).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvwatch.planner import deepseek_v4
from tests.fixtures.models.newest import NEWEST

HERE = Path(__file__).resolve().parent
RECORD = HERE / "fixtures" / "deepseek_v4_oracle.json"
RELEASE = "0.34.0"
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
}


def _source() -> Path | None:
    root = os.environ.get("KVWATCH_VLLM_SRC")
    return Path(root) / RELEASE if root and (Path(root) / RELEASE / "vllm").is_dir() else None


@cache
def _live() -> dict[str, dict[str, Any]]:
    src = _source()
    assert src is not None
    out = subprocess.run([sys.executable, str(HERE / "deepseek_v4_oracle.py"), str(src), json.dumps(list(CASES.values()))],
                         capture_output=True, text=True, timeout=600, check=True)
    return dict(zip(CASES, json.loads(out.stdout.strip().splitlines()[-1]), strict=True))


def _vllm() -> dict[str, dict[str, Any]]:
    return _live() if _source() is not None else json.loads(RECORD.read_text())[RELEASE]  # type: ignore[no-any-return]


def _specs(case: dict[str, Any]) -> list[deepseek_v4.CacheSpec]:
    mtp = FLASH["num_nextn_predict_layers"] if case["mtp"] else 0
    return [s for layer in deepseek_v4.layer_specs(case["config"], mtp) for s in layer]


@pytest.mark.parametrize("label", list(CASES))
def test_groups_and_blocks_equal_vllms(label: str) -> None:
    case, truth = CASES[label], _vllm()[label]
    groups = deepseek_v4.packed_groups(_specs(case))
    assert [(g.block_size, len(g.pages), g.page_bytes) for g in groups] == \
        [(g["block_size"], g["layers"], g["page_size_bytes"]) for g in truth["groups"]]
    mtp = FLASH["num_nextn_predict_layers"] if case["mtp"] else 0
    blocks = deepseek_v4.num_blocks(case["config"], case["kv_memory_bytes"], mtp)
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


@pytest.mark.skipif(_source() is None, reason="set KVWATCH_VLLM_SRC to the unpacked releases")
def test_the_record_is_what_vllms_code_answers_now() -> None:
    assert json.loads(RECORD.read_text()) == {RELEASE: _live()}
