"""Where the GPU memory goes, end to end: real GPU start-up logs (tests/fixtures/gpu_logs) printed by an
engine stand-in under the real supervisor, read by the output pump, kept in the state file, carried by the
engine status to the watch loop and exported as kvwatch_engine_memory_bytes, part by part, equal to the
figures the log shows (corpus.json's `logged`, written down from the source, not by kvwatch's parser)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_support import free_port, llama_config, write_model
from exporter_support import render, samples, series, value
from test_supervisor import FAST, Recorder, Running, config, fake, supervisor
from waiting import eventually

from kvwatch.engine_status import EngineState
from kvwatch.exporter.targets import SupervisedEngines
from kvwatch.exporter.watch import Watch
from kvwatch.planner.devices import Device, cuda_total_bytes
from kvwatch.watchdog.state_store import StateStore

GPU_LOGS = Path(__file__).parent / "fixtures" / "gpu_logs"
RUNS = {r["name"]: r for r in json.loads((GPU_LOGS / "corpus.json").read_text())}
GiB = 2**30
# corpus.json's keys for each exported part
LOGGED = {"weights": "model_weights_gib", "activation_peak": "activation_peak_gib", "non_torch": "non_torch_gib",
          "cuda_graphs": "cudagraph_gib", "kv_cache": "available_kv_cache_gib"}


@pytest.mark.parametrize("name,gpu,parts", [
    # vLLM 0.10.1.1 (V1) on an A100 80GB at 0.5: weights, KV memory and CUDA graphs, each on its own line
    ("dl_qwen2_7b_a100_80g_u05", Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB),
     {"weights", "kv_cache", "cuda_graphs"}),
    # a 0.6.5 V0 worker on an H100 at 0.9: the profile one figure a line, no CUDA graph line
    ("pr10511_llama3_8b_h100_tp1", Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 81_559 * 2**20,
                                          cuda_total_bytes=int(79.22 * GiB)),   # the total this log states
     {"weights", "non_torch", "activation_peak", "kv_cache"}),
])
def test_the_exported_parts_are_the_logged_figures(tmp_path: Path, name: str, gpu: Device, parts: set[str]) -> None:
    run = RUNS[name]
    util = run["gpu_memory_utilization"]
    model = write_model(tmp_path / "model", llama_config())
    argv = fake(model, free_port(), "--startup-log", str(GPU_LOGS / run["log_file"]),
                "--gpu-memory-utilization", str(util))
    cfg = config(tmp_path, argv, FAST)
    rec = Recorder()
    running = Running(supervisor(cfg, rec, device=gpu))
    try:
        running.wait_state(EngineState.READY)
        assert eventually(lambda: set(rec.last.log_memory_parts) == parts, 10, 0.05), rec.last
        status = running.sup.status
        watch = Watch(SupervisedEngines(lambda: [status]))
        watch.tick()
        found = samples(render(watch))
    finally:
        running.stop()
    exported = {s["part"]: value(found, "kvwatch_engine_memory_bytes", **s)
                for s in series(found, "kvwatch_engine_memory_bytes")}
    assert {s["engine"] for s in series(found, "kvwatch_engine_memory_bytes")} == {"t"}
    assert {part: round(got / GiB, 4) for part, got in exported.items()} == \
        {part: run["logged"][LOGGED[part]] for part in parts}
    # The budget vLLM sized against: the CUDA total (below NVML's: 79.15 GiB on an A100 80GB) x the utilization.
    requested = value(found, "kvwatch_engine_memory_requested_bytes", engine="t")
    assert requested == int(cuda_total_bytes(gpu) * util)
    if name.startswith("pr10511"):   # its V0 log states total_gpu_memory 79.22GiB: x 0.90 = 71.30 GiB
        assert round(requested / GiB, 2) == 71.30
    # Kept in the state file, as the engine said it.
    record = StateStore(cfg.state_dir, cfg.name).load()
    assert record is not None and record.log_memory_parts == status.log_memory_parts
