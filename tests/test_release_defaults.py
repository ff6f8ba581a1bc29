"""vLLM's defaults by release (kvwatch/vllm_releases/defaults.py, generated from each release's
source) and the boundaries the memory budget takes from them, as tables."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.diagnosis import Diagnosis, FailureKind, GpuContext, propose_remedy
from kvwatch.planner.devices import PRESETS, Device, GiB
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import batch_defaults, release_for
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import KNOWN
from kvwatch.vllm_releases.defaults import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
KIMI = str(ROOT / "examples" / "kimi-k2")
A100 = Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 80 * GiB)
GB10 = Device("cuda", "NVIDIA GB10", (12, 1), 119 * GiB)   # DGX Spark: the memory, not the compute


def v(text: str):  # type: ignore[no-untyped-def]
    return parse_version(text)


def settings(*flags: str):  # type: ignore[no-untyped-def]
    return EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()


def test_one_entry_per_known_release_each_with_its_sources() -> None:
    assert sorted(DEFAULTS) == sorted(str(k) for k in KNOWN)
    for d in DEFAULTS.values():
        assert d.gpu_memory_utilization_source.startswith("vllm/config/cache.py:")
        assert all(t.source.startswith("vllm/engine/arg_utils.py:") for t in d.batch_tiers)
        last = d.batch_tiers[-1]
        assert last.min_memory_gib == 0 and not last.exclude_names, "the tiers end with the fallback"
        assert bool(d.cudagraph_estimate_source) == (d.cudagraph_estimate != "absent")


@pytest.mark.parametrize("release, utilization", [
    ("0.10.2", 0.9), ("0.19.1", 0.9), ("0.20.2", 0.92), ("0.21.0", 0.92), ("0.33.0", 0.92)])
def test_default_utilization_boundary_is_0_20(release: str, utilization: float) -> None:
    # vLLM 0.20.2, vllm/config/cache.py:66 (the table placed it at 0.21 from a PR date)
    assert release_for(v(release)).default_utilization == utilization


@pytest.mark.parametrize("release, env, counted", [
    ("0.17.1", {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1"}, False),   # no such switch before 0.18
    ("0.18.1", {}, False),                                                   # opt-in (envs.py default "0")
    ("0.18.1", {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "1"}, True),
    ("0.19.1", {}, False),
    ("0.20.2", {}, True),                                                    # on by default from 0.20
    ("0.20.2", {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}, False),
    ("0.32.0", {}, True),
])
def test_cuda_graph_accounting_by_release(release: str, env: dict[str, str], counted: bool) -> None:
    assert release_for(v(release), env).cuda_graphs_counted is counted


@pytest.mark.parametrize("device, release, expected", [
    (PRESETS["b200"], "0.27.1", (8192, 1024)),     # the >= 160 GiB tier is not in 0.27
    (PRESETS["b200"], "0.28.0", (16384, 1024)),    # vLLM 0.28.0, vllm/engine/arg_utils.py:2582
    (PRESETS["h100"], "0.10.2", (8192, 1024)),
    (PRESETS["h100"], "0.32.0", (8192, 1024)),
    (A100, "0.32.0", (2048, 256)),                 # A100s keep the small defaults (#17885)
    # a unified-memory card: NVML's memory info raises, get_batch_defaults takes 0 (vLLM 0.32.0,
    # vllm/engine/arg_utils.py:2915) and the small tier
    (GB10, "0.32.0", (2048, 256)),
    (GB10, "0.33.0", (2048, 256)),                 # 0.33 keeps capability 12.1 on the small tier
    (PRESETS["rtx-5090"], "0.33.0", (2048, 256)),
])
def test_batch_defaults_by_card_and_release(device: Device, release: str, expected: tuple[int, int]) -> None:
    assert batch_defaults(settings(), device, release_for(v(release)), 8192) == expected


def test_cpu_batch_defaults_scale_with_the_ranks() -> None:
    cpu = Device("cpu", "cpu")
    assert batch_defaults(settings("-tp", "2"), cpu, release_for(v("0.32.0")), 4096) == (4096, 256)


def test_the_plan_takes_the_batch_defaults_of_its_release() -> None:
    argv = ["vllm", "serve", KIMI, "-tp", "8"]
    old = plan_command(argv, PRESETS["b200"], ruleset_for("0.27.1"), env={}, vllm_version=v("0.27.1"))
    new = plan_command(argv, PRESETS["b200"], ruleset_for("0.28.0"), env={}, vllm_version=v("0.28.0"))
    assert old.gpu_budget is not None and new.gpu_budget is not None
    assert old.gpu_budget.max_num_batched_tokens == 8192 and new.gpu_budget.max_num_batched_tokens == 16384


def test_the_sampler_remedy_halves_the_plans_default() -> None:
    """An A100 80GB keeps 256 sequences (its name excludes it from the large tier): the remedy
    halves the plan's 256, not the 1024 a bare memory threshold would give."""
    d = Diagnosis(FailureKind.CUDA_OOM, None, {"phase": "sampler_warmup"}, False)
    argv = ["vllm", "serve", KIMI]
    plan = plan_command(argv, A100, ruleset_for("0.32.0"), env={}, vllm_version=v("0.32.0"))
    gpu = GpuContext(free_bytes=79 * GiB, total_bytes=80 * GiB)
    assert propose_remedy(d, EngineCommand.parse(argv), gpu=gpu, plan=plan).change.set == {"--max-num-seqs": 128}


def _int_literals(path: Path) -> set[int]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, int) and not isinstance(n.value, bool)}


@pytest.mark.parametrize("module", ["kvwatch/planner/plan.py", "kvwatch/planner/gpu_budget.py",
                                    "kvwatch/planner/kv_groups.py", "kvwatch/diagnosis/remedies.py"])
def test_no_second_copy_of_the_batch_defaults(module: str) -> None:
    """The GPU batch defaults live in vllm_releases/defaults.py only."""
    assert not _int_literals(ROOT / module) & {1024, 8192, 16384}


def test_an_unknown_release_says_which_release_it_is_planned_as() -> None:
    newest = str(max(KNOWN))
    assert f"vLLM 0.40.1 is newer than any release kvwatch has read: planned as {newest}" in release_for(v("0.40.1")).why
    assert release_for(v("0.40.1")).defaults.release == newest
    assert "planned as" not in release_for(v("0.32.0")).why


@pytest.mark.parametrize("release, engine", [("0.8.5", "v0"), ("0.10.2", "v0"), ("0.11.2", "v1"), ("0.32.0", "v1")])
def test_vllm_use_v1_0_asks_for_v0_only_while_envs_py_has_it(release: str, engine: str) -> None:
    # vLLM 0.10.2, vllm/envs.py:746 reads VLLM_USE_V1; 0.11.2's envs.py has no such variable
    assert release_for(v(release), {"VLLM_USE_V1": "0"}).engine == engine
