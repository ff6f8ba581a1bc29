"""kvwatch's release data against vLLM's own functions (scripts/check_release_functions.py).

vLLM's answers are recorded in tests/fixtures/release_oracles.json, run from each release's wheel;
kvwatch's are recomputed here, so a change to kvwatch's data is checked without the sources. Where
the unpacked releases are present (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...), the oracles are run
again and the generated defaults checked against the sources.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from script_loader import load_script

from kvwatch.vllm_releases import KNOWN

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "release_oracles.json").read_text())


ORACLES = load_script("check_release_functions")


def _source_root() -> Path | None:
    root = os.environ.get("KVWATCH_VLLM_SRC")
    if not root or not any((Path(root) / str(v) / "vllm").is_dir() for v in KNOWN):
        return None
    return Path(root)


def _kvwatch(result: dict[str, Any]) -> list[Any]:
    answer = {"batch_defaults": ORACLES.kvwatch_batch_defaults,
              "backend_priorities": ORACLES.kvwatch_backend_priorities,
              "max_model_len": ORACLES.kvwatch_max_model_len,
              "hybrid_block_size": ORACLES.kvwatch_hybrid_block_size,
              "sliding_block_size": ORACLES.kvwatch_sliding_block_size,
              "cpu_attn_kernel_blocks": ORACLES.kvwatch_cpu_attn_kernel_blocks,
              "kv_groups": ORACLES.kvwatch_kv_groups,
               "cuda_kernel_blocks": ORACLES.kvwatch_cuda_kernel_blocks,
               "kv_tokens": ORACLES.kvwatch_kv_tokens,
               "gdn_checkpoint": ORACLES.kvwatch_gdn_checkpoint,
               "skip_layer_block_size": ORACLES.kvwatch_skip_layer_block_size}[result["check"]]
    return answer(result["release"], result["args"])   # type: ignore[no-any-return]


def _known(result: dict[str, Any]) -> bool:
    return f"{result['check']}: {result['input']}" in FIXTURE["known_differences"]


def _differences(check: str) -> list[str]:
    return [f"vLLM {r['release']} [{r['input']}]: vLLM {r['vllm']} kvwatch {_kvwatch(r)}"
            for r in FIXTURE["results"] if r["check"] == check and not _known(r) and r["vllm"] != _kvwatch(r)]


def test_the_fixture_covers_every_known_release() -> None:
    assert FIXTURE["releases"] == [str(v) for v in KNOWN]
    batch = {r["release"] for r in FIXTURE["results"] if r["check"] == "batch_defaults"}
    assert batch == set(FIXTURE["releases"])


def test_batch_defaults_equal_vllms_get_batch_defaults() -> None:
    """Every card and CPU world size, every release 0.10 to 0.33: 0 differences."""
    assert _differences("batch_defaults") == []


def test_backend_priorities_equal_vllms_per_release() -> None:
    """vLLM's _get_backend_priorities of each release 0.11 to 0.33 (MLA and full attention, SM 8.0 to
    12.1, bf16 and fp8 KV): 0 differences with the per-release data kvwatch plans with."""
    assert [r for r in FIXTURE["results"] if r["check"] == "backend_priorities"]
    assert _differences("backend_priorities") == []


def test_max_model_len_equals_vllms_derivation_per_release() -> None:
    """vLLM's _get_and_verify_max_len of each release 0.10 to 0.33 (yarn, longrope, llama3, linear,
    dynamic, gemma3, the length keys): 0 differences."""
    assert [r for r in FIXTURE["results"] if r["check"] == "max_model_len"]
    assert _differences("max_model_len") == []


def test_hybrid_block_size_equals_vllms_alignment_per_release() -> None:
    """vLLM's own hybrid alignment of each release 0.10 to 0.33 (Platform._align_hybrid_block_size
    from 0.20, HybridAttentionMambaModelConfig before): every backend kvwatch models, MLA and not,
    real hybrids' page and state sizes, block sizes in force and mamba cache modes: 0 differences in
    the block size and the padded state page."""
    hybrid = [r for r in FIXTURE["results"] if r["check"] == "hybrid_block_size"]
    assert {r["release"] for r in hybrid} == set(FIXTURE["releases"])
    assert _differences("hybrid_block_size") == []


def test_hybrid_block_size_takes_033s_gdn_checkpoint_alignment() -> None:
    """0.33 makes the alignment a multiple of the state layers' prefill checkpoint alignment (64 for a
    gated delta net layer on FlashInfer) in align mode: vLLM's own answers differ from 0.32's there,
    and kvwatch's equal them."""
    hybrid = {(r["release"], r["input"]): r["vllm"] for r in FIXTURE["results"] if r["check"] == "hybrid_block_size"}
    label = ("FLASH_ATTN, attention 4096 B/token, state 1622016 B, block 16, mamba_cache_mode align, "
             "checkpoint alignment 64")
    assert hybrid[("0.32.0", label)][0] == 400     # 16 x ceil(1,622,016 / (16 x 4,096)) = 16 x 25
    assert hybrid[("0.33.0", label)][0] == 448     # 64 x ceil(1,622,016 / (64 x 4,096)) = 64 x 7
    assert _differences("hybrid_block_size") == []


def test_gdn_checkpoint_equals_vllms_layer_per_release() -> None:
    """QwenGatedDeltaNetAttention's spec in each release 0.22 to 0.33 (its own get_kv_cache_spec and
    checkpoint alignment from 0.33, with the release's prefill backend choice and
    MambaSpec.max_memory_usage_bytes), on the CPU and 7 capabilities, two key head widths, both
    mamba cache modes and four --gdn-prefill-backend values: 0 differences, and the checkpoint seen."""
    gdn = [r for r in FIXTURE["results"] if r["check"] == "gdn_checkpoint"]
    assert {"0.22.1", "0.32.0", "0.33.0"} <= {r["release"] for r in gdn}
    assert _differences("gdn_checkpoint") == []
    exported = {(r["release"], r["input"]) for r in gdn if r["vllm"][0]}
    assert exported and {release for release, _ in exported} == {str(v) for v in KNOWN if v.parts >= (0, 33, 0)}
    assert ("0.33.0", "SM 9.0, linear key heads 128, mamba_cache_mode align, --gdn-prefill-backend not given") \
        in exported


def test_skip_layer_block_size_equals_vllms_alignment_per_release() -> None:
    """Platform._align_heterogeneous_kv_block_size (0.25 to 0.33) with an fp8 primary and skip layers
    in the model's dtype, on 4 backends x 4 block sizes x 3 page pairs x a padded Mamba page or none:
    0 differences in the block size, skip_page_size_padded and the Mamba page; releases before 0.25
    have no such function (kvwatch aligns nothing there)."""
    skip = [r for r in FIXTURE["results"] if r["check"] == "skip_layer_block_size"]
    assert {r["release"] for r in skip} == set(FIXTURE["releases"])
    assert {r["release"] for r in skip if r["vllm"] is None} == {r for r in FIXTURE["releases"]
                                                                  if tuple(map(int, r.split(".")[:2])) < (0, 25)}
    assert _differences("skip_layer_block_size") == []
    grown = [r for r in skip if r["vllm"] is not None and r["vllm"][0] != r["args"]["block_size"]]
    assert grown and {r["release"] for r in grown} >= {"0.25.1", "0.33.0"}


def test_sliding_block_size_equals_vllms_layer_spec_per_release() -> None:
    """The block a sliding-window layer starts from (Attention.get_kv_cache_spec, 0.20 to 0.33) on
    each backend's kernel sizes and block sizes in force: 0 differences, and the three rules of
    kv_layout.py seen (the block in force, the smallest kernel block, the largest within its page)."""
    sliding = [r for r in FIXTURE["results"] if r["check"] == "sliding_block_size"]
    releases = {r["release"] for r in sliding}
    assert {"0.20.2", "0.24.0", "0.25.1", "0.28.0", "0.29.0", "0.30.0", "0.33.0"} <= releases
    assert _differences("sliding_block_size") == []
    cpu_128 = {r["release"]: r["vllm"] for r in sliding if r["input"] == "CPU_ATTN, block 128"}
    assert (cpu_128["0.24.0"], cpu_128["0.28.0"], cpu_128["0.29.0"], cpu_128["0.30.0"]) == (128, 16, 32, 128)


def test_cpu_attn_kernel_blocks_equal_vllms_per_release() -> None:
    kernel = {r["release"]: r["vllm"] for r in FIXTURE["results"] if r["check"] == "cpu_attn_kernel_blocks"}
    assert kernel["0.20.2"] == ["MultipleOf(1)"] and kernel["0.28.0"] == ["MultipleOf(16)"]
    assert kernel["0.29.0"] == kernel["0.33.0"] == ["MultipleOf(32)"]
    assert _differences("cpu_attn_kernel_blocks") == []


def test_cuda_kernel_blocks_equal_vllms_per_release() -> None:
    """Each CUDA backend's get_supported_kernel_block_sizes, supports_block_size and
    get_preferred_block_size, run from each release 0.11 to 0.33 on cards SM 8.0 to 12.0, dense,
    head-256/512, soft-capped and hybrid layouts, bf16 and fp8 KV: 0 differences with the rules
    kvwatch plans with (vllm_releases/cuda_kernel_blocks.py; 1,989 of 4,784 before it)."""
    results = [r for r in FIXTURE["results"] if r["check"] == "cuda_kernel_blocks"]
    assert {r["release"] for r in results} >= {"0.11.2", "0.24.0", "0.29.0", "0.33.0"}
    # the release-dependent rows show in vLLM's answers, so the table exercises them
    assert any(r["vllm"]["kernel"] == ["128"] for r in results)
    assert any("1024" in r["vllm"]["kernel"] for r in results)
    assert _differences("cuda_kernel_blocks") == []


def test_logged_kv_tokens_equal_vllms_report_per_release() -> None:
    """The "GPU KV cache size: N tokens" each release 0.11 to 0.33 logs for 10,000 blocks in its own
    groups of the kv_groups layouts (its _report_kv_cache_config / update_kv_cache_capacity /
    get_kv_cache_capacity): 0 differences with the plan's count (kv_groups capacity and
    vllm_releases/kv_tokens_report.py), blocks over groups before 0.20 and concurrency x length after."""
    results = {(r["release"], r["input"]): r["vllm"] for r in FIXTURE["results"] if r["check"] == "kv_tokens"}
    gemma3 = "Gemma 3 5:1 sliding:full"
    groups = next(r["vllm"] for r in FIXTURE["results"]
                  if r["check"] == "kv_groups" and r["release"] == "0.19.1" and r["input"] == gemma3)
    shared_out = 10_000 // len(groups) * 16   # before 0.20: the blocks shared out over the groups
    assert results[("0.19.1", gemma3)] == shared_out < results[("0.20.2", gemma3)]   # then: the windows count
    assert _differences("kv_tokens") == []


def test_kv_groups_equal_vllms_get_kv_cache_groups_per_release() -> None:
    """vLLM's own get_kv_cache_groups of each release 0.10 to 0.33 on specs built with its own
    classes (uniform full and MLA, Gemma 3 5:1 and gpt-oss 1:1 sliding:full, Llama 4 chunked:full,
    Gemma 4-like head sizes with KV sharing, Qwen3-Next and Granite-4.0-H hybrids, pure Mamba,
    buckets of nearly equal counts, with and without the hybrid manager): 0 differences in the
    groups' layers, kinds, block sizes and bytes per block, and in the refusals (0.10-0.11 without
    page unification; Mamba with the hybrid manager off)."""
    groups = [r for r in FIXTURE["results"] if r["check"] == "kv_groups"]
    assert FIXTURE["kv_groups_cases"] == ORACLES.GROUP_CASES   # the inputs vLLM's answers are for
    assert {r["release"] for r in groups} == set(FIXTURE["releases"])   # 0.10: inside get_kv_cache_config
    assert _differences("kv_groups") == []
    refused = {(r["release"], r["input"]) for r in groups if isinstance(r["vllm"], str)}
    assert ("0.11.2", "Gemma 4-like 5:1, head sizes 256/512") in refused
    assert ("0.12.0", "Gemma 4-like 5:1, head sizes 256/512") not in refused


def test_known_differences_still_differ() -> None:
    """A known difference is recorded only while it is one: fixed, it must leave the list."""
    known = [r for r in FIXTURE["results"] if _known(r)]
    assert known and all(r["vllm"] != _kvwatch(r) for r in known)
    assert {f"{r['check']}: {r['input']}" for r in known} == set(FIXTURE["known_differences"])


def test_live_oracles_reproduce_the_fixture() -> None:
    root = _source_root()
    if root is None:
        pytest.skip("no unpacked vLLM releases (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    releases = [r for r in FIXTURE["releases"] if (root / r / "vllm").is_dir()]
    # KVWATCH_ORACLE_RELEASES (comma-separated) reruns only those: scripts/absorb_release.py names the new one
    if only := os.environ.get("KVWATCH_ORACLE_RELEASES"):
        releases = [r for r in releases if r in only.split(",")]
    checks = [c for c in ORACLES.CHECKS if c not in ("kv_groups", "kv_tokens") or ORACLES.torch_available()]
    live = ORACLES.run(root, releases, checks)
    recorded = [r for r in FIXTURE["results"] if r["release"] in releases and r["check"] in checks]
    assert [(r["release"], r["check"], r["input"], r["vllm"]) for r in live] == \
        [(r["release"], r["check"], r["input"], r["vllm"]) for r in recorded]


def test_generated_defaults_are_current() -> None:
    root = _source_root()
    if root is None or not all((root / str(v) / "vllm").is_dir() for v in KNOWN):
        pytest.skip("not every known vLLM release is unpacked (set KVWATCH_VLLM_SRC)")
    assert load_script("gen_release_defaults").main([str(root), "--check"]) == 0
    assert load_script("gen_backend_priorities").main([str(root), "--check"]) == 0
    assert load_script("gen_max_len_rules").main([str(root), "--check"]) == 0
    assert load_script("gen_metric_names").main([str(root), "--check"]) == 0
