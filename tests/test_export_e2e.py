"""`kvwatch export` against the real vLLM CPU engine, with the NVML stand-in as the GPU host:
kvwatch's own /metrics scraped and checked name by name."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from engine_support import free_port, http_get, llama_config, running_engine, write_model
from exporter_support import samples, series, value
from nvml_standin import (
    GIB,
    NvmlStandin,
    StandinGpu,
    StandinProcess,
    StandinState,
)
from waiting import eventually

from kvwatch import __version__
from kvwatch.diagnosis.startup_lines import kv_tokens

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[1]
GPU = "GPU-e2e00000-0000-4000-8000-000000000001"


def logged_kv_tokens(log: str) -> int:
    logged = [tokens for line in log.splitlines() if (tokens := kv_tokens(line)) is not None]
    assert logged, "the engine logged no KV cache size"
    return logged[0]


def test_export_the_real_cpu_engine(tmp_path: Path, nvml_standin: NvmlStandin) -> None:
    # 3 layers, 1 KV head of 64, block 64: 49,152 B per block; 1 GiB leaves a 16,384 B remainder
    model = write_model(tmp_path / "model", llama_config(layers=3, kv_heads=1, heads=4, head_dim=64))
    with running_engine(model, tmp_path / "engine.log", "--block-size", "64") as engine:
        # the GPU host: the engine's root process holds 20 GiB, a foreign process 3 GiB
        root = engine.process.pid
        nvml_standin.write(StandinState(gpus=[StandinGpu(
            uuid=GPU, name="NVIDIA H200", memory_total_bytes=141 * GIB, memory_used_bytes=24 * GIB,
            processes=[StandinProcess(root, 20 * GIB), StandinProcess(4_000_000, 3 * GIB)])]))
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvwatch.cli", "export", "--engine-url", engine.url, "--name", "cpu",
             "--model", str(model), "--device", "cpu", "--engine-pid", str(root),
             "--listen", f"127.0.0.1:{port}", "--interval", "0.5", "--state-dir", str(tmp_path / "state")],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **nvml_standin.env})
        try:
            found: dict = {}

            def has_actual() -> bool:
                nonlocal found
                status, body = http_get(f"http://127.0.0.1:{port}/metrics")
                found = samples(body) if status == 200 else {}
                if value(found, "kvwatch_kv_actual_blocks", engine="cpu", rank="0") is not None:
                    return True
                assert proc.poll() is None, proc.stdout.read()  # type: ignore[union-attr]
                return False
            eventually(has_actual, 60, interval=0.5)
            tokens = logged_kv_tokens(engine.log())

            assert value(found, "kvwatch_engine_up", engine="cpu") == 1
            assert value(found, "kvwatch_engine_state", engine="cpu", state="ready") == 1
            assert value(found, "kvwatch_plan_info", engine="cpu", block_size="64", kv_cache_dtype="auto",
                         backend="CPU_ATTN", attention="full", source="exact") == 1
            actual_blocks = value(found, "kvwatch_kv_actual_blocks", engine="cpu", rank="0")
            assert actual_blocks == tokens // 64 == 21_845  # the engine's own figure, from its log too
            assert value(found, "kvwatch_kv_planned_blocks", engine="cpu", rank="0") == actual_blocks
            actual_bytes = value(found, "kvwatch_kv_actual_bytes", engine="cpu", rank="0")
            assert actual_bytes == 21_845 * 49_152
            assert value(found, "kvwatch_kv_planned_bytes", engine="cpu", rank="0") == actual_bytes
            assert value(found, "kvwatch_kv_plan_drift_ratio", engine="cpu", rank="0") == 0
            assert value(found, "kvwatch_kv_padding_bytes", engine="cpu", rank="0", cause="remainder") == 16_384
            assert value(found, "kvwatch_kv_padding_bytes", engine="cpu", rank="0", cause="null_block") == 49_152
            ratio = value(found, "kvwatch_kv_padding_ratio", engine="cpu", rank="0")
            assert ratio == value(found, "kvwatch_kv_planned_padding_ratio", engine="cpu", rank="0")
            assert ratio == pytest.approx((16_384 + 49_152) / actual_bytes)
            usage = value(found, "kvwatch_kv_usage_ratio", engine="cpu", rank="0")
            assert usage is not None and 0 <= usage <= 1
            assert {s["kind"] for s in series(found, "kvwatch_engine_failures_total")} >= {"engine_died", "unknown"}
            # NVML through the stand-in, in the exporter's process
            assert value(found, "kvwatch_gpu_info", gpu=GPU, index="0", name="NVIDIA H200") == 1
            assert value(found, "kvwatch_engine_gpu_memory_bytes", engine="cpu", rank="0", gpu=GPU) == 20 * GIB
            assert value(found, "kvwatch_gpu_foreign_memory_bytes", gpu=GPU) == 3 * GIB
            assert value(found, "kvwatch_collector_success", collector="nvml") == 1
            assert value(found, "kvwatch_collector_success", collector="engine") == 1
            assert value(found, "kvwatch_build_info", version=__version__) == 1

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0
        finally:
            proc.kill()
            proc.wait()
