"""The collector: the whole /metrics page of a fixed snapshot against a golden file, the
docs/reference.md contract, and the watch loop on the NVML stand-in (real pynvml, fake driver).

Regenerate the golden file after an intended change:
    KVWATCH_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_collector.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from exporter_support import (
    fixture_context,
    fixture_metrics,
    fixture_plan,
    gpu_plan,
    render,
    samples,
    series,
    value,
)
from nvml_standin import (
    GIB,
    NvmlStandin,
    StandinGpu,
    StandinProcess,
    StandinState,
)
from operator_tools import readme_metric_labels
from waiting import eventually

from kvwatch.boundary.nvml import Nvml
from kvwatch.diagnosis.startup_lines import parse_facts
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exporter.actual import ActualKv, actual_kv
from kvwatch.exporter.collector import ENGINE_STATES, FAILURE_KINDS
from kvwatch.exporter.snapshot import CollectorResult, EngineSnapshot, WatchSnapshot
from kvwatch.exporter.watch import EngineTarget, Watch
from kvwatch.gpu_types import GpuInfo, GpuProcess, NvmlSnapshot
from kvwatch.planner.devices import PRESETS, GiB
from kvwatch.planner.plan import MemoryInputs, Plan

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "metrics.txt"
GPU_LOGS = Path(__file__).parent / "fixtures" / "gpu_logs"
H200_A = "GPU-7c2e4d1a-0000-4000-8000-00000000000a"
H200_B = "GPU-7c2e4d1a-0000-4000-8000-00000000000b"


def allocated(plan: Plan, blocks: int) -> ActualKv:
    """What an engine allocated, in the plan's own page: `blocks` blocks."""
    return ActualKv(blocks=blocks, block_size=plan.block_size, kv_cache_dtype=plan.kv_cache_dtype,
                    bytes_per_block=plan.bytes_per_block, kv_bytes=blocks * plan.bytes_per_block,
                    kv_memory_bytes=None, kv_memory_source=None, padding_bytes={})


def fixed_snapshot() -> WatchSnapshot:
    from kvwatch.planner.flag_change import FlagChange
    from kvwatch.planner.pressure import Recommendation
    """Three engines (one serving, one in backoff, one serving on an estimated GPU plan that got
    10% fewer blocks than estimated) on a 2-GPU host with a foreign process."""
    metrics = fixture_metrics("cpu_block64")
    actual = actual_kv(fixture_context("cpu_block64"), metrics.cache, log_kv_tokens=1_398_080)
    serving = EngineStatus(
        name="llama", state=EngineState.READY, reason="healthy", plan=fixture_plan("cpu_block64"),
        pids=(4242, 4243), restarts={"engine_died": 1},
        failures={"engine_died": 1, "block_size_unsupported": 2}, corrections={"block_size_unsupported": 1},
        log_kv_tokens=1_398_080, recommendation=Recommendation(
            FlagChange({"--max-num-seqs": "64"}), "4.0 preemptions per minute: the cache holds 64 requests of the "
            "21845 tokens they take on average", 1_398_080, 1_398_080, 341.33, 341.33))
    waiting = EngineStatus(name="qwen", state=EngineState.BACKOFF, reason="exited: 1",
                           plan=fixture_plan("cpu_default"), failures={"gpu_memory_busy": 3},
                           restarts={"gpu_memory_busy": 3})
    estimated = gpu_plan("cpu_block64", PRESETS["h200"])
    # Its memory by part as a real V1 engine logged it (weights, KV cache, CUDA graphs; no V0 profile).
    logged = parse_facts((GPU_LOGS / "dl_qwen2_7b_a100_80g_u05.log").read_text().splitlines())
    on_gpu = EngineStatus(name="mistral", state=EngineState.READY, reason="healthy", plan=estimated,
                          vllm_release="0.33.1", vllm_release_planned_as="0.33.0", release_changes=1,
                          log_memory_parts=logged.memory_parts(),
                          memory_requested_bytes=int((PRESETS["h200"].total_memory_bytes or 0) * 0.92),
                          gpu_release_waits={"released": 2, "timed_out": 1}, gpu_release_wait_seconds=4.5)
    gpus = (
        GpuInfo(0, H200_A, "NVIDIA H200", 143_771 * 2**20, 90 * GIB, (9, 0),
                (GpuProcess(777, 3 * GIB), GpuProcess(4242, 80 * GIB), GpuProcess(4243, None))),
        GpuInfo(1, H200_B, "NVIDIA H200", 143_771 * 2**20, None, (9, 0), None),
    )
    return WatchSnapshot(
        taken_at=1_800_000_000.0,
        engines=(EngineSnapshot(waiting, up=False, planned=waiting.plan),
                 EngineSnapshot(serving, up=True, metrics=metrics, planned=serving.plan, actual=actual,
                                process_rss={4242: 2 * GIB, 4243: GIB}),
                 EngineSnapshot(on_gpu, up=True, planned=estimated,
                                actual=allocated(estimated, estimated.num_blocks * 9 // 10))),
        nvml=NvmlSnapshot(True, None, "570.124.06", gpus, ()),
        collectors=(CollectorResult("nvml", True, 0.0125), CollectorResult("engine", True, 0.0421),
                    CollectorResult("process", False, 0.0009, "boom")),
    )


def test_golden_metrics_page() -> None:
    text = render(fixed_snapshot())
    if os.environ.get("KVWATCH_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no golden file: run with KVWATCH_UPDATE_GOLDEN=1"
    assert text == GOLDEN.read_text(), "the /metrics page changed: check it, then KVWATCH_UPDATE_GOLDEN=1"


def test_golden_page_is_the_readme_contract() -> None:
    """Every documented metric is on the page with exactly its documented labels, and nothing else is."""
    readme = readme_metric_labels()
    found = samples(GOLDEN.read_text())
    names = {name for name, _ in found}
    assert names == set(readme), (sorted(names - set(readme)), sorted(set(readme) - names))
    for (name, labels) in found:
        assert sorted(k for k, _ in labels) == sorted(readme[name]), name


def test_fixed_snapshot_values() -> None:
    found = samples(render(fixed_snapshot()))
    assert value(found, "kvwatch_engine_up", engine="llama") == 1
    assert value(found, "kvwatch_engine_up", engine="qwen") == 0
    for name in ("llama", "qwen"):
        states = {s["state"] for s in series(found, "kvwatch_engine_state") if s["engine"] == name}
        assert states == set(ENGINE_STATES)
    assert value(found, "kvwatch_engine_state", engine="qwen", state="backoff") == 1
    assert value(found, "kvwatch_engine_state", engine="qwen", state="ready") == 0
    # counters: every known class from 0, the counted ones with their count
    kinds = {s["kind"] for s in series(found, "kvwatch_engine_failures_total") if s["engine"] == "llama"}
    assert kinds == set(FAILURE_KINDS)
    assert value(found, "kvwatch_engine_failures_total", engine="llama", kind="block_size_unsupported") == 2
    assert value(found, "kvwatch_engine_restarts_total", engine="qwen", reason="gpu_memory_busy") == 3
    assert value(found, "kvwatch_plan_corrections_total", engine="qwen", kind="cuda_oom") == 0
    # planned = actual for the serving engine; the waiting one has a plan only
    assert value(found, "kvwatch_kv_actual_blocks", engine="llama", rank="0") == 21_845
    assert value(found, "kvwatch_kv_planned_blocks", engine="llama", rank="0") == 21_845
    assert value(found, "kvwatch_kv_plan_drift_ratio", engine="llama", rank="0") == 0
    assert value(found, "kvwatch_kv_padding_bytes", engine="llama", rank="0", cause="remainder") == 16_384
    assert value(found, "kvwatch_kv_actual_bytes", engine="qwen", rank="0") is None
    assert value(found, "kvwatch_kv_planned_bytes", engine="qwen", rank="0") == 2**30
    # GPU memory: the engine's pids on GPU 0, the foreign pid 777; GPU 1 reports no processes
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="llama", rank="0", gpu=H200_A) == 80 * GIB
    assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=H200_A) == 3 * GIB
    assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=H200_B) is None
    assert value(found, "kvwatch_gpu_memory_used_bytes", gpu=H200_B) is None  # not reported: left out
    assert value(found, "kvwatch_gpu_info", gpu=H200_B, index="1", name="NVIDIA H200") == 1
    assert value(found, "kvwatch_collector_success", collector="process") == 0


def test_drift_only_for_exact_and_learned_plans_the_estimate_its_own_error() -> None:
    """An estimate that misses is no change in the engine: its error is a gauge, not drift."""
    h100 = PRESETS["h100"]
    plans = {"exact": fixture_plan("cpu_block64"), "estimated": gpu_plan("cpu_block64", h100),
             "learned": gpu_plan("cpu_block64", h100, MemoryInputs(non_kv_bytes=20 * GiB))}
    assert {source: plan.source for source, plan in plans.items()} == {s: s for s in plans}
    engines = tuple(EngineSnapshot(EngineStatus(source, EngineState.READY, plan=plan), up=True, planned=plan,
                                   actual=allocated(plan, plan.num_blocks * 9 // 10))
                    for source, plan in plans.items())
    found = samples(render(WatchSnapshot(taken_at=1.0, engines=engines)))
    for source, plan in plans.items():
        error = (plan.num_blocks * 9 // 10 - plan.num_blocks) / plan.num_blocks
        assert [s["source"] for s in series(found, "kvwatch_plan_info") if s["engine"] == source] == [source]
        drift = value(found, "kvwatch_kv_plan_drift_ratio", engine=source, rank="0")
        estimate_error = value(found, "kvwatch_kv_plan_estimate_error_ratio", engine=source, rank="0")
        if source == "estimated":
            assert drift is None and estimate_error == pytest.approx(error)
        else:
            assert estimate_error is None and drift == pytest.approx(error)


def test_memory_parts_only_as_stated_and_the_budget_only_where_known() -> None:
    """An engine that stated no part (a CPU engine, one still loading) has no memory series; one that
    stated some has those only; no requested budget without a CUDA card's total."""
    stated = EngineStatus("gpu", EngineState.READY, log_memory_parts={"weights": 7 * GiB, "kv_cache": 31 * GiB},
                          memory_requested_bytes=40 * GiB)
    silent = EngineStatus("cpu", EngineState.READY)
    found = samples(render(WatchSnapshot(taken_at=1.0, engines=(EngineSnapshot(stated, up=True),
                                                                EngineSnapshot(silent, up=True)))))
    assert {(s["engine"], s["part"]): value(found, "kvwatch_engine_memory_bytes", **s)
            for s in series(found, "kvwatch_engine_memory_bytes")} == {("gpu", "weights"): 7 * GiB,
                                                                      ("gpu", "kv_cache"): 31 * GiB}
    assert series(found, "kvwatch_engine_memory_requested_bytes") == [{"engine": "gpu"}]
    assert value(found, "kvwatch_engine_memory_requested_bytes", engine="gpu") == 40 * GiB


def test_a_recommendation_is_exported_with_its_change_reason_and_expected_figures() -> None:
    from kvwatch.planner.flag_change import FlagChange
    from kvwatch.planner.pressure import Recommendation
    found_rec = Recommendation(FlagChange({"--kv-cache-dtype": "fp8"}), "12.0 preemptions per minute: an fp8 KV "
                               "cache holds twice the tokens", 100_000, 200_000, 24.4, 48.8)
    pressed = EngineStatus("kimi", EngineState.READY, recommendation=found_rec)
    calm = EngineStatus("glm", EngineState.READY)
    found = samples(render(WatchSnapshot(taken_at=1.0, engines=(EngineSnapshot(pressed, up=True),
                                                                EngineSnapshot(calm, up=True)))))
    assert series(found, "kvwatch_recommendation_info") == [
        {"engine": "kimi", "change": "--kv-cache-dtype fp8", "reason": found_rec.reason}]
    assert {s["plan"]: value(found, "kvwatch_recommendation_kv_tokens", **s)
            for s in series(found, "kvwatch_recommendation_kv_tokens")} == {"current": 100_000, "recommended": 200_000}
    assert value(found, "kvwatch_recommendation_concurrency", engine="kimi", plan="recommended") == 48.8


def test_before_the_first_tick_only_build_info() -> None:
    found = samples(render(WatchSnapshot.empty()))
    assert set(found) == {("kvwatch_build_info", frozenset({("version", "0.1.0")}))}


# -- the watch loop on the NVML stand-in -------------------------------------------------

def host(*, gpu1_lost: bool = False, foreign_on_0: bool = True, engine_on_1: bool = True) -> StandinState:
    gpu0 = [StandinProcess(100, 30 * GIB), StandinProcess(101, 2 * GIB), StandinProcess(200, 7 * GIB)]
    if foreign_on_0:
        gpu0.append(StandinProcess(777, 3 * GIB))
    gpu1 = [StandinProcess(888, 1 * GIB)] + ([StandinProcess(101, 5 * GIB)] if engine_on_1 else [])
    return StandinState(gpus=[
        StandinGpu(uuid=H200_A, name="NVIDIA H200", memory_total_bytes=141 * GIB, memory_used_bytes=43 * GIB,
                   processes=gpu0),
        StandinGpu(uuid=H200_B, name="NVIDIA H200", memory_total_bytes=141 * GIB, memory_used_bytes=6 * GIB,
                   processes=gpu1, lost=gpu1_lost),
    ])


def two_engines() -> list[EngineTarget]:
    return [EngineTarget(EngineStatus("a", EngineState.READY, pids=(100, 101)), url=None),
            EngineTarget(EngineStatus("b", EngineState.STARTING, pids=(200,)), url=None)]


@pytest.fixture
def nvml(nvml_standin: NvmlStandin) -> Iterator[Nvml]:
    nvml_standin.write(host())
    with Nvml() as handle:
        yield handle


def test_engine_and_foreign_bytes_per_gpu(nvml: Nvml) -> None:
    watch = Watch(two_engines, nvml=nvml.snapshot)
    watch.tick()
    found = samples(render(watch))
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=H200_A) == 32 * GIB
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=H200_B) == 5 * GIB
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=H200_A) == 7 * GIB
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=H200_B) is None
    assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=H200_A) == 3 * GIB
    assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=H200_B) == 1 * GIB
    assert value(found, "kvwatch_gpu_memory_total_bytes", gpu=H200_B) == 141 * GIB
    assert value(found, "kvwatch_collector_success", collector="nvml") == 1


def test_a_data_parallel_engine_gpu_memory_by_rank(nvml: Nvml) -> None:
    # Engine "a" runs two DP ranks: pid 100 is rank 0's worker (GPU A), 101 rank 1's (GPU A and B);
    # its API server (pid 99) holds nothing. The NVML stand-in host() as above.
    ranks = {100: 0, 101: 1}
    engines = [EngineTarget(EngineStatus("a", EngineState.READY, pids=(99, 100, 101), pid_ranks=ranks), url=None),
               EngineTarget(EngineStatus("b", EngineState.STARTING, pids=(200,)), url=None)]
    watch = Watch(lambda: engines, nvml=nvml.snapshot)
    watch.tick()
    found = samples(render(watch))
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=H200_A) == 30 * GIB
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="1", gpu=H200_A) == 2 * GIB
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="1", gpu=H200_B) == 5 * GIB
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="b", rank="0", gpu=H200_A) == 7 * GIB
    assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=H200_A) == 3 * GIB   # ranks are not foreign


def test_a_process_that_exits_disappears_from_the_next_scrape(nvml_standin: NvmlStandin, nvml: Nvml) -> None:
    watch = Watch(two_engines, nvml=nvml.snapshot)
    watch.tick()
    assert value(samples(render(watch)), "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=H200_B) == 5 * GIB
    nvml_standin.write(host(foreign_on_0=False, engine_on_1=False))  # the driver no longer lists them
    watch.tick()
    found = samples(render(watch))
    assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=H200_A) == 0
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=H200_B) is None
    assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="a", rank="0", gpu=H200_A) == 32 * GIB


def test_a_lost_gpu_drops_its_series_and_fails_the_collector(nvml_standin: NvmlStandin, nvml: Nvml) -> None:
    watch = Watch(two_engines, nvml=nvml.snapshot)
    watch.tick()
    nvml_standin.write(host(gpu1_lost=True))
    watch.tick()
    found = samples(render(watch))
    assert value(found, "kvwatch_collector_success", collector="nvml") == 0
    assert all(s.get("gpu") != H200_B for (_, labels) in found for s in [dict(labels)])
    assert value(found, "kvwatch_gpu_memory_used_bytes", gpu=H200_A) == 43 * GIB  # the other GPU stays
    assert value(found, "kvwatch_engine_up", engine="a") == 0  # engine series are unaffected
    nvml_standin.write(host())  # back (e.g. after a reset): the exporter never stopped
    watch.tick()
    found = samples(render(watch))
    assert value(found, "kvwatch_collector_success", collector="nvml") == 1
    assert value(found, "kvwatch_gpu_memory_used_bytes", gpu=H200_B) == 6 * GIB


def test_no_driver_no_gpu_series_and_the_collector_fails(nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(StandinState(init_error="DRIVER_NOT_LOADED"))
    with Nvml() as nvml:
        watch = Watch(two_engines, nvml=nvml.snapshot)
        watch.tick()
    found = samples(render(watch))
    assert not [n for n, _ in found if n.startswith("kvwatch_gpu") or n == "kvwatch_engine_gpu_memory_bytes"]
    assert value(found, "kvwatch_collector_success", collector="nvml") == 0
    assert value(found, "kvwatch_engine_state", engine="a", state="ready") == 1
    assert value(found, "kvwatch_build_info", version="0.1.0") == 1


def test_without_nvml_configured_there_is_no_nvml_collector() -> None:
    watch = Watch(two_engines)
    watch.tick()
    found = samples(render(watch))
    assert value(found, "kvwatch_collector_success", collector="nvml") is None
    assert value(found, "kvwatch_collector_success", collector="engine") == 1


def test_foreign_bytes_are_left_out_while_an_engine_has_unknown_pids(nvml: Nvml) -> None:
    external = [EngineTarget(EngineStatus("x", EngineState.READY), url=None, external=True, pids_known=False)]
    watch = Watch(lambda: external, nvml=nvml.snapshot)
    watch.tick()
    found = samples(render(watch))
    assert series(found, "kvwatch_gpu_foreign_memory_bytes") == []
    assert value(found, "kvwatch_gpu_memory_used_bytes", gpu=H200_A) == 43 * GIB


def test_an_engine_gone_from_the_source_disappears() -> None:
    engines = two_engines()
    watch = Watch(lambda: list(engines))
    watch.tick()
    assert {s["engine"] for s in series(samples(render(watch)), "kvwatch_engine_up")} == {"a", "b"}
    engines.pop()
    watch.tick()
    found = samples(render(watch))
    assert {s["engine"] for s in series(found, "kvwatch_engine_up")} == {"a"}
    assert not [labels for (_, labels) in found if ("engine", "b") in labels]


def test_a_scrape_never_waits_for_a_slow_source() -> None:
    """While a tick hangs in NVML, scrapes render the previous snapshot (how fast: bench/bench_deadlines.py)."""
    release, finished = threading.Event(), threading.Event()
    calls = []

    def slow_nvml() -> NvmlSnapshot:
        calls.append(1)
        if len(calls) > 1:
            release.wait(60)
            finished.set()
        return NvmlSnapshot(True, None, "x", (GpuInfo(0, H200_A, "n", 1, 1, None, ()),), ())

    watch = Watch(two_engines, nvml=slow_nvml, interval=0.05, all_gpus=True)  # a GPU no engine uses
    watch.start()
    try:
        eventually(lambda: len(calls) >= 2, 5, 0.01)
        assert len(calls) >= 2  # the second tick is stuck in NVML now
        for _ in range(20):
            found = samples(render(watch))
        assert not finished.is_set()  # every render returned while the tick was still stuck
        assert value(found, "kvwatch_gpu_memory_total_bytes", gpu=H200_A) == 1
    finally:
        release.set()
        watch.stop()


def test_a_failing_process_source_fails_its_collector_only() -> None:
    def broken(pids: object) -> dict[int, int]:
        raise PermissionError("no /proc")

    watch = Watch(two_engines, process_source=broken)
    snap = watch.tick()
    assert {r.name: r.success for r in snap.collectors} == {"engine": True, "process": False}
    assert [e.process_rss for e in snap.engines] == [None, None]


def test_process_rss_per_engine_through_the_psutil_reader() -> None:
    from kvwatch.boundary import proc_inspect

    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"  # running python now
        status = EngineStatus("a", EngineState.READY, pids=(child.pid, 999_999_999))
        watch = Watch(lambda: [EngineTarget(status, url=None)], process_source=proc_inspect.rss)
        rss = watch.tick().engines[0].process_rss
        assert rss is not None and list(rss) == [child.pid] and rss[child.pid] > 1 << 20
        found = samples(render(watch))
        assert value(found, "kvwatch_engine_process_resident_bytes", engine="a", rank="0") == rss[child.pid]
        assert value(found, "kvwatch_collector_success", collector="process") == 1
        child.kill()
        child.wait()
        assert watch.tick().engines[0].process_rss == {}  # exited: gone from the next snapshot
        assert series(samples(render(watch)), "kvwatch_engine_process_resident_bytes") == []
    finally:
        child.kill()
        child.wait()


def test_process_rss_is_summed_by_data_parallel_rank() -> None:
    status = EngineStatus("a", EngineState.READY, pids=(10, 11, 12, 13), pid_ranks={11: 0, 12: 1, 13: 1})
    snap = WatchSnapshot(taken_at=1.0, engines=(EngineSnapshot(status, up=True,
                                                              process_rss={10: 100, 11: 1000, 12: 5, 13: 7}),))
    found = samples(render(snap))
    assert {(d["rank"], value(found, "kvwatch_engine_process_resident_bytes", **d))
            for d in series(found, "kvwatch_engine_process_resident_bytes")} == {("", 100), ("0", 1000), ("1", 12)}


def test_the_watch_loops_said_once_memory_stays_bounded() -> None:
    """An engine whose figures disagree differently every tick: each new disagreement is said, and the
    loop's memory of what it said never grows past its bound (it leaked one string per tick)."""
    from kvwatch.exporter import watch as watch_module
    loop = watch_module.Watch(lambda: [])
    for tick in range(watch_module._MAX_WARNED * 3):
        loop._warn_once(f"e:0:blocks {tick} != {tick + 1}", "x")
    assert len(loop._warned) <= watch_module._MAX_WARNED
