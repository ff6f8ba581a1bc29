"""vLLM's GPU memory budget before launch (kvwatch/planner/gpu_budget.py), against real GPU logs."""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from gpu_log_corpus import GiB, logged_kv_bytes, plan_run, started_runs

from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import PRESETS, Device, cuda_total_bytes
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import (
    FUSED_SAMPLER_BYTES,
    SORTED_SAMPLER_BYTES,
    V0_ENGINE,
    batch_defaults,
    profile_key,
    release_for,
    requested_bytes,
)
from kvwatch.planner.versions import LATEST, parse_version
from kvwatch.planner.weights import count_weights, weights_bytes

A100 = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB)
H100 = PRESETS["h100"]


def settings(*flags: str):  # type: ignore[no-untyped-def]
    return EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()


@pytest.mark.parametrize("text, parts", [("0.10.1.1", (0, 10, 1)), ("0.6.5.dev12+gabc", (0, 6, 5)),
                                          ("v0.32.0", (0, 32, 0)), ("0.19", (0, 19, 0)), ("0.7.3rc1", (0, 7, 3))])
def test_versions_as_vllm_prints_them(text: str, parts: tuple[int, int, int]) -> None:
    assert parse_version(text).parts == parts


@pytest.mark.parametrize("text", ["banana", "", "1", "0.x", "9" * 50])
def test_a_version_that_is_none_is_one_error(text: str) -> None:
    with pytest.raises(KvwatchError, match="vLLM version"):
        parse_version(text)


def test_each_release_line_profiles_as_its_code_did() -> None:
    v = parse_version
    assert release_for(v("0.6.5")).engine == V0_ENGINE
    assert release_for(v("0.10.1")).sampler_bytes == FUSED_SAMPLER_BYTES          # FlashInfer sampler
    assert release_for(v("0.12.0")).sampler_bytes == SORTED_SAMPLER_BYTES          # FlashInfer off (#26859)
    assert release_for(v("0.19.0")).sampler_bytes == FUSED_SAMPLER_BYTES          # Triton top-k/top-p
    assert not release_for(v("0.19.0")).cuda_graphs_counted
    assert release_for(v("0.21.0")).cuda_graphs_counted
    assert release_for(None) == release_for(LATEST)
    assert release_for(v("0.10.1")).default_utilization == 0.9
    assert release_for(LATEST).default_utilization == 0.92                          # config/cache.py of 0.32
    # the environment the engine gets decides as vLLM's envs.py does
    assert release_for(v("0.8.5"), {"VLLM_USE_V1": "0"}).engine == V0_ENGINE
    assert release_for(v("0.12.0"), {"VLLM_USE_FLASHINFER_SAMPLER": "1"}).sampler_bytes == FUSED_SAMPLER_BYTES
    assert not release_for(v("0.32.0"), {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}).cuda_graphs_counted


def test_scheduler_defaults_by_card_as_get_batch_defaults() -> None:
    r = release_for(LATEST)
    assert batch_defaults(settings(), A100, r, 8192) == (2048, 256)       # A100s keep the small defaults
    assert batch_defaults(settings(), H100, r, 8192) == (8192, 1024)
    assert batch_defaults(settings(), PRESETS["b200"], r, 8192) == (16384, 1024)
    assert batch_defaults(settings("--max-num-seqs", "8"), H100, r, 8192) == (8192, 8)
    v0 = release_for(parse_version("0.6.5"))
    assert batch_defaults(settings(), H100, v0, 8192) == (8192, 256)      # V0: max(max_model_len, 2048)
    assert batch_defaults(settings(), H100, v0, 131072) == (2048, 256)    # chunked prefill above 32K


def test_the_cuda_total_is_below_nvmls() -> None:
    assert cuda_total_bytes(A100) == int(79.15 * GiB)
    assert cuda_total_bytes(H100) == int(79.18 * GiB)
    logged = replace(A100, cuda_total_bytes=int(79.25 * GiB))
    assert cuda_total_bytes(logged) == int(79.25 * GiB)
    unknown = Device("cuda", "NVIDIA Future GPU", (12, 0), 100 * GiB)
    assert 99 * GiB < cuda_total_bytes(unknown) < 100 * GiB
    mig = Device("cuda", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", (8, 0), 40 * GiB)   # not the whole card
    assert cuda_total_bytes(mig) < 40 * GiB


def test_the_utilization_vllm_defaults_to_is_the_versions() -> None:
    old, new = parse_version("0.10.1"), LATEST
    total = int(79.15 * GiB)
    assert requested_bytes(A100, settings(), old) == int(total * 0.9)
    assert requested_bytes(A100, settings(), new) == int(total * 0.92)
    assert requested_bytes(A100, settings("--gpu-memory-utilization", "0.5"), old) == int(total * 0.5)


def test_gpt_oss_keeps_its_attention_in_bf16() -> None:
    """MXFP4 quantizes the experts only: modules_to_not_convert names self_attn (gpt-oss config.json)."""
    cfg = {"hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
           "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4,
           "vocab_size": 201088}
    plain = weights_bytes({**cfg, "quantization_config": {"quant_method": "mxfp4"}}, 2)
    skipped = weights_bytes({**cfg, "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"]}}, 2)
    count = count_weights(cfg)
    assert plain is not None and skipped is not None and count is not None
    assert skipped - plain == int(count.attention_params * (2 - (0.5 + 1 / 32)))
    assert count.mlp_width_per_token == 4 * 2880      # a token passes through its 4 experts


def test_a_learned_profile_is_keyed_by_what_changes_the_profile_run() -> None:
    base = profile_key(settings("--port", "1"), H100, LATEST)
    assert profile_key(settings("--port", "2", "--gpu-memory-utilization", "0.5"), H100, LATEST) == base
    assert profile_key(settings("--max-num-seqs", "64"), H100, LATEST) != base
    assert profile_key(settings(), A100, LATEST) != base
    assert profile_key(settings(), H100, parse_version("0.10.1")) != base


RUNS = started_runs()


@pytest.mark.parametrize("run", RUNS, ids=[r["name"] for r in RUNS])
def test_every_real_start_up_is_planned_with_a_kv_cache(run: dict, tmp_path: Path) -> None:
    """No plan of zero KV where vLLM started, and every plan's budget adds up."""
    plan = plan_run(run, tmp_path / "model")
    budget = plan.gpu_budget
    assert budget is not None and plan.source == "estimated"
    assert plan.kv_memory_bytes == budget.kv_cache_bytes > 0
    assert budget.requested_bytes == budget.non_kv_bytes + budget.kv_cache_bytes


def test_the_pre_launch_kv_memory_is_within_3_percent_at_the_median(tmp_path: Path) -> None:
    """The issue's measure on the whole corpus (bench/bench_gpu_budget.py prints the table)."""
    errors = [abs(plan_run(r, tmp_path / r["name"]).kv_memory_bytes - logged_kv_bytes(r)) / logged_kv_bytes(r)
              for r in RUNS]
    assert len(errors) >= 12
    assert statistics.median(errors) <= 0.03
