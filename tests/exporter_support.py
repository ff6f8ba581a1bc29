"""Helpers for the exporter tests: contexts from the captured CPU-engine fixtures, rendering
a collector through prometheus_client, and reading the text back into a dict."""
from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.boundary.engine_http import EngineMetrics, parse_metrics
from kvwatch.exporter.actual import KvContext
from kvwatch.exporter.collector import KvwatchCollector
from kvwatch.exporter.snapshot import WatchSnapshot
from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import NO_MEMORY_INPUTS, MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for

METRICS = Path(__file__).parent / "fixtures" / "metrics"
RULES = ruleset_for("0.32.0")
CPU = Device("cpu", "cpu", cpu_fp8_kv=True)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fixture_context(name: str, device: Device = CPU) -> KvContext:
    """The model and flags of a captured engine run (tests/fixtures/metrics/NAME.*)."""
    config = json.loads((METRICS / f"{name}.config.json").read_text())
    argv = json.loads((METRICS / f"{name}.argv.json").read_text())
    settings = EngineCommand.parse(["vllm", "serve", "model", *argv]).settings()
    return KvContext(geometry_from_config(config), settings, device, RULES)


def fixture_plan(name: str, kv_bytes: int = GiB) -> Plan:
    """The plan kvwatch makes for that run (VLLM_CPU_KVCACHE_SPACE=1)."""
    ctx = fixture_context(name)
    return make_plan(ctx.geometry, ctx.settings, ctx.device, RULES, MemoryInputs(cpu_kv_space_bytes=kv_bytes))


def gpu_plan(name: str, device: Device, memory: MemoryInputs = NO_MEMORY_INPUTS) -> Plan:
    """The plan for that run's model and flags on a GPU: estimated without measured memory,
    learned with the non-KV memory of an earlier launch (``memory.non_kv_bytes``)."""
    ctx = fixture_context(name, device)
    return make_plan(ctx.geometry, ctx.settings, device, RULES, memory)


def fixture_metrics(name: str) -> EngineMetrics:
    return parse_metrics((METRICS / f"{name}.txt").read_text())


def render(snapshot: WatchSnapshot | object, version: str = "0.1.0") -> str:
    """The /metrics text for a snapshot (or anything with a .snapshot, e.g. a Watch)."""
    getter = (lambda: snapshot.snapshot) if hasattr(snapshot, "snapshot") else (lambda: snapshot)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(KvwatchCollector(getter, version=version))  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: Samples, metric: str, /, **labels: str) -> float | None:
    return found.get((metric, frozenset(labels.items())))


def series(found: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for (n, labels) in found if n == name]
