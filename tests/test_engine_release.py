"""The engine's release under `kvwatch run`: an upgrade between launches (vllm_releases/upgrade.py),
and vLLM's own persisted start-up plan (vllm_releases/startup_plan.py, boundary/startup_plan_file.py)."""
from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import free_port, write_model
from exporter_support import render
from nvml_standin import NvmlStandin
from test_supervisor import ROOT, Running, config, fake, state_json, supervisor
from waiting import eventually

from kvwatch.boundary.startup_plan_file import read_persisted_plan
from kvwatch.diagnosis.startup_lines import parse_facts
from kvwatch.engine_status import EngineState, EngineStatus
from kvwatch.exitcodes import EXIT_OK
from kvwatch.exporter.snapshot import EngineSnapshot, WatchSnapshot
from kvwatch.planner.devices import Device
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import KNOWN
from kvwatch.vllm_releases.release_defaults import defaults_for
from kvwatch.vllm_releases.startup_plan import (
    PersistedPlan,
    parse_plan_file,
    parse_plan_line,
    pin_decision,
    plan_enabled,
)
from kvwatch.vllm_releases.upgrade import planned_as, release_change
from kvwatch.watchdog.state_store import EngineRecord, StateStore

GIB = 2**30
QWEN_LOG = ROOT / "tests" / "fixtures" / "gpu_logs" / "dl_qwen2_7b_a100_80g_u05.log"


# -- release changes (pure) -------------------------------------------------------------------

@pytest.mark.parametrize("recorded, current", [(None, "0.32.0"), ("0.32.0", None), ("0.32.0", "0.32.0"),
                                               ("0.32.0", "0.32.0+cu130"), ("banana", "0.32.0")])
def test_no_release_change(recorded: str | None, current: str | None) -> None:
    assert release_change(recorded, current, 100, GIB) is None


def test_an_upgrade_names_what_changed_with_its_source_and_the_last_measure() -> None:
    change = release_change("0.19.1", "0.20.2", 464_848, int(24.83 * GIB))
    assert change is not None and (change.before, change.after) == ("0.19.1", "0.20.2")
    assert "default --gpu-memory-utilization 0.9 -> 0.92 (vLLM 0.20.2, vllm/config/cache.py:66)" in change.message
    assert "CUDA graph estimate in the KV budget opt-in -> default (vLLM 0.20.2, vllm/envs.py:1737)" in change.message
    assert "464,848 KV tokens, 24.83 GiB of KV cache" in change.message


def test_a_patch_upgrade_that_changes_nothing_tracked_says_so() -> None:
    change = release_change("0.32.0", "0.33.0", None, None)
    assert change is not None and "batch-default tiers by card" in change.message   # 0.33: GB10 on the small tier
    change = release_change("0.30.0", "0.31.0", None, None)
    assert change is not None and "no default or budget switch kvwatch tracks changed" in change.message


def test_the_new_releases_capacity_against_the_last() -> None:
    change = release_change("0.19.1", "0.20.2", 1_000_000, 50 * GIB)
    assert change is not None
    assert change.capacity_message(1_020_000, None) == "vLLM 0.19.1 -> 0.20.2: KV tokens 1,000,000 -> 1,020,000 (+2.0%)"
    assert "KV bytes 53,687,091,200 -> 52,613,349,376 (-2.0%)" in (change.capacity_message(1, 49 * GIB) or "")
    assert release_change("0.19.1", "0.20.2", None, None).capacity_message(5, 5) is None   # type: ignore[union-attr]


def test_planned_as_the_nearest_known_release() -> None:
    assert planned_as("0.40.1") == str(max(KNOWN)) and planned_as("0.32.0") == "0.32.0" and planned_as(None) is None


# -- vLLM's start-up plan (pure) --------------------------------------------------------------

PLAN = {"schema": 1, "fingerprint": "0123456789abcdef", "kv_cache_memory_bytes": 26_660_000_000,
        "free_memory_baseline": 84_000_000_000}


@pytest.mark.parametrize("change", [{"schema": 2}, {"kv_cache_memory_bytes": 0}, {"kv_cache_memory_bytes": "1"},
                                    {"kv_cache_memory_bytes": True}, {"free_memory_baseline": None},
                                    {"fingerprint": 7}])
def test_plan_files_vllm_would_ignore(change: dict) -> None:
    with pytest.raises(ValueError):
        parse_plan_file(json.dumps({**PLAN, **change}).encode())


def test_a_plan_file_as_vllm_writes_it() -> None:
    assert parse_plan_file(json.dumps(PLAN).encode()) == PersistedPlan("0123456789abcdef", 26_660_000_000,
                                                                       84_000_000_000)
    with pytest.raises(ValueError):
        parse_plan_file(b"{" * 5000)


APPLIED = ("(EngineCore pid=1) INFO 12-01 09:00:00 [startup_plan.py:153] Applying persisted startup plan "
           "(fingerprint 0123456789abcdef): kv_cache_memory_bytes=26660000000 (24.83 GiB), recorded free-memory "
           "baseline 78.23 GiB, current 78.30 GiB. Memory profiling will be skipped.")
SAVED = ("(EngineCore pid=1) INFO 12-01 09:00:00 [startup_plan.py:189] Saved startup plan to "
         "/root/.cache/vllm/startup_plan/startup_plan_0123456789abcdef.json")


def test_plan_lines_as_vllm_prints_them() -> None:
    applied = parse_plan_line(APPLIED)
    assert applied is not None and (applied.applied_kv_bytes, applied.fingerprint) == (26_660_000_000,
                                                                                        "0123456789abcdef")
    saved = parse_plan_line(SAVED)
    assert saved is not None and saved.saved_path == "/root/.cache/vllm/startup_plan/startup_plan_0123456789abcdef.json"
    assert parse_plan_line("Startup plan not applied: current free memory (1.00 GiB) is below ...") is None


def test_an_engine_that_skipped_its_profile() -> None:
    """No "Available KV cache memory" line: the KV cache is the plan's value."""
    lines = [line for line in QWEN_LOG.read_text().splitlines() if "Available KV cache memory" not in line]
    facts = parse_facts([*lines[:8], APPLIED, *lines[8:]])
    assert facts.available_kv_bytes is None and facts.kv_cache_bytes == 26_660_000_000
    assert facts.memory_parts()["kv_cache"] == 26_660_000_000 and facts.started


@pytest.mark.parametrize("release, value, enabled", [
    ("0.25.1", "1", False), ("0.26.0", "1", True), ("0.32.0", "1", True), ("0.32.0", "0", False),
    ("0.32.0", None, False), ("0.32.0", "yes", False), ("0.33.0", " 2 ", True)])
def test_plan_enabled_by_release_and_switch(release: str, value: str | None, enabled: bool) -> None:
    assert plan_enabled(defaults_for(parse_version(release)), value) is enabled


def test_never_pins_over_vllms_own_plan() -> None:
    assert pin_decision(False, 10, None).pin
    no_plan_yet = pin_decision(True, 10, None)
    assert not no_plan_yet.pin and "does not pin" in no_plan_yet.reason
    disagree = pin_decision(True, 26_000_000_000, PersistedPlan("ab", 26_660_000_000, 1))
    assert not disagree.pin and "differs by -660,000,000 B" in disagree.reason


def test_read_persisted_plan(tmp_path: Path) -> None:
    path = tmp_path / "startup_plan_0123456789abcdef.json"
    path.write_text(json.dumps(PLAN))
    assert read_persisted_plan(str(path)) == parse_plan_file(path.read_bytes())
    link = tmp_path / "link.json"
    link.symlink_to(path)
    assert read_persisted_plan(str(link)) is None            # never through a symlink
    os.mkfifo(tmp_path / "fifo")
    assert read_persisted_plan(str(tmp_path / "fifo")) is None   # never blocks on a FIFO
    assert read_persisted_plan(str(tmp_path / "none.json")) is None and read_persisted_plan(None) is None
    path.write_text("{}")
    assert read_persisted_plan(str(path)) is None


# -- under kvwatch run ------------------------------------------------------------------------

def test_an_upgrade_between_launches_is_logged_and_exported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    model = write_model(tmp_path / "tiny", {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                             "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                                             "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 256,
                                             "max_position_embeddings": 2048, "torch_dtype": "bfloat16"})
    cfg = config(tmp_path, fake(model, free_port()))
    store = StateStore(cfg.state_dir, cfg.name)
    store.ensure_dir()
    store.save(EngineRecord(name="t", original_argv=list(cfg.engine.command), argv=list(cfg.engine.command),
                            vllm_release="0.19.1", log_kv_tokens=464_848))
    monkeypatch.setattr("kvwatch.watchdog.os_interface.RealOs.installed_vllm_text", lambda self: "0.20.2")
    caplog.set_level(logging.WARNING, logger="kvwatch.watchdog.supervisor")
    run = Running(supervisor(cfg))
    run.wait_state(EngineState.READY)
    status = run.sup.status
    assert run.stop() == EXIT_OK
    assert any("vLLM release changed 0.19.1 -> 0.20.2" in r.getMessage() and "464,848 KV tokens" in r.getMessage()
               for r in caplog.records)
    assert eventually(lambda: any("vLLM 0.19.1 -> 0.20.2: KV tokens 464,848 -> " in r.getMessage()
                                  for r in caplog.records), 5)
    assert state_json(cfg)["vllm_release"] == "0.20.2"
    assert (status.vllm_release, status.vllm_release_planned_as, status.release_changes) == ("0.20.2", "0.20.2", 1)
    text = render(WatchSnapshot(taken_at=0.0, engines=(EngineSnapshot(status, up=True),)))
    assert 'kvwatch_engine_release_info{engine="t",planned_as="0.20.2",version="0.20.2"} 1.0' in text
    assert 'kvwatch_engine_release_changes_total{engine="t"} 1.0' in text


def test_no_release_metric_without_a_release() -> None:
    text = render(WatchSnapshot(taken_at=0.0, engines=(EngineSnapshot(EngineStatus("e", EngineState.READY), up=True),)))
    assert "kvwatch_engine_release_info{" not in text and "kvwatch_engine_release_changes_total{" not in text


def test_an_engine_on_its_own_startup_plan_is_learned_and_never_pinned_over(
        tmp_path: Path, nvml_standin: NvmlStandin) -> None:
    """VLLM_ENABLE_STARTUP_PLAN=1: the launch that saved a plan teaches kvwatch where it is; the next
    launch, pinned by kvwatch's policy, is left to vLLM's plan; a boot that applied the plan (no
    profile lines) is learned from the plan's value."""
    from nvml_standin import StandinGpu, StandinState

    run_entry = next(r for r in json.loads((ROOT / "tests/fixtures/gpu_logs/corpus.json").read_text())
                     if r["name"] == "dl_qwen2_7b_a100_80g_u05")
    qwen = write_model(tmp_path / "qwen2-7b", {k: v for k, v in run_entry["model_config"].items() if v is not None})
    uuid = "GPU-0f1e2d3c-aaaa-4bbb-8ccc-000000000002"
    gpu = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GIB, uuid=uuid, source="nvml")
    nvml_standin.write(StandinState(gpus=[StandinGpu(uuid=uuid, name=gpu.name, memory_total_bytes=80 * GIB,
                                                     memory_used_bytes=0, compute_capability=(8, 0), processes=[])]))
    plan_file = tmp_path / "cache" / "startup_plan" / "startup_plan_0123456789abcdef.json"
    plan_file.parent.mkdir(parents=True)
    plan_file.write_text(json.dumps(PLAN))
    lines = QWEN_LOG.read_text().splitlines()
    saving = tmp_path / "saving.log"
    saving.write_text("\n".join([*lines[:9], SAVED.replace("/root/.cache/vllm/startup_plan/startup_plan_0123456789abcdef.json",
                                                            str(plan_file)), *lines[9:]]) + "\n")
    applying = tmp_path / "applying.log"
    applying.write_text("\n".join([*lines[:8], APPLIED, *[x for x in lines[8:] if "Available KV cache" not in x]]) + "\n")
    flags = ("--max-model-len", "16384", "--gpu-memory-utilization", "0.5")

    cfg = config(tmp_path, fake(qwen, free_port(), "--startup-log", str(saving), *flags))
    cfg = replace(cfg, engine=replace(cfg.engine, environment={"VLLM_ENABLE_STARTUP_PLAN": "1"}))
    run = Running(supervisor(cfg, device=gpu))
    run.wait_state(EngineState.READY)
    assert run.stop() == EXIT_OK
    assert state_json(cfg)["vllm_startup_plan"] == str(plan_file)

    pinned_cfg = replace(cfg, engine=replace(cfg.engine, pin_kv_cache_memory=True))
    out = io.BytesIO()
    run = Running(supervisor(pinned_cfg, device=gpu, output=out))
    run.wait_state(EngineState.READY)
    assert run.stop() == EXIT_OK
    (started,) = [x for x in out.getvalue().decode().splitlines() if "fake engine starting" in x]
    assert "--kv-cache-memory-bytes" not in started            # vLLM's own plan, not kvwatch's pin

    argv = fake(qwen, free_port(), "--startup-log", str(applying), *flags)
    cfg3 = replace(cfg, engine=replace(cfg.engine, command=tuple(argv)))
    run = Running(supervisor(cfg3, device=gpu))
    run.wait_state(EngineState.READY)
    assert eventually(lambda: run.sup.status.plan is not None and run.sup.status.plan.source == "learned", 10)
    status = run.sup.status
    assert run.stop() == EXIT_OK
    assert status.log_memory_parts["kv_cache"] == PLAN["kv_cache_memory_bytes"]
    assert status.plan is not None and status.plan.source == "learned"
    assert status.plan.kv_memory_bytes == PLAN["kv_cache_memory_bytes"]


def test_a_schema_2_plan_is_read_for_the_release_that_writes_it(tmp_path) -> None:
    """0.34 writes schema 2 (vLLM 0.34.0, vllm/v1/worker/startup_plan.py:39), the same fields."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, "schema": 2}))
    schema = defaults_for(parse_version("0.34.0")).startup_plan_schema
    assert schema == 2
    plan = read_persisted_plan(str(path), schema)
    assert plan is not None and plan.kv_cache_memory_bytes == PLAN["kv_cache_memory_bytes"]
    assert read_persisted_plan(str(path)) is None   # a schema-1 reader ignores it, as 0.33 would
