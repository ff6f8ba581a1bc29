"""kvwatch/exporter/kv_figures.py: the watch loop's KV figures are plan_for_reported's and
actual_per_rank's, computed again only when the engine's report or its context changed."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvwatch.boundary import engine_http
from kvwatch.exporter import kv_figures
from kvwatch.exporter.actual import KvContext, actual_per_rank, plan_for_reported
from kvwatch.exporter.kv_figures import KvFiguresMemo
from kvwatch.exporter.targets import kv_context
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand

METRICS = Path(__file__).parent / "fixtures" / "metrics"


@pytest.fixture
def context(tmp_path: Path) -> KvContext:
    (tmp_path / "config.json").write_text((METRICS / "cpu_block64.config.json").read_text())
    argv = json.loads((METRICS / "cpu_block64.argv.json").read_text())
    return kv_context(EngineCommand(("vllm", "serve", str(tmp_path), *argv)), Device("cpu", "cpu"))


def page(name: str = "cpu_block64.txt") -> engine_http.EngineMetrics:
    metrics = engine_http.parse_page((METRICS / name).read_bytes())
    assert metrics.ok and metrics.cache is not None
    return metrics


def test_the_figures_are_the_functions_and_are_kept_while_their_inputs_are(
        context: KvContext, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(kv_figures, "plan_for_reported", lambda *a: calls.append("plan") or plan_for_reported(*a))
    memo, metrics = KvFiguresMemo(), page()
    first = memo.figures("e", context, True, metrics, 1000, None)
    assert first.planned == plan_for_reported(context, metrics.cache)
    assert first.ranks == actual_per_rank(context, metrics.ranks, 1000, None)
    # the next tick's page: other usage and counters, the same cache config
    busier = replace(metrics, kv_cache_usage_ratio=0.5, load=engine_http.EngineLoad(running=3.0))
    assert memo.figures("e", context, True, busier, 1000, None) is first
    assert calls == ["plan"]
    # a restart with another block count, or new log figures, or another context: computed again
    other = replace(metrics, cache=replace(metrics.cache, num_gpu_blocks=100))
    assert memo.figures("e", context, True, other, 1000, None).planned == plan_for_reported(context, other.cache)
    memo.figures("e", context, True, other, 2000, None)
    memo.figures("e", replace(context), True, other, 2000, None)
    assert calls == ["plan"] * 4


def test_a_supervised_engine_gets_no_plan_and_a_failure_is_not_kept(
        context: KvContext, monkeypatch: pytest.MonkeyPatch) -> None:
    memo, metrics = KvFiguresMemo(), page()
    assert memo.figures("s", context, False, metrics, None, None).planned is None

    def fails(*_: object) -> None:
        raise ValueError("a model the planner cannot handle")

    monkeypatch.setattr(kv_figures, "plan_for_reported", fails)
    for _ in range(2):   # raised each time: the watch loop warns once, the memo keeps nothing
        with pytest.raises(ValueError):
            memo.figures("x", context, True, metrics, None, None)
