"""What the engine's memory profile teaches (kvwatch/watchdog/memory_learning.py), and the plan in
force computed in one place from a config.json read once per launch (plan_in_force.py)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import llama_config, write_model
from exporter_support import fixture_plan

from kvwatch.boundary.model_source import ModelSource, load_model_source
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.rules import ruleset_for
from kvwatch.watchdog.memory_learning import MAX_LEARNED_PROFILES, pin_for, remember_non_kv
from kvwatch.watchdog.plan_in_force import PlanInForce

CPU = Device("cpu", "test cpu (no AVX-512)", cpu_fp8_kv=False, source="cpu")


def test_the_non_kv_memory_is_kept_per_profile_newest_last_and_bounded() -> None:
    learned: dict[str, int] = {}
    for i in range(MAX_LEARNED_PROFILES + 3):
        remember_non_kv(learned, f"p{i}", requested=100, available_kv_bytes=60)
    assert len(learned) == MAX_LEARNED_PROFILES and "p0" not in learned and learned["p34"] == 40
    remember_non_kv(learned, "p5", requested=100, available_kv_bytes=130)   # never below zero; moves last
    assert list(learned)[-1] == "p5" and learned["p5"] == 0


ALL_BUT_ONE_BLOCK = -1   # other processes hold all the learned KV cache but one block


@pytest.mark.parametrize("source,foreign,pinned_less", [
    ("estimated", 0, None),        # nothing learned: vLLM profiles the memory itself
    ("exact", 0, None),
    ("learned", 0, 0),
    ("learned", 10, 10),           # less what other processes hold on the GPU now
    ("learned", ALL_BUT_ONE_BLOCK, None),   # fewer than two blocks left: not pinned
])
def test_a_pin_is_what_the_learned_plan_gives_the_kv_cache_less_what_others_hold(
        source: str, foreign: int, pinned_less: int | None) -> None:
    plan = replace(fixture_plan("cpu_default"), estimated=source == "estimated",
                   kv_memory_source="learned non-KV" if source == "learned" else "VLLM_CPU_KVCACHE_SPACE")
    assert plan.source == source
    held = plan.kv_memory_bytes - plan.bytes_per_block if foreign == ALL_BUT_ONE_BLOCK else foreign
    pin = pin_for(plan, held)
    assert pin.kv_bytes == (None if pinned_less is None else plan.kv_memory_bytes - pinned_less)


def test_the_plan_in_force_reads_config_json_once_per_launch(tmp_path: Path) -> None:
    model = write_model(tmp_path / "tiny", llama_config())
    reads: list[str] = []

    def read(name: str) -> ModelSource:
        reads.append(name)
        return load_model_source(name)

    planner = PlanInForce(CPU, ruleset_for("0.32.0"), lambda: {"VLLM_CPU_KVCACHE_SPACE": "1"}, read_model=read)
    command = EngineCommand(("vllm", "serve", str(model), "--block-size", "32"))
    first = planner.compute(command)
    planner.compute(EngineCommand((*command.argv, "--kv-cache-memory-bytes", "1G")))   # the pin: same launch
    assert reads == [str(model)] and planner.plan is not None and planner.plan is not first
    planner.begin_launch()
    assert planner.compute(command) == first
    assert reads == [str(model)] * 2


@pytest.mark.parametrize("foreign,pinned", [(0, False), (10, True)])
def test_where_a_pin_turns_off_the_extensible_cache_it_pins_only_beside_other_processes(
        foreign: int, pinned: bool) -> None:
    """--kv-cache-memory-bytes turns 0.34's extensible KV cache off (vllm/config/vllm.py:3203-3207):
    on a GPU of its own the engine sizes its cache better after warm-up than a pin would."""
    plan = replace(fixture_plan("cpu_default"), estimated=False, kv_memory_source="learned non-KV")
    pin = pin_for(plan, foreign, extensible=True)
    assert (pin.kv_bytes is not None) is pinned
    assert "extensible KV cache" in pin.why


def test_the_pin_costs_the_extensible_cache_on_cuda_from_0_34() -> None:
    from kvwatch.values.versions import parse_version
    from kvwatch.watchdog.memory_learning import pin_costs_extensible
    settings = EngineCommand.parse(["vllm", "serve", "m"], "0.34.0").settings()
    assert pin_costs_extensible(settings, "cuda", parse_version("0.34.0"))
    assert not pin_costs_extensible(settings, "cpu", parse_version("0.34.0"))
    old = EngineCommand.parse(["vllm", "serve", "m"], "0.33.0").settings()
    assert not pin_costs_extensible(old, "cuda", parse_version("0.33.0"))
    off = EngineCommand.parse(["vllm", "serve", "m", "--no-enable-extensible-kv-cache"], "0.34.0").settings()
    assert not pin_costs_extensible(off, "cuda", parse_version("0.34.0"))


def test_beside_other_processes_the_unset_utilization_is_set_to_leave_them_room() -> None:
    """0.34's extensible cache takes all the memory free after warm-up when utilization is unset."""
    from kvwatch.planner.devices import preset
    from kvwatch.policy import Policy
    from kvwatch.watchdog.preflight import utilization_beside_others
    h100 = preset("h100")
    total = h100.total_memory_bytes
    unset = EngineCommand.parse(["vllm", "serve", "m"], "0.34.0")
    change = utilization_beside_others(unset, h100, 20 * 2**30, Policy())
    assert change is not None
    value = change.set["--gpu-memory-utilization"]
    assert value * total <= total - 20 * 2**30 - 2**30 and value > 0.7
    assert utilization_beside_others(unset, h100, 0, Policy()) is None                      # nobody else
    given = EngineCommand.parse(["vllm", "serve", "m", "--gpu-memory-utilization", "0.8"], "0.34.0")
    assert utilization_beside_others(given, h100, 20 * 2**30, Policy()) is None             # the user's choice
    old = EngineCommand.parse(["vllm", "serve", "m"], "0.33.0")
    assert utilization_beside_others(old, h100, 20 * 2**30, Policy()) is None               # 0.33 refuses itself
