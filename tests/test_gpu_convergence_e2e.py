"""A GPU host end to end, without a GPU: `kvwatch run --device gpu` on the NVML stand-in as an H100
(real nvidia-ml-py, compiled fake driver), an engine stand-in replaying a real H100 start-up log
(vllm#10511: Llama 3 8B, "available_kv_cache_memory 53.29GiB") and reporting its cache on /metrics,
and a real Prometheus with kvwatch's alert rules.

The first launch is planned from the estimate; as soon as the engine's profile lines arrive the plan
in force is the learned one and planned == actual; the next launch is planned learned before the
engine starts; KvwatchPlanDrift stays silent while the engine gets what was learned and fires when it
later gets fewer blocks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_support import free_port, http_get, write_model
from exporter_support import samples, series, value
from nvml_standin import NvmlStandin, StandinGpu, StandinState
from prometheus_support import prometheus_server, rules_with_short_for
from waiting import eventually

pytestmark = pytest.mark.promtool

REPO = Path(__file__).resolve().parent.parent
FAKE = str(Path(__file__).resolve().parent / "fake_engine.py")
GPU_LOGS = Path(__file__).resolve().parent / "fixtures" / "gpu_logs"
GiB = 2**30
UUID = "GPU-c0de0000-1111-4222-8333-444455556666"
# What vLLM's block count is for the log's 53.29 GiB: Llama 3 8B on an H100 takes FLASH_ATTN's
# 16-token blocks of 32 layers x K and V x 8 KV heads x 128 x 2 bytes (bf16).
BYTES_PER_BLOCK = 16 * 32 * 2 * 8 * 128 * 2
LOGGED_BLOCKS = int(53.29 * GiB) // BYTES_PER_BLOCK


# The release kvwatch reads as installed: the stand-in's lines are the form before 0.34's extensible cache
# (whose final size comes in other lines), whatever vLLM this machine has, if any.
STANDIN_RELEASE = "0.32.0"


def installed_release_env(tmp: Path, version: str = STANDIN_RELEASE) -> dict[str, str]:
    """The environment of a kvwatch that reads `version` as the installed vLLM (from package metadata)."""
    site = tmp / f"vllm-{version}-site"
    (site / f"vllm-{version}.dist-info").mkdir(parents=True, exist_ok=True)
    (site / f"vllm-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}


def wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    result = eventually(predicate, timeout, 0.2)
    if not result:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return result


def firing(prom, engine: str) -> bool:  # type: ignore[no-untyped-def]
    return any(a["labels"].get("alertname") == "KvwatchPlanDrift" and a["labels"].get("engine") == engine
               for a in prom.firing_alerts())


def plan_sources(url: str) -> set[str]:
    """The `source` of kvwatch_plan_info on kvwatch's /metrics (empty before the first plan)."""
    try:
        status, page = http_get(url)
    except OSError:
        return set()
    return {s["source"] for s in series(samples(page), "kvwatch_plan_info")} if status == 200 else set()


def test_the_plan_converges_on_the_engines_profile_and_drift_alerts_mean_something(
        tmp_path: Path, nvml_standin: NvmlStandin) -> None:
    nvml_standin.write(StandinState(gpus=[StandinGpu(uuid=UUID, name="NVIDIA H100 80GB HBM3",
                                                     memory_total_bytes=81_559 * 2**20, compute_capability=(9, 0))]))
    run_entry = next(r for r in json.loads((GPU_LOGS / "corpus.json").read_text())
                     if r["name"] == "pr10511_llama3_8b_h100_tp1")
    model = write_model(tmp_path / "llama3-8b", {k: v for k, v in run_entry["model_config"].items() if v is not None})
    blocks = tmp_path / "engine-cache.txt"
    blocks.write_text(f"16 {LOGGED_BLOCKS}")
    gate = tmp_path / "engine-may-go-on"
    engine = [sys.executable, FAKE, "--model", str(model), "--port", str(free_port()), "--ready-after", "1",
              "--gate", str(gate), "--startup-log", str(GPU_LOGS / run_entry["log_file"]), "--blocks-file", str(blocks)]
    port = free_port()
    metrics = f"http://127.0.0.1:{port}/metrics"

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "kvwatch.cli", "run", "--name", "h100", "--device", "gpu",
             "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"), "--", *engine],
            cwd=REPO, env=installed_release_env(tmp_path), stdout=open(tmp_path / "kvwatch-run.log", "ab"),
            stderr=subprocess.STDOUT, start_new_session=True)

    run = start()
    try:
        with prometheus_server(tmp_path / "prometheus", [f"127.0.0.1:{port}"],
                               rules_with_short_for(tmp_path / "rules.yml", 3)) as prom:
            # First launch: nothing learned yet, so the plan is the estimate (while the engine starts).
            assert wait_for(lambda: plan_sources(metrics), 30, "kvwatch's first plan") == {"estimated"}
            gate.touch()   # the engine goes on: its profile lines come
            # The profile lines arrive: the plan in force is refined at once, and planned == actual.
            wait_for(lambda: plan_sources(metrics) == {"learned"}, 30, "the learned plan")
            found = samples(http_get(metrics)[1])
            e = {"engine": "h100", "rank": "0"}
            assert value(found, "kvwatch_kv_planned_blocks", **e) == LOGGED_BLOCKS
            wait_for(lambda: value(samples(http_get(metrics)[1]), "kvwatch_kv_actual_blocks", **e) == LOGGED_BLOCKS,
                     30, "the engine's blocks")
            wait_for(lambda: prom.query('kvwatch_kv_plan_drift_ratio{engine="h100"} == 0'), 30, "drift 0 in Prometheus")
            assert prom.query('kvwatch_kv_plan_estimate_error_ratio{engine="h100"}') == []
            time.sleep(6)   # the rules (for: 3s) have been evaluated a few times
            assert not firing(prom, "h100")

            # The next launch is planned learned before the engine says anything.
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=30) == 0
            run = start()
            assert wait_for(lambda: plan_sources(metrics), 30, "the second launch's plan") == {"learned"}
            wait_for(lambda: value(samples(http_get(metrics)[1]), "kvwatch_kv_actual_blocks", **e) == LOGGED_BLOCKS,
                     30, "the engine's blocks again")

            # A real change: the engine now gets 10 % fewer blocks than the learned plan.
            blocks.write_text(f"16 {LOGGED_BLOCKS * 9 // 10}")
            wait_for(lambda: firing(prom, "h100"), 60, "KvwatchPlanDrift to fire")
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.kill()
            run.wait()
