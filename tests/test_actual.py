"""Actual KV figures from the engine's own numbers (kvwatch.exporter.actual), on pages
captured from the real CPU engine and on the shapes the GPU backends produce."""
from __future__ import annotations

from dataclasses import replace

from engine_support import deepseek_v2_config
from exporter_support import CPU, RULES, fixture_context, fixture_metrics, fixture_plan

from kvwatch.boundary.engine_http import CacheConfig
from kvwatch.exporter.actual import KvContext, actual_kv, plan_for_reported
from kvwatch.planner.devices import GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config


def test_real_engine_block64_remainder_and_null_block() -> None:
    cache = fixture_metrics("cpu_block64").cache
    actual = actual_kv(fixture_context("cpu_block64"), cache, log_kv_tokens=1_398_080)
    assert actual is not None and actual.problems == ()
    # 3 layers x 64 tokens x 1 head x (64 + 64) x 2 B
    assert actual.bytes_per_block == 49_152 and actual.blocks == 21_845
    assert actual.kv_bytes == 21_845 * 49_152
    assert actual.padding_bytes["remainder"] == GiB - 21_845 * 49_152 == 16_384
    assert actual.padding_bytes["null_block"] == 49_152
    assert actual.padding_ratio == (16_384 + 49_152) / (21_845 * 49_152)
    assert actual.kv_memory_source == "kv_cache_memory_bytes"


def test_the_plan_predicts_what_the_real_engine_allocated() -> None:
    for name in ("cpu_default", "cpu_block64"):
        plan = fixture_plan(name)
        actual = actual_kv(fixture_context(name), fixture_metrics(name).cache)
        assert actual is not None
        assert (plan.num_blocks, plan.planned_kv_bytes) == (actual.blocks, actual.kv_bytes), name
        assert plan.padding_bytes == actual.padding_bytes, name
        assert plan.padding_ratio == actual.padding_ratio


def test_the_block_size_and_dtype_the_engine_reports_win_over_the_flags() -> None:
    ctx = fixture_context("cpu_default")  # no --block-size flag
    cache = CacheConfig(num_gpu_blocks=1000, block_size=64, cache_dtype="fp8", gpu_memory_utilization=0.9,
                        kv_cache_memory_bytes=None, kv_cache_size_tokens=64_000)
    actual = actual_kv(ctx, cache)
    assert actual is not None and actual.problems == ()
    # 2 layers x 64 tokens x 2 heads x (32 + 32) x 1 B (fp8)
    assert (actual.block_size, actual.kv_cache_dtype, actual.bytes_per_block) == (64, "fp8", 16_384)
    assert actual.kv_memory_bytes is None and actual.padding_bytes["remainder"] == 0


def test_cross_checks_name_what_disagrees() -> None:
    ctx = fixture_context("cpu_block64")
    cache = fixture_metrics("cpu_block64").cache
    assert cache is not None
    wrong = actual_kv(ctx, cache, log_kv_tokens=1_000_000)
    assert wrong is not None and len(wrong.problems) == 1 and "log says 1000000 KV tokens" in wrong.problems[0]
    fewer = actual_kv(ctx, replace(cache, num_gpu_blocks=20_000, kv_cache_size_tokens=None))
    assert fewer is not None and any("gave the KV cache 1073741824 B" in p for p in fewer.problems)


def test_a_log_figure_is_good_to_its_rounding() -> None:
    """On a GPU the KV memory is only in the log, rounded to 0.01 GiB."""
    ctx = fixture_context("cpu_block64")
    cache = replace(fixture_metrics("cpu_block64").cache, kv_cache_memory_bytes=None)  # type: ignore[arg-type]
    logged = round(GiB / 2**30, 2) * 2**30  # "Available KV cache memory: 1.0 GiB"
    actual = actual_kv(ctx, cache, log_kv_tokens=1_398_080, log_available_kv_bytes=int(logged) + 3 * 2**20)
    assert actual is not None and actual.problems == () and actual.kv_memory_source == "log"
    assert 0 <= actual.padding_bytes["remainder"] < actual.bytes_per_block


def test_mla_packed_fp8_layout_is_padding_in_the_actual_figures() -> None:
    geometry = geometry_from_config(deepseek_v2_config(layers=2))
    settings = EngineCommand.parse(["vllm", "serve", "m"]).settings()
    ctx = KvContext(geometry, settings, preset("h200"), RULES)
    cache = CacheConfig(num_gpu_blocks=10_000, block_size=64, cache_dtype="fp8_ds_mla",
                        gpu_memory_utilization=0.92, kv_cache_memory_bytes=None, kv_cache_size_tokens=None)
    actual = actual_kv(ctx, cache)
    assert actual is not None
    assert actual.bytes_per_block == 2 * 64 * 656  # 656 B per token and layer, packed
    assert actual.padding_bytes["packed_layout"] == 10_000 * 2 * 64 * (656 - 576)


def test_no_blocks_reported_yet_means_no_actual_figures() -> None:
    ctx = fixture_context("cpu_default")
    assert actual_kv(ctx, None) is None
    assert actual_kv(ctx, CacheConfig(None, 128, "auto", 0.92, None, None)) is None


def test_plan_for_an_external_engine_uses_what_it_reports() -> None:
    ctx = fixture_context("cpu_default")  # flags unknown: vllm serve MODEL
    cache = fixture_metrics("cpu_block64").cache
    assert cache is not None
    ctx64 = fixture_context("cpu_block64")
    plan = plan_for_reported(replace(ctx64, settings=replace(ctx64.settings, block_size=None)), cache)
    assert (plan.block_size, plan.kv_memory_bytes, plan.num_blocks) == (64, GiB, 21_845)
    assert plan_for_reported(ctx, None).block_size == 128 and CPU.platform == "cpu"


def test_a_change_is_replanned_over_what_the_engine_reports() -> None:
    """kvwatch export's re-plan of a recommended change: the engine's reported figures (block size,
    KV dtype, KV memory), then the change over them; without the engine's command there is none."""
    from kvwatch.exporter.actual import replan_reported
    from kvwatch.planner.flag_change import FlagChange

    geometry = fixture_context("cpu_block64").geometry
    command = EngineCommand.parse(["vllm", "serve", "m"])
    ctx = KvContext(geometry, command.settings(), preset("h100"), RULES, command)
    cache = CacheConfig(num_gpu_blocks=1000, block_size=32, cache_dtype="auto", gpu_memory_utilization=0.8,
                        kv_cache_memory_bytes=GiB, kv_cache_size_tokens=None)
    before = plan_for_reported(ctx, cache)
    same = replan_reported(ctx, cache, FlagChange())
    fp8 = replan_reported(ctx, cache, FlagChange({"--kv-cache-dtype": "fp8"}))
    assert same is not None and fp8 is not None
    assert (same.block_size, same.kv_memory_bytes, same.kv_cache_tokens) == (32, GiB, before.kv_cache_tokens)
    assert (fp8.block_size, fp8.kv_memory_bytes, fp8.kv_cache_dtype) == (32, GiB, "fp8")
    # the same memory holds twice the tokens (to a block: the null block is one of either's)
    assert abs(fp8.kv_cache_tokens - 2 * before.kv_cache_tokens) <= 32
    assert replan_reported(replace(ctx, command=None), cache, FlagChange({"--kv-cache-dtype": "fp8"})) is None
