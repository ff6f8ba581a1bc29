"""Scrape cost of kvwatch's /metrics on a big host: 8 GPUs and 8 engines (8 processes each
on every GPU, plus a foreign process per GPU).

Side by side in one run, p50 and p99 over N scrapes:
  - kvwatch's collector: families built afresh from the snapshot on each scrape
    (generate_latest on its registry, no I/O);
  - the same series as prometheus_client Gauges set beforehand (the "global gauges set by
    a loop" design: rendering only, the setting and stale-series removal not counted);
  - a full scrape over loopback HTTP from kvwatch's server (connection, auth off).
The ratio collector / preset gauges is the price of rendering afresh.

Run: .venv/bin/python bench/bench_scrape.py [N]    (default 2000)
"""
from __future__ import annotations

import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from exporter_support import fixture_context, fixture_metrics, fixture_plan  # noqa: E402
from prometheus_client import CollectorRegistry, Gauge, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from kvwatch.engine_status import EngineState, EngineStatus  # noqa: E402
from kvwatch.exporter.actual import actual_kv  # noqa: E402
from kvwatch.exporter.collector import KvwatchCollector  # noqa: E402
from kvwatch.exporter.server import MetricsServer, RenderCache  # noqa: E402
from kvwatch.exporter.snapshot import CollectorResult, EngineSnapshot, WatchSnapshot  # noqa: E402
from kvwatch.gpu_types import GpuInfo, GpuProcess, NvmlSnapshot  # noqa: E402

GIB = 1 << 30
GPUS = ENGINES = 8


def big_snapshot() -> WatchSnapshot:
    metrics = fixture_metrics("cpu_block64")
    actual = actual_kv(fixture_context("cpu_block64"), metrics.cache, log_kv_tokens=1_398_080)
    plan = fixture_plan("cpu_block64")
    engines = []
    for e in range(ENGINES):
        pids = tuple(10_000 + e * 100 + i for i in range(GPUS + 1))  # API server + one worker per GPU
        status = EngineStatus(f"engine-{e}", EngineState.READY, plan=plan, pids=pids,
                              restarts={"engine_died": e}, failures={"engine_died": e, "cuda_oom": 1})
        engines.append(EngineSnapshot(status, up=True, metrics=metrics, planned=plan, actual=actual))
    gpus = []
    for g in range(GPUS):
        procs = [GpuProcess(10_000 + e * 100 + 1 + g, 16 * GIB) for e in range(ENGINES)]
        procs.append(GpuProcess(90_000 + g, GIB))
        gpus.append(GpuInfo(g, f"GPU-{g:08d}-0000-4000-8000-000000000000", "NVIDIA H200", 141 * GIB,
                            130 * GIB, (9, 0), tuple(procs)))
    return WatchSnapshot(time.time(), tuple(engines), NvmlSnapshot(True, None, "570", tuple(gpus), ()),
                         (CollectorResult("nvml", True, 0.01), CollectorResult("engine", True, 0.03)))


def preset_gauges(text: str) -> CollectorRegistry:
    """The same series as plain Gauges with their values already set."""
    registry = CollectorRegistry()
    for family in text_string_to_metric_families(text):
        labels = sorted({k for s in family.samples for k in s.labels})
        name = family.name + ("_total" if family.type == "counter" else "")
        gauge = Gauge(name, family.documentation, labels, registry=registry)
        for s in family.samples:
            (gauge.labels(**s.labels) if labels else gauge).set(s.value)
    return registry


def timings(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def summary(name: str, xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    p50, p99 = statistics.median(xs), xs[int(len(xs) * 0.99) - 1]
    print(f"{name:<34} p50 {p50 * 1e3:7.3f} ms   p99 {p99 * 1e3:7.3f} ms")
    return p50, p99


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    snap = big_snapshot()
    registry = CollectorRegistry()
    registry.register(KvwatchCollector(lambda: snap))
    text = generate_latest(registry).decode()
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"{GPUS} GPUs, {ENGINES} engines: {series} series, {len(text):,} bytes per scrape, {n} scrapes each\n")
    gauges = preset_gauges(text)
    same = sum(1 for line in generate_latest(gauges).decode().splitlines() if line and not line.startswith("#"))
    assert same == series, (same, series)

    collector = summary("kvwatch collector (render afresh)", timings(lambda: generate_latest(registry), n))
    preset = summary("preset Gauges (render only)", timings(lambda: generate_latest(gauges), n))
    cache = RenderCache(registry, version=lambda: snap)
    cached = summary("served /metrics (rendered once/snapshot)", timings(lambda: cache.render(None), n))
    server = MetricsServer(registry, "127.0.0.1:0")
    server.start()
    try:
        url = server.url + "/metrics"
        http = summary("HTTP scrape, render per scrape", timings(lambda: urllib.request.urlopen(url).read(), n // 4))
    finally:
        server.stop()
    server = MetricsServer(registry, "127.0.0.1:0", version=lambda: snap)  # as kvwatch serves it
    server.start()
    try:
        url = server.url + "/metrics"
        summary("HTTP scrape, kvwatch (cached)", timings(lambda: urllib.request.urlopen(url).read(), n // 4))
    finally:
        server.stop()
    print(f"\nserved /metrics p99 {cached[1] * 1e3:.3f} ms: ratio to the 5 ms bar {cached[1] / 0.005:.3f}; "
          f"a fresh render (once per watch interval) p99 {collector[1] * 1e3:.2f} ms")
    print(f"\ncollector / preset gauges: p50 x{collector[0] / preset[0]:.2f}, p99 x{collector[1] / preset[1]:.2f}")
    print(f"HTTP scrape p99 / collector render p99: x{http[1] / collector[1]:.2f}")


if __name__ == "__main__":
    main()
