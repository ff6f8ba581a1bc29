"""The CPU's MLA backend follows the host (issue 39): AMX_MLA on AMX hosts from 0.29, CPU_MLA elsewhere.

The oracle is each release's own `CpuPlatform.get_attn_backend_cls`: scripts/oracle_cpu_mla.py runs
its source from the unpacked release (KVWATCH_VLLM_SRC=<root>/<version>/vllm/...) with the host's AMX
answer passed in, and the installed vLLM's imported function the same way (`--installed`), which also
runs CPU_MLA's decode kernel on latents of other widths. The answers are recorded in
tests/fixtures/cpu_mla_oracle.json for machines without them; where the sources or the recorded vLLM are
here, the oracle runs again and must give them. No test reads this machine's CPU flags: every case
passes them in. Record anew with `KVWATCH_VLLM_SRC=... python tests/test_cpu_mla.py`.
"""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_support import deepseek_v2_config
from vllm_sources import release_tree

from kvwatch.planner.cpu_mla import AMX_MLA, CPU_MLA, CPU_MLA_KERNEL_REFUSAL, DECLARED_HEAD_SIZES, cpu_mla_backend
from kvwatch.planner.devices import Device, cpu_device_from_flags
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.predicted_refusal import NO_ATTENTION_BACKEND
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.kv_layout import MLA_NOT_SUPPORTED_ON_CPU

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "cpu_mla_oracle.json"
ORACLE = ROOT / "scripts" / "oracle_cpu_mla.py"
RELEASES = ("0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
HEADS = (576, 288)   # DeepSeek's latent (512 + 64) and MiniCPM3's (256 + 32)
CASES: dict[str, dict[str, Any]] = {
    f"amx={amx} head={head} requested={requested}": {"amx": amx, "head_size": head, "requested": requested}
    for amx, head, requested in itertools.product((True, False), HEADS, (None, CPU_MLA, "FLASH_ATTN"))}
AMX_FLAGS = {"fpu", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}
NO_AMX_FLAGS = {"fpu", "avx512f", "avx512_bf16"}
GiB = 1 << 30


def _recorded() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())  # type: ignore[no-any-return]


def _oracle(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(ORACLE), *args], input=json.dumps(list(CASES.values())),
                         capture_output=True, text=True, timeout=600, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    return {**answer, "answers": dict(zip(CASES, answer["answers"], strict=True))}


def _record() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for release in RELEASES:
        tree = release_tree(release)
        if tree is None:
            raise SystemExit(f"vLLM {release} is not unpacked: set KVWATCH_VLLM_SRC")
        out[release] = _oracle(str(tree))
    out["installed"] = _oracle("--installed")
    return out


def _mla(head: int) -> dict[str, Any]:
    config = deepseek_v2_config()
    if head == 288:
        config.update(kv_lora_rank=256, qk_rope_head_dim=32)
    return config


def _plan(head: int, device: Device, release: str, *flags: str) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    return make_plan(geometry_from_config(_mla(head), release), settings, device, ruleset_for(release),
                     MemoryInputs(vllm_version=parse_version(release), cpu_kv_space_bytes=GiB))


@pytest.mark.parametrize("release", RELEASES)
def test_kvwatch_picks_the_backend_each_release_picks(release: str) -> None:
    for name, case in CASES.items():
        answer = _recorded()[release]["answers"][name]
        picked = cpu_mla_backend(parse_version(release), case["amx"], case["requested"])
        expected = None if answer == f"error: NotImplementedError: {MLA_NOT_SUPPORTED_ON_CPU}" else answer
        assert picked == expected, name


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_declares_the_576_latent_only(release: str) -> None:
    declared = _recorded()[release]["head_sizes"]
    assert {name: frozenset(sizes) for name, sizes in declared.items()} == {
        name: DECLARED_HEAD_SIZES for name in ((CPU_MLA, AMX_MLA) if cpu_mla_backend(
            parse_version(release), True, None) == AMX_MLA else (CPU_MLA,) if cpu_mla_backend(
            parse_version(release), False, None) else ())}


def test_cpu_mla_kernel_refuses_every_other_latent() -> None:
    kernel = _recorded()["installed"]["cpu_mla_kernel"]
    assert kernel["576"] == "ok"
    assert {width: result for width, result in kernel.items() if width != "576"} == {
        "288": CPU_MLA_KERNEL_REFUSAL, "320": CPU_MLA_KERNEL_REFUSAL}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("amx", (True, False))
@pytest.mark.parametrize("head", HEADS)
def test_the_plan_refuses_only_where_the_picked_backend_does(release: str, amx: bool, head: int) -> None:
    """CPU_MLA's head-size refusal stands where the release picks CPU_MLA; on an AMX host from 0.29 the
    plan runs AMX_MLA, forces no 16-token block, and states the undeclared latent as a risk only."""
    device = cpu_device_from_flags(AMX_FLAGS if amx else NO_AMX_FLAGS)
    plan = _plan(head, device, release)
    picked = cpu_mla_backend(parse_version(release), amx, None)
    certain = [w for w in plan.warnings if w.certain]
    if picked is None:
        assert any(MLA_NOT_SUPPORTED_ON_CPU in w.message for w in certain)
    elif picked == CPU_MLA:
        refused = [w for w in certain if w.kind == NO_ATTENTION_BACKEND and "head_size not supported" in w.message]
        assert bool(refused) == (head not in DECLARED_HEAD_SIZES)
        assert plan.block_size == 16
    else:
        assert plan.backend == AMX_MLA and plan.block_size == 128
        assert not any(w.kind == NO_ATTENTION_BACKEND for w in certain)
        risks = [w for w in plan.warnings if not w.certain and AMX_MLA in w.message]
        assert bool(risks) == (head not in DECLARED_HEAD_SIZES)


def test_an_amx_host_asked_for_cpu_mla_runs_it() -> None:
    """--attention-backend CPU_MLA overrides AMX (platforms/cpu.py:156 in 0.32), with its 16-token blocks."""
    plan = _plan(288, cpu_device_from_flags(AMX_FLAGS), "0.32.0", "--attention-backend", "CPU_MLA")
    assert plan.block_size == 16 and plan.will_fail


@pytest.mark.parametrize("release", RELEASES)
def test_the_release_oracle_gives_the_recorded_answers(release: str) -> None:
    tree = release_tree(release)
    if tree is None:
        pytest.skip(f"vLLM {release} is not unpacked (set KVWATCH_VLLM_SRC to <root>/<version>/vllm/...)")
    assert _oracle(str(tree)) == _recorded()[release]


def test_the_installed_oracle_gives_the_recorded_answers() -> None:
    """The installed vLLM's own imported selection function and CPU_MLA kernel, where they import."""
    probe = subprocess.run([sys.executable, "-c", "import vllm.platforms.cpu, vllm; print(vllm.__version__)"],
                           capture_output=True, text=True, timeout=600)
    recorded = _recorded()["installed"]
    if probe.returncode or probe.stdout.split()[-1:] != [recorded["vllm"]]:
        pytest.skip(f"vLLM {recorded['vllm']}'s CPU platform does not import here")
    assert _oracle("--installed") == recorded


def test_the_installed_release_agrees_with_its_unpacked_source() -> None:
    recorded = _recorded()
    installed = recorded["installed"]
    assert installed["answers"] == recorded[installed["vllm"]]["answers"]
    assert installed["head_sizes"] == recorded[installed["vllm"]]["head_sizes"]


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(_record(), indent=1) + "\n")
    print(f"recorded {FIXTURE}")
