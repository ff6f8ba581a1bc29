"""A real Prometheus scraping a real kvwatch: every dashboard panel returns data, alerts fire when made real.

- `kvwatch run` supervises the real CPU engine; the NVML stand-in plays a 2-GPU host on which the
  engine's processes and a foreign process hold memory (the GPU panels).
- `kvwatch export` watches an engine stand-in serving a real captured /metrics page; the test then makes
  the engine report fewer blocks than planned: KvwatchPlanDrift must fire then, and not before.
"""
from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from engine_support import engine_argv, engine_env, free_port, http_get, llama_config, write_model
from exporter_support import samples, value
from nvml_standin import GIB, StandinGpu, StandinProcess, StandinState, StandinUnavailable, standin_library
from operator_tools import DASHBOARD_FILE
from prometheus_support import prometheus_server, rules_with_short_for
from waiting import eventually

from kvwatch import __version__

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]
METRICS = REPO / "tests" / "fixtures" / "metrics"
GPU0 = "GPU-e2e00000-0000-4000-8000-000000000000"
GPU1 = "GPU-e2e00000-0000-4000-8000-000000000001"
# Series no target of this test can have, by the panel queries that read them, and why; each is
# checked to be absent instead (kvwatch exports what it knows, never a NaN placeholder).
NOT_ON_THIS_HOST = {
    "kvwatch_kv_plan_estimate_error_ratio": "both plans are exact (VLLM_CPU_KVCACHE_SPACE; the engine's "
                                            "kv_cache_memory_bytes), so they drift and have no estimate error",
    "kvwatch_engine_memory_bytes": "the CPU engine logs no GPU memory profile",
    "kvwatch_engine_memory_requested_bytes": "the supervised engine's plan is for the CPU, not a CUDA card",
    "kvwatch_recommendation_info": "the engine is under no KV pressure (no preemptions): nothing to recommend",
    "kvwatch_recommendation_kv_tokens": "no recommendation, so no expected figures",
    "kvwatch_recommendation_concurrency": "no recommendation, so no expected figures",
    "kvwatch_gpu_release_wait_seconds": "the engine runs on the CPU: no GPU memory to wait for before a relaunch",
}
# Grafana's variables as "All" and the rate interval Grafana would pick for a 1 s scrape.
VARIABLES = {"$__rate_interval": "15s", "$instance": ".*", "$engine": ".*", "$gpu": ".*"}


def panel_expressions() -> list[tuple[str, str]]:
    def walk(panels):
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))
    found = []
    for panel in walk(json.loads(DASHBOARD_FILE.read_text())["panels"]):
        for target in panel.get("targets", []):
            expr = target.get("expr", "")
            for name, replacement in VARIABLES.items():
                expr = expr.replace("${" + name[1:] + "}", replacement).replace(name, replacement)
            if expr:
                found.append((panel.get("title", "?"), expr))
    return found


class EngineStandIn(http.server.ThreadingHTTPServer):
    """Serves a real /metrics page captured from the CPU engine; the test can change its figures."""

    def __init__(self, page: str):
        super().__init__(("127.0.0.1", 0), _StandInHandler)
        self.page = page


class _StandInHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = (b"" if self.path == "/health" else self.server.page.encode())  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def wait_for(predicate, timeout: float, what: str):
    result = eventually(predicate, timeout, 1)
    if not result:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return result


def firing(prom, alertname: str, engine: str) -> bool:
    return any(a["labels"].get("alertname") == alertname and a["labels"].get("engine") == engine
               for a in prom.firing_alerts())


def check_supervised_metrics(text: str) -> None:
    """kvwatch run's own /metrics, name by name, against the engine's log and kvwatch's plan."""
    found = samples(text)
    e = {"engine": "e2e"}
    k = {**e, "rank": "0"}   # KV series: per data-parallel rank (one here)
    # 2 layers, 2 kv heads of 32, bf16, block 128 (the CPU default): 65,536 B per block; 1 GiB -> 16,384 blocks.
    assert value(found, "kvwatch_engine_up", **e) == 1
    assert value(found, "kvwatch_engine_state", **e, state="ready") == 1
    assert sum(value(found, "kvwatch_engine_state", **e, state=s) for s in
               ("starting", "ready", "backoff", "stopping", "stopped", "fatal")) == 1
    assert value(found, "kvwatch_plan_info", **e, block_size="128", kv_cache_dtype="auto", backend="CPU_ATTN",
                 attention="full", source="exact") == 1   # VLLM_CPU_KVCACHE_SPACE fixes the KV memory
    assert value(found, "kvwatch_kv_planned_blocks", **k) == value(found, "kvwatch_kv_actual_blocks", **k) == 16_384
    assert value(found, "kvwatch_kv_planned_bytes", **k) == value(found, "kvwatch_kv_actual_bytes", **k) == 2**30
    assert value(found, "kvwatch_kv_plan_drift_ratio", **k) == 0
    assert value(found, "kvwatch_kv_padding_bytes", **k, cause="null_block") == 65_536
    assert value(found, "kvwatch_kv_padding_bytes", **k, cause="remainder") == 0
    assert value(found, "kvwatch_kv_padding_ratio", **k) == value(found, "kvwatch_kv_planned_padding_ratio", **k)
    assert value(found, "kvwatch_engine_failures_total", **e, kind="block_size_unsupported") == 0
    assert value(found, "kvwatch_engine_restarts_total", **e, reason="engine_died") == 0
    assert value(found, "kvwatch_plan_corrections_total", **e, kind="kv_cache_too_small") == 0
    assert 0 <= value(found, "kvwatch_kv_usage_ratio", **k) <= 1
    assert value(found, "kvwatch_collector_success", collector="engine") == 1
    assert value(found, "kvwatch_collector_success", collector="nvml") == 1
    assert value(found, "kvwatch_collector_duration_seconds", collector="engine") >= 0
    assert value(found, "kvwatch_build_info", version=__version__) == 1


def test_dashboard_queries_and_alerts_through_real_prometheus(tmp_path: Path) -> None:
    try:
        library = standin_library()
    except StandinUnavailable as exc:
        pytest.fail(f"NVML stand-in unavailable: {exc}")
    nvml_state = tmp_path / "nvml-state.txt"
    StandinState(gpus=[StandinGpu(uuid=GPU0, name="NVIDIA H200", memory_total_bytes=141 * GIB,
                                  memory_used_bytes=2 * GIB)]).write(nvml_state)
    env = {**engine_env(1), "KVWATCH_NVML_LIBRARY": str(library), "NVML_STANDIN_STATE": str(nvml_state)}

    model = write_model(tmp_path / "model", llama_config())
    run_port, export_port = free_port(), free_port()
    state_dir = tmp_path / "state"
    run_log = open(tmp_path / "kvwatch-run.log", "wb")
    run = subprocess.Popen(
        [sys.executable, "-m", "kvwatch.cli", "run", "--name", "e2e", "--listen", f"127.0.0.1:{run_port}",
         "--state-dir", str(state_dir), "--", *engine_argv(model, free_port())],
        cwd=REPO, env=env, stdout=run_log, stderr=subprocess.STDOUT, start_new_session=True)

    standin = EngineStandIn((METRICS / "cpu_block64.txt").read_text())
    threading.Thread(target=standin.serve_forever, daemon=True).start()
    stand_model = write_model(tmp_path / "standin-model", json.loads((METRICS / "cpu_block64.config.json").read_text()))
    export = subprocess.Popen(
        [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", f"http://127.0.0.1:{standin.server_port}",
         "--name", "drifted", "--model", str(stand_model), "--device", "cpu", "--no-nvml", "--interval", "1",
         "--listen", f"127.0.0.1:{export_port}", "--state-dir", str(tmp_path / "export-state"),
         "--", "vllm", "serve", str(stand_model), "--block-size", "64"],
        cwd=REPO, env=engine_env(1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def serving() -> bool:
            # The exporter's snapshot and the supervisor's READY are taken apart: wait for both.
            page = http_get(f"http://127.0.0.1:{run_port}/metrics")[1]
            return all(needle in page for needle in (
                'kvwatch_engine_up{engine="e2e"} 1.0', 'kvwatch_engine_state{engine="e2e",state="ready"} 1.0',
                'kvwatch_kv_actual_blocks{engine="e2e",rank="0"}'))
        wait_for(serving, 400, "the supervised engine to serve")
        check_supervised_metrics(http_get(f"http://127.0.0.1:{run_port}/metrics")[1])
        status = json.loads(subprocess.run([sys.executable, "-m", "kvwatch.cli", "status", "--state-dir",
                                            str(state_dir), "--json"], capture_output=True, text=True,
                                           check=True).stdout)[0]
        engine_pids = [p["pid"] for p in status["pids"]]
        assert engine_pids, status
        # The GPU host: each engine process holds 4 GiB on GPU0, this test (foreign) 3 GiB; GPU1 idle.
        StandinState(gpus=[
            StandinGpu(uuid=GPU0, name="NVIDIA H200", memory_total_bytes=141 * GIB,
                       memory_used_bytes=(4 * len(engine_pids) + 4) * GIB,
                       processes=[*(StandinProcess(p, 4 * GIB) for p in engine_pids),
                                  StandinProcess(os.getpid(), 3 * GIB)]),
            StandinGpu(uuid=GPU1, name="NVIDIA H200", memory_total_bytes=141 * GIB, memory_used_bytes=GIB)],
        ).write(nvml_state)

        rules = rules_with_short_for(tmp_path / "rules.yml", 3)
        targets = [f"127.0.0.1:{run_port}", f"127.0.0.1:{export_port}"]
        with prometheus_server(tmp_path / "prometheus", targets, rules) as prom:
            # Every panel query returns series (counters need two samples for increase()).
            for title, expr in panel_expressions():
                if not any(name in expr for name in NOT_ON_THIS_HOST):
                    wait_for(lambda expr=expr: prom.query(expr), 60, f"panel {title!r}: {expr}")
            for name, why in NOT_ON_THIS_HOST.items():
                assert prom.query(name) == [], f"{name}: expected none ({why})"
            engine_bytes = prom.query(f'kvwatch_engine_gpu_memory_bytes{{engine="e2e",gpu="{GPU0}"}}')
            assert float(engine_bytes[0]["value"][1]) == 4 * GIB * len(engine_pids)
            foreign = prom.query(f'kvwatch_gpu_foreign_memory_bytes{{gpu="{GPU0}"}}')
            assert float(foreign[0]["value"][1]) == 3 * GIB
            drift = prom.query('kvwatch_kv_plan_drift_ratio{engine="e2e",rank="0"}')
            assert float(drift[0]["value"][1]) == 0

            # Not before: the stand-in reports what was planned; rules have been evaluated for a while.
            time.sleep(8)
            assert not firing(prom, "KvwatchPlanDrift", "drifted")
            assert not firing(prom, "KvwatchPlanDrift", "e2e")
            # Made real: the engine now reports 20,000 blocks where 21,845 were planned.
            standin.page = standin.page.replace('num_gpu_blocks="21845"', 'num_gpu_blocks="20000"')
            wait_for(lambda: firing(prom, "KvwatchPlanDrift", "drifted"), 60, "KvwatchPlanDrift to fire")
            assert not firing(prom, "KvwatchPlanDrift", "e2e")
    finally:
        for proc in (run, export):
            proc.send_signal(signal.SIGTERM)
        assert run.wait(timeout=90) == 0
        export.wait(timeout=30)
        standin.shutdown()
        run_log.close()
