"""vLLM 0.34's extensible KV cache: when it is on, what it refuses, the KV memory it gives, the upgrade
check's rows and the remedies that must not lower its cap (planner/extensible_kv.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.diagnosis import Diagnosis, FailureKind, diagnose, propose_remedy
from kvwatch.planner.devices import GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.extensible_kv import effective_utilization, extensible_for, extensible_kv_bytes
from kvwatch.planner.release_compare import compare_releases
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.release_defaults import defaults_for
from kvwatch.vllm_releases.upgrade import default_changes

QWEN = str(Path(__file__).resolve().parent.parent / "examples" / "qwen2-7b")
LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
V33, V34 = parse_version("0.33.0"), parse_version("0.34.0")


def settings(*flags: str, release: str = "0.34.0"):  # type: ignore[no-untyped-def]
    return EngineCommand.parse(["vllm", "serve", QWEN, *flags], release).settings()


def plan(release: str, *flags: str):  # type: ignore[no-untyped-def]
    return plan_command(["vllm", "serve", QWEN, *flags], preset("h100"), ruleset_for(release), env={},
                        vllm_version=parse_version(release))


def test_on_by_default_on_cuda_only_from_0_34() -> None:
    assert extensible_for(settings(), "cuda", defaults_for(V34)).sizing is not None
    assert extensible_for(settings(release="0.33.0"), "cuda", defaults_for(V33)).sizing is None
    assert extensible_for(settings(), "cpu", defaults_for(V34)).sizing is None


@pytest.mark.parametrize("flags,why", [
    (["--no-enable-extensible-kv-cache"], "--no-enable-extensible-kv-cache"),
    (["--kv-cache-memory-bytes", "20G"], "kv_cache_memory_bytes overrides"),
    (["--num-gpu-blocks-override", "1000"], "num_gpu_blocks_override overrides"),
])
def test_flags_that_turn_it_off(flags: list[str], why: str) -> None:
    ext = extensible_for(settings(*flags), "cuda", defaults_for(V34))
    assert ext.sizing is None and why in ext.why and ext.refusal is None


def test_asked_for_where_it_cannot_be_is_refused_with_vllms_words() -> None:
    """vLLM 0.34.0, vllm/config/vllm.py:3263: ValueError(f"enable_extensible_kv_cache: {unsupported}.")"""
    ext = extensible_for(settings("--enable-extensible-kv-cache", "--kv-cache-memory-bytes", "20G"), "cuda",
                         defaults_for(V34))
    assert ext.refusal == ("enable_extensible_kv_cache: it sizes the KV cache from measured memory, which "
                           "kv_cache_memory_bytes overrides.")
    cpu = extensible_for(settings("--enable-extensible-kv-cache"), "cpu", defaults_for(V34))
    assert cpu.refusal == "enable_extensible_kv_cache: it is only supported on CUDA and ROCm."
    refused = plan("0.34.0", "--enable-extensible-kv-cache", "--kv-cache-memory-bytes", "20G")
    assert any("enable_extensible_kv_cache" in w.message and w.fix.remove == ("--enable-extensible-kv-cache",)
               for w in refused.warnings)


def test_the_sizing_formula_is_vllms() -> None:
    """measure_kv_cache_bytes (vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:592-612): the
    headroom less max(1 GiB, 0.75 x transient) binds unset; a low cap binds below it."""
    sizing = defaults_for(V34).extensible
    assert sizing is not None and sizing.margin_floor_bytes == GiB and sizing.margin_fraction == 0.75
    total, free, resident, transient = 80 * GiB, 79 * GiB, 16 * GiB, 2 * GiB
    assert extensible_kv_bytes(sizing, total, free, resident, transient) == free - resident - int(1.5 * GiB) - transient
    capped = extensible_kv_bytes(sizing, int(0.5 * total), free, resident, transient)
    assert capped == int(0.5 * total) - resident - transient


def test_unset_means_1_0_and_gives_more_than_0_33() -> None:
    p33, p34 = plan("0.33.0"), plan("0.34.0")
    assert p34.gpu_budget is not None and p34.gpu_budget.utilization == 1.0
    assert p34.kv_memory_bytes > p33.kv_memory_bytes + 2 * GiB
    assert p34.block_size == 64 and p33.block_size == 16


def test_an_explicit_utilization_caps_below_unset() -> None:
    assert plan("0.34.0", "--gpu-memory-utilization", "0.9").kv_memory_bytes < plan("0.34.0").kv_memory_bytes
    off = plan("0.34.0", "--no-enable-extensible-kv-cache")
    assert off.gpu_budget is not None and off.gpu_budget.utilization == 0.92 and off.gpu_budget.extensible is None


def test_effective_utilization() -> None:
    assert effective_utilization(settings(), "cuda", defaults_for(V34)) == 1.0
    assert effective_utilization(settings(), "cpu", defaults_for(V34)) == 0.92
    assert effective_utilization(settings("--gpu-memory-utilization", "0.8"), "cuda", defaults_for(V34)) == 0.8
    assert effective_utilization(settings(release="0.33.0"), "cuda", defaults_for(V33)) == 0.92


def test_the_upgrade_check_names_sizing_and_the_cap() -> None:
    _, _, unset = _compare("0.33.0", "0.34.0")
    rows = {d.field: d for d in unset.differences}
    assert rows["utilization"].b == 1.0 and "vllm/config/cache.py:500" in rows["utilization"].source
    assert rows["kv_sizing"].b == "after warm-up"
    assert rows["block_size"].b == 64 and "utilization_cap" not in rows
    _, _, capped = _compare("0.33.0", "0.34.0", "--gpu-memory-utilization", "0.9")
    cap = {d.field: d for d in capped.differences}["utilization_cap"]
    assert cap.b == 0.9 and "now caps the KV cache" in cap.reason
    changes = " ".join(default_changes(defaults_for(V33), defaults_for(V34)))
    assert "extensible KV cache on by default" in changes and "default block size 16 -> 64" in changes


def _compare(a: str, b: str, *flags: str):  # type: ignore[no-untyped-def]
    argv = ["vllm", "serve", QWEN, *flags]
    pa, pb = plan(a, *flags), plan(b, *flags)
    return pa, pb, compare_releases(pa, pb, parse_version(a), parse_version(b), preset("h100"), argv)


def test_no_kv_memory_remedy_never_lowers_the_unset_1_0() -> None:
    """"Raise utilization to 0.95" lowers the cap where unset means 1.0."""
    d = diagnose((LOGS / "gpu_no_kv_cache_memory.log").read_text(encoding="utf-8").splitlines())
    assert d.kind is FailureKind.NO_KV_CACHE_MEMORY
    unset = EngineCommand.parse(["vllm", "serve", "/models/m"], "0.34.0")
    remedy = propose_remedy(d, unset)
    assert remedy is None or "--gpu-memory-utilization" not in remedy.change.set
    capped = EngineCommand.parse(["vllm", "serve", "/models/m", "--gpu-memory-utilization", "0.9"], "0.34.0")
    remedy = propose_remedy(d, capped)
    assert remedy is not None and remedy.change.remove == ("--gpu-memory-utilization",)
    old = EngineCommand.parse(["vllm", "serve", "/models/m"], "0.33.0")
    assert propose_remedy(d, old).change.set == {"--gpu-memory-utilization": 0.95}   # 0.92 -> 0.95 on 0.33


def test_oom_lowers_from_the_unset_1_0() -> None:
    d = Diagnosis(FailureKind.CUDA_OOM, None, {"phase": "forward"}, False)
    remedy = propose_remedy(d, EngineCommand.parse(["vllm", "serve", "/models/m", "--max-num-seqs", "1"], "0.34.0"))
    if remedy is not None and "--gpu-memory-utilization" in remedy.change.set:
        assert remedy.change.set["--gpu-memory-utilization"] < 1.0


@pytest.mark.parametrize("release,flags,refused", [
    ("0.33.0", ["--kv-cache-dtype", "float16"], True),    # qwen2-7b is bfloat16
    ("0.34.0", ["--kv-cache-dtype", "float16"], True),
    ("0.33.0", ["--kv-cache-dtype", "bfloat16"], False),
    ("0.33.0", ["--kv-cache-dtype", "float16", "--dtype", "half"], False),
    ("0.32.0", ["--kv-cache-dtype", "float16"], False),   # 0.32 has no such check
])
def test_an_explicit_16bit_kv_dtype_other_than_the_models_is_refused_from_0_33(
        release: str, flags: list[str], refused: bool) -> None:
    """vLLM 0.33.0, vllm/config/vllm.py:1492-1508 (_reject_mismatched_float_kv_cache)."""
    found = [w for w in plan(release, *flags).warnings if "is incompatible with dtype" in w.message]
    assert bool(found) is refused
    if refused:
        assert found[0].message.startswith('ValueError: kv_cache_dtype="float16" is incompatible with '
                                           'dtype="bfloat16". Please set `--kv-cache-dtype` to `auto` or `bfloat16`.')
        assert found[0].fix.set == {"--kv-cache-dtype": "auto"}


@pytest.mark.parametrize("env,refused", [
    ({"VLLM_USE_V2_MODEL_RUNNER": "0"}, "VLLM_USE_V2_MODEL_RUNNER=0 is no longer supported"),
    ({"VLLM_USE_V2_MODEL_RUNNER": "1"}, None),
    ({"VLLM_MARLIN_INPUT_DTYPE": "int8"}, "VLLM_MARLIN_INPUT_DTYPE has been removed"),
])
def test_0_34_refuses_the_removed_runner_and_env_values(env: dict[str, str], refused: str | None) -> None:
    """vLLM 0.34.0, vllm/platforms/interface.py:1481-1493, vllm/envs.py:654-660."""
    p = plan_command(["vllm", "serve", QWEN], preset("h100"), ruleset_for("0.34.0"), env=env,
                     vllm_version=V34)
    found = [w.message for w in p.warnings if "ValueError: VLLM_" in w.message]
    assert (found[0].startswith(f"ValueError: {refused}") if refused else found == [])
    old = plan_command(["vllm", "serve", QWEN], preset("h100"), ruleset_for("0.33.0"), env=env, vllm_version=V33)
    assert not [w for w in old.warnings if "ValueError: VLLM_" in w.message]


@pytest.mark.parametrize("logged,utilization", [("0.34.0", None), ("0.33.0", 0.95)])
def test_diagnose_reads_the_release_from_the_logs_version_line(logged: str, utilization: float | None) -> None:
    """The remedy follows the release the log names, whatever release the command was read as."""
    lines = [f"(APIServer pid=1) INFO 12-06 21:00:00 [api_server.py:1] vLLM API server version {logged}",
             *(LOGS / "gpu_no_kv_cache_memory.log").read_text(encoding="utf-8").splitlines()]
    d = diagnose(lines)
    assert d.release == logged and d.kind is FailureKind.NO_KV_CACHE_MEMORY
    other = "0.33.0" if logged == "0.34.0" else "0.34.0"
    remedy = propose_remedy(d, EngineCommand.parse(["vllm", "serve", "/models/m"], other))
    got = remedy.change.set.get("--gpu-memory-utilization") if remedy is not None else None
    assert got == utilization
