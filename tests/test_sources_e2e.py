"""On a real Prometheus: `kvwatch run` on a CPU host without NVML has no nvml collector, so the shipped
KvwatchCollectorFailing does not fire; with a driver (the NVML stand-in) the collector is there as before.

The engine is tests/fake_engine.py (vLLM's flags and routes, no model); the alert rules are the shipped
ones with `for:` shortened (prometheus_support.rules_with_short_for).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_support import free_port, http_get, llama_config, write_model
from nvml_standin import LIBRARY_ENV, STATE_ENV, NvmlStandin
from prometheus_support import prometheus_server, rules_with_short_for
from waiting import eventually

from kvwatch.boundary.nvml import Nvml

pytestmark = pytest.mark.promtool

REPO = Path(__file__).resolve().parent.parent
FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")


def _run(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    model = write_model(tmp_path / "model", llama_config())
    port = free_port()
    engine = [sys.executable, FAKE, "--model", str(model), "--port", str(free_port()), "--block-size", "32"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch.cli", "run", "--name", "cpu", "--listen", f"127.0.0.1:{port}",
         "--state-dir", str(tmp_path / "state"), "--", *engine],
        cwd=REPO, env={**env, "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=open(tmp_path / "kvwatch-run.log", "ab"),
        stderr=subprocess.STDOUT, start_new_session=True)
    return proc, port


def _serving(port: int) -> bool:
    try:
        return 'kvwatch_engine_state{engine="cpu",state="ready"} 1.0' in http_get(f"http://127.0.0.1:{port}/metrics")[1]
    except OSError:
        return False


def _alerts_and_nvml(tmp_path: Path, port: int) -> tuple[list[str], list[dict]]:
    """After the rules (for: 2s) have been evaluated a while: the firing alerts, and the nvml series."""
    rules = rules_with_short_for(tmp_path / "rules.yml", 2)
    with prometheus_server(tmp_path / "prometheus", [f"127.0.0.1:{port}"], rules) as prom:
        assert eventually(lambda: prom.query('kvwatch_collector_success{collector="engine"}'), 60, 0.2)
        time.sleep(6)   # three `for:` periods of evaluations
        return ([a["labels"]["alertname"] for a in prom.firing_alerts()],
                prom.query('kvwatch_collector_success{collector="nvml"}'))


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


def test_kvwatch_run_without_nvml_has_no_nvml_collector_and_no_collector_alert(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (LIBRARY_ENV, STATE_ENV)}
    if Nvml().driver_present():
        pytest.skip("this host has an NVML driver")
    proc, port = _run(tmp_path, env)
    try:
        assert eventually(lambda: _serving(port), 60, 0.2), (tmp_path / "kvwatch-run.log").read_text()
        firing, nvml = _alerts_and_nvml(tmp_path, port)
    finally:
        _stop(proc)
    assert nvml == []
    assert "KvwatchCollectorFailing" not in firing, firing


def test_with_the_nvml_standin_the_collector_is_present_as_before(tmp_path: Path, nvml_standin: NvmlStandin) -> None:
    proc, port = _run(tmp_path, {**os.environ, **nvml_standin.env})
    try:
        assert eventually(lambda: _serving(port), 60, 0.2), (tmp_path / "kvwatch-run.log").read_text()
        firing, nvml = _alerts_and_nvml(tmp_path, port)
    finally:
        _stop(proc)
    assert [float(r["value"][1]) for r in nvml] == [1.0]
    assert "KvwatchCollectorFailing" not in firing, firing


@pytest.mark.parametrize("standin", [False, True])
def test_kvwatch_export_wires_nvml_only_where_it_fits(tmp_path: Path, standin: bool, request) -> None:
    """`kvwatch export` follows the same rule as `kvwatch run`: no nvml collector on a host without an
    NVML driver, the collector as before with one (the stand-in)."""
    env = {k: v for k, v in os.environ.items() if k not in (LIBRARY_ENV, STATE_ENV)}
    if standin:
        env.update(request.getfixturevalue("nvml_standin").env)
    elif Nvml().driver_present():
        pytest.skip("this host has an NVML driver")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", f"http://127.0.0.1:{free_port()}",
         "--name", "ext", "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"),
         "--interval", "0.5"], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        def page() -> str:
            try:
                return http_get(f"http://127.0.0.1:{port}/metrics")[1]
            except OSError:
                return ""
        assert eventually(lambda: 'kvwatch_collector_success{collector="engine"}' in page(), 30, 0.2)
        assert ('kvwatch_collector_success{collector="nvml"}' in page()) is standin
    finally:
        _stop(proc)
