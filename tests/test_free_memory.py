"""The GPU's free memory at start (`--gpu-free-memory`, kvwatch/planner/free_memory.py): the budget with
and without it, release by release, and the option's errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import CARDS, PLATFORMS, Device, GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.extensible_kv import CUDA_CONTEXT_BYTES
from kvwatch.planner.free_memory import snapshot_free_bytes, with_free_memory
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

QWEN_DIR = Path(__file__).resolve().parent.parent / "examples" / "qwen2-7b"
QWEN = json.loads((QWEN_DIR / "config.json").read_text())
CARD = preset("rtx-4090")                      # CUDA total 23.64 GiB (devices.CARDS)
UTIL_09 = ("--gpu-memory-utilization", "0.9")  # 21.28 GiB of 23.64


def _plan(version: str, free_gib: float | None, flags: tuple[str, ...] = UTIL_09,
          env: tuple[tuple[str, str], ...] = ()) -> Plan:
    device = CARD if free_gib is None else with_free_memory(CARD, int(free_gib * GiB))
    settings = EngineCommand.parse(["vllm", "serve", "/m", *flags]).settings()
    return make_plan(geometry_from_config(QWEN), settings, device, ruleset_for(version),
                     MemoryInputs(vllm_version=parse_version(version), vllm_env=env))


def _busy(plan: Plan) -> list[dict]:
    return [w.to_json() for w in plan.warnings if w.kind.value == "gpu_memory_busy"]


# (release, environment, extra flags, stated free GiB, the fix vLLM's refusal takes or None, the KV
# memory's change against the same plan without a stated free memory, in GiB)
CASES = [
    # V1 from 0.9: the worker refuses a budget above its free memory (0.28.0 v1/worker/utils.py:453)
    ("0.28.0", (), (), 23.0, None, 0.0),            # 22.50 GiB free at the snapshot >= 21.28: starts
    ("0.28.0", (), (), 20.0, 0.82, 0.0),            # 19.50 < 21.28: refused; 0.82 x 23.64 = 19.38 fits
    ("0.28.0", (), ("--gpu-memory-utilization", "0.8"), 20.0, None, 0.0),   # 18.91 GiB fits in 19.50
    ("0.9.2", (), (), 20.0, 0.82, 0.0),
    ("0.9.1", (), (), 20.0, 0.82, 0.0),             # the first release with the check (gpu_worker.py:135-150)
    # V1 before 0.9.1: no check; another process's memory is the profile's non-torch memory
    ("0.9.0", (), (), 20.0, None, -(23.64 - 20.0)),  # 0.9.0's worker still charges it (gpu_worker.py:184-212)
    ("0.8.5", (), (), 20.0, None, -(23.64 - 20.0)),
    # V0: the baseline snapshot leaves it out, and nothing refuses: the budget is unchanged
    ("0.8.5", (("VLLM_USE_V1", "0"),), (), 20.0, None, 0.0),
    # 0.34 with the extensible KV cache: no refusal (utils.py:785), sized from the free memory
    ("0.34.0", (), (), 20.0, None, None),
    ("0.34.0", (), ("--no-enable-extensible-kv-cache",), 20.0, 0.82, 0.0),
]


@pytest.mark.parametrize("version,env,flags,free,fix,kv_change", CASES)
def test_the_budget_with_and_without_a_stated_free_memory(version, env, flags, free, fix, kv_change) -> None:
    without = _plan(version, None, UTIL_09 + flags, env)
    stated = _plan(version, free, UTIL_09 + flags, env)
    assert not _busy(without)
    busy = _busy(stated)
    if fix is None:
        assert not busy and not stated.will_fail
    else:
        assert [b["fix"] for b in busy] == [{"--gpu-memory-utilization": fix}] and stated.will_fail
        assert busy[0]["message"].startswith("Free memory on device (19.50/23.64 GiB) on startup is less than")
        assert fix * 23.64 <= free - CUDA_CONTEXT_BYTES / GiB < (fix + 0.01) * 23.64
    assert stated.gpu_budget is not None and without.gpu_budget is not None
    assert stated.gpu_budget.requested_bytes == without.gpu_budget.requested_bytes   # the budget is total x util
    assert stated.gpu_budget.stated_free_bytes == int(free * GiB) and without.gpu_budget.stated_free_bytes is None
    change = (stated.kv_memory_bytes - without.kv_memory_bytes) / GiB
    if kv_change is None:   # extensible: what the snapshot finds free, less the resident and transient memory
        budget = stated.gpu_budget
        assert budget.free_at_start_bytes == int(free * GiB) - CUDA_CONTEXT_BYTES
        assert stated.kv_memory_bytes < without.kv_memory_bytes
        assert stated.kv_memory_bytes <= budget.free_at_start_bytes - budget.resident_bytes - budget.transient_bytes
    else:
        assert change == pytest.approx(kv_change, abs=0.01)


def test_a_stated_free_memory_above_the_cuda_total_is_a_clean_card() -> None:
    """nvidia-smi's free on a clean card can exceed the CUDA total (NVML's framebuffer is larger)."""
    clean = with_free_memory(CARD, int(23.9 * GiB))
    assert snapshot_free_bytes(clean) == snapshot_free_bytes(CARD)
    assert _plan("0.8.5", 23.9).kv_memory_bytes == _plan("0.8.5", None).kv_memory_bytes


@pytest.mark.parametrize("device,free,needle", [
    (CARD, 0, "must be more than 0"),
    (CARD, -GiB, "must be more than 0"),
    (CARD, 30 * GiB, "is more than NVIDIA GeForce RTX 4090's 23.99 GiB in all"),
    (preset("gb10"), 122 * GiB, "is more than NVIDIA GB10's 121.69 GiB in all"),
    (Device("cpu", "cpu"), GiB, "is for a GPU plan"),
])
def test_a_free_memory_that_cannot_be_is_one_clear_error(device, free, needle) -> None:
    with pytest.raises(KvwatchError, match=needle):
        with_free_memory(device, free)


def test_cli_plans_with_the_stated_free_memory(capsys) -> None:
    base = ["plan", "--preset", "rtx-4090", "--vllm-version", "0.28.0"]
    serve = ["--", "vllm", "serve", str(QWEN_DIR), "--gpu-memory-utilization", "0.9"]
    assert main([*base, *serve]) == 0
    assert "free at start" not in capsys.readouterr().out
    assert main([*base, "--gpu-free-memory", "23GiB", *serve]) == 0
    assert "free at start    23.00 GiB stated (--gpu-free-memory)" in capsys.readouterr().out
    assert main([*base, "--gpu-free-memory", "20GiB", *serve]) == 3
    out = capsys.readouterr().out
    assert "FAILS: [gpu_memory_busy] Free memory on device (19.50/23.64 GiB)" in out
    assert "fix: --gpu-memory-utilization 0.82" in out
    assert main([*base, "--gpu-free-memory", "20GiB", "--json", *serve]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["gpu_budget"]["stated_free_bytes"] == 20 * GiB
    assert data["warnings"][0]["fix"] == {"--gpu-memory-utilization": 0.82}


@pytest.mark.parametrize("value,needle", [
    ("lots", "'lots' is not a size"),
    ("0", "--gpu-free-memory must be more than 0"),
    ("30GiB", "--gpu-free-memory 30.00 GiB is more than"),
])
def test_cli_bad_free_memory_is_one_line_exit_2(value, needle, capsys) -> None:
    rc = main(["plan", "--preset", "rtx-4090", "--gpu-free-memory", value, "--", "vllm", "serve", str(QWEN_DIR)])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_free_memory_needs_a_gpu(capsys) -> None:
    assert main(["plan", "--device", "cpu", "--gpu-free-memory", "8GiB", "--", "vllm", "serve", str(QWEN_DIR)]) == 2
    assert "--gpu-free-memory is for a GPU plan" in capsys.readouterr().err


def _preset_plan(name: str, version: str, util: str, free_gib: float | None = None) -> Plan:
    device = preset(name) if free_gib is None else with_free_memory(preset(name), int(free_gib * GiB))
    settings = EngineCommand.parse(["vllm", "serve", "/m", "--gpu-memory-utilization", util]).settings()
    return make_plan(geometry_from_config(QWEN), settings, device, ruleset_for(version),
                     MemoryInputs(vllm_version=parse_version(version)))


@pytest.mark.parametrize("name,version,util,fix", [
    # GB10: a headless DGX OS box's snapshot, 114.54/121.69 GiB (devices.CARDS: its source)
    ("gb10", "0.27.1", "0.9", None),         # 109.52 GiB requested
    ("gb10", "0.27.1", "0.95", 0.94),        # 115.61 > 114.54; 0.94 x 121.69 = 114.39 fits
    # WSL2: 22.45/23.99 GiB at the snapshot; the two logged runs started at 0.92 and 0.85
    ("rtx-4090-wsl2", "0.27.1", "0.92", None),
    ("rtx-4090-wsl2", "0.27.1", "0.85", None),
    ("rtx-4090-wsl2", "0.27.1", "0.95", 0.93),
    # RTX 5090 under WSL2 on a desktop: 30.12/31.84 GiB; refused at 0.95 (30.25 GiB requested) three times,
    # started at 0.93 and 0.92 (devices.PLATFORMS: its source); the fix is the utilization 30.12 GiB covers
    ("rtx-5090-wsl2", "0.28.0", "0.95", 0.94),
    ("rtx-5090-wsl2", "0.28.0", "0.93", None),
    ("rtx-5090-wsl2", "0.28.0", "0.92", None),
])
def test_a_platform_preset_carries_what_it_leaves_free(name, version, util, fix) -> None:
    plan = _preset_plan(name, version, util)
    assert [b["fix"] for b in _busy(plan)] == ([] if fix is None else [{"--gpu-memory-utilization": fix}])


def test_the_platform_presets_state_their_logged_snapshot() -> None:
    gb10, wsl2 = preset("gb10"), preset("rtx-4090-wsl2")
    assert snapshot_free_bytes(gb10) == int(114.54 * GiB)
    assert snapshot_free_bytes(wsl2) == int(22.45 * GiB)
    assert wsl2.name == preset("rtx-4090").name and wsl2.cuda_total_bytes == int(23.99 * GiB)
    assert preset("rtx-4090").free_memory_bytes is None   # a card alone: free memory unknown, none assumed
    desktop = preset("rtx-5090-wsl2")
    assert snapshot_free_bytes(desktop) == int(30.12 * GiB) and desktop.cuda_total_bytes == int(31.84 * GiB)
    assert desktop.name == preset("rtx-5090").name and desktop.compute_capability == (12, 0)
    assert all(p.source and p.card in {c.key for c in CARDS} for p in PLATFORMS)
    # a stated figure replaces the preset's
    assert not _busy(_preset_plan("rtx-4090-wsl2", "0.27.1", "0.95", free_gib=23.5))
