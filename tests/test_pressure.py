"""KV pressure turned into one flag change (kvwatch.planner.pressure): the decision table, on real plans.

Each case plans a Llama-shaped 8B model on an H100 (the NVML-free preset) with kvwatch's own planner,
hands the recommender a window of the engine's series, and checks which change comes out and that
its expected effect is the planner's figure for the changed command."""
from __future__ import annotations

from pathlib import Path

import pytest
from engine_support import llama_config, write_model

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.pressure import Window, candidates, pressure, recommend
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

GIB = 1 << 30
H100 = preset("h100")
RULES = ruleset_for("0.32.0")
VERSION = parse_version("0.32.0")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = llama_config(layers=32, kv_heads=8, heads=32, head_dim=128, max_len=32768,
                          hidden_size=4096, intermediate_size=14336, vocab_size=128256)
    return write_model(tmp_path_factory.mktemp("m") / "llama8b", config)


def planner(argv: list[str]):
    def plan(change: FlagChange | None = None):
        command = EngineCommand(tuple(argv))
        if change is not None:
            command = change.apply(command)
        return plan_command(command.argv, H100, RULES, env={}, vllm_version=VERSION)
    return plan


PRESSED = dict(seconds=300.0, preemptions=50.0)


@pytest.mark.parametrize("name,extra,window,change", [
    ("no pressure: nothing", [], Window(300, 0, kv_usage=0.5, waiting=0), None),
    ("bf16 KV: fp8 first", [], Window(**PRESSED), {"--kv-cache-dtype": "fp8"}),
    ("fp8 already, NVML shows room: utilization", ["--kv-cache-dtype", "fp8"],
     Window(**PRESSED, gpu_free_bytes=2 * GIB), {"--gpu-memory-utilization": "0.93"}),   # 0.92 + 1 GiB / 79.18
    ("much room: utilization up to its cap", ["--kv-cache-dtype", "fp8"],
     Window(**PRESSED, gpu_free_bytes=20 * GIB), {"--gpu-memory-utilization": "0.95"}),
    ("fp8, no room, short requests: max-num-seqs", ["--kv-cache-dtype", "fp8"],
     Window(**PRESSED, mean_request_tokens=4000), "--max-num-seqs"),
    ("the kv cache memory is fixed: no utilization change", ["--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "8G"],
     Window(**PRESSED, gpu_free_bytes=6 * GIB), None),
    ("full with requests waiting counts as pressure", [],
     Window(300, 0, kv_usage=0.97, waiting=3), {"--kv-cache-dtype": "fp8"}),
    ("long-unused length: max-model-len", ["--kv-cache-dtype", "fp8"],
     Window(**PRESSED, max_request_tokens=1500), {"--max-model-len": "2048"}),
    ("spare GPUs: more TP", ["--kv-cache-dtype", "fp8"], Window(**PRESSED, gpus_unused=4),
     {"--tensor-parallel-size": "2"}),
])
def test_the_decision_table(model: Path, name: str, extra: list[str], window: Window, change: object) -> None:
    plan = planner(["vllm", "serve", str(model), *extra])
    before = plan()
    found = recommend(before, EngineCommand(tuple(["vllm", "serve", str(model), *extra])).settings(), window, plan)
    if change is None:
        assert found is None, name
        return
    assert found is not None, name
    if isinstance(change, str):
        assert list(found.change.set) == [change], name
    else:
        assert found.change == FlagChange(change), name
    after = plan(found.change)
    # the expected effect is the planner's own figure for the changed command
    assert (found.tokens_before, found.tokens_after) == (before.kv_cache_tokens, after.kv_cache_tokens)
    assert (found.concurrency_before, found.concurrency_after) == (before.max_concurrency, after.max_concurrency)


def test_fp8_is_not_recommended_where_the_backend_refuses_it(model: Path) -> None:
    # Turing (SM 7.5): vLLM's CUDA backends run no fp8 KV cache there; the planner predicts the refusal.
    from kvwatch.planner.devices import Device
    turing = Device("cuda", "Tesla T4", (7, 5), 15 * GIB, source="given")
    argv = ["vllm", "serve", str(model), "--max-model-len", "4096", "--dtype", "half"]

    def plan(change: FlagChange | None = None):
        command = EngineCommand(tuple(argv)) if change is None else change.apply(EngineCommand(tuple(argv)))
        return plan_command(command.argv, turing, RULES, env={}, vllm_version=VERSION)
    before = plan()
    fp8 = plan(FlagChange({"--kv-cache-dtype": "fp8"}))
    found = recommend(before, EngineCommand(tuple(argv)).settings(), Window(**PRESSED, mean_request_tokens=900), plan)
    assert found is not None
    assert ("--kv-cache-dtype" in found.change) == (not fp8.will_fail)


def test_fixed_flags_and_rolled_back_changes_are_skipped(model: Path) -> None:
    argv = ["vllm", "serve", str(model)]
    plan = planner(argv)
    settings = EngineCommand(tuple(argv)).settings()
    window = Window(**PRESSED, mean_request_tokens=4000)
    first = recommend(plan(), settings, window, plan)
    assert first is not None and "--kv-cache-dtype" in first.change
    second = recommend(plan(), settings, window, plan, tried=[first.change])
    assert second is not None and "--max-num-seqs" in second.change
    assert recommend(plan(), settings, window, plan, fixed=["--kv-cache-dtype", "--max-num-seqs"]) is None


@pytest.mark.parametrize("window,why", [
    (Window(60, 1), "1.0 preemptions per minute"),
    (Window(120, 1), None),
    (Window(60, 0, kv_usage=0.95, waiting=0.5), None),
    (Window(60, 0, kv_usage=0.95, waiting=2), "KV cache 95% full with 2.0 requests waiting"),
    (Window(0, 10), None),
])
def test_pressure(window: Window, why: str | None) -> None:
    assert pressure(window) == why


def test_candidates_follow_the_table_order(model: Path) -> None:
    argv = ["vllm", "serve", str(model)]
    plan = planner(argv)()
    window = Window(**PRESSED, gpu_free_bytes=6 * GIB, mean_request_tokens=4000, max_request_tokens=1000, gpus_unused=2)
    flags = [next(iter(c.set)) for c, _ in candidates(plan, EngineCommand(tuple(argv)).settings(), window)]
    assert flags == ["--kv-cache-dtype", "--gpu-memory-utilization", "--max-num-seqs", "--max-model-len",
                     "--tensor-parallel-size"]


def test_a_standing_recommendation_keeps_its_reason(model: Path) -> None:
    """PressureWatch (the supervisor's and kvwatch export's): while the same change stands, each
    judgement keeps the reason it was first made for, though the preemption rate moves. The reason is a
    label of kvwatch_recommendation_info: a new value each judgement is a new series, and
    KvwatchKvPressure's `for:` would start again each time (it never fired on the real Prometheus)."""
    from kvwatch.watchdog.pressure_watch import PressureWatch
    from kvwatch.watchdog.pressure_window import LoadSample

    argv = ["vllm", "serve", str(model)]
    plan = planner(argv)
    settings = EngineCommand(tuple(argv)).settings()
    watch = PressureWatch(window_seconds=60.0, every_seconds=10.0)
    reasons = []
    preemptions = 0.0
    for second in range(0, 61, 5):
        preemptions += 1 + second // 10            # a rate that grows: each judgement sees another
        watch.observe(LoadSample(float(second), preemptions))
        changed = watch.judge(float(second), plan(), settings, None, plan)
        if watch.recommendation is not None:
            reasons.append((changed, watch.recommendation.reason, watch.recommendation.change.describe()))
    assert len(reasons) >= 3, reasons
    assert [r[0] for r in reasons] == [True] + [False] * (len(reasons) - 1)
    assert {r[1:] for r in reasons} == {reasons[0][1:]}, reasons
    assert reasons[0][2] == "--kv-cache-dtype fp8"
