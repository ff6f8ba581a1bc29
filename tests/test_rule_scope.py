"""Issue 39: a rule may change a command only where kvwatch knows the architecture it applies to.

One row per rule that predicts a refusal (planner/rules.py's kernel limit, backend_legality.py,
config_refusals.py, architectures.py, plan.py's cache checks; preflight.py applies them). Each row
first fires its rule on an architecture kvwatch classifies (a certain warning, the proof the row
reaches the rule), then on the same config.json led by an architecture outside every rule's scope:
no certain warning, no fix, and preflight launches the command as given.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_support import deepseek_v2_config, llama_config
from fixtures.models.newest import NEWEST
from test_hybrid_planner import granite

from kvwatch.boundary.model_source import ModelSource
from kvwatch.cli import main
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.architecture_kinds import UNKNOWN, table_release, verdict
from kvwatch.planner.architectures import IN_TRANSFORMERS, PREVIOUSLY_SUPPORTED
from kvwatch.planner.devices import Device, GiB, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.policy import Policy
from kvwatch.watchdog.preflight import preflight

RULES = ruleset_for(None)
CPU = Device("cpu", "cpu", cpu_fp8_kv=True)
CPU_NO_AVX512 = Device("cpu", "cpu", cpu_fp8_kv=False)
KIMI = json.loads((Path(__file__).parent.parent / "examples/kimi-k2/config.json").read_text())
# An architecture no release registers: every architecture of 0.32-0.34 with a cache is now classified
# (planned, refused or a draft), so the one left outside every rule's scope is a name vLLM does not know
# (it may still run it on its Transformers backend): kvwatch's verdict is unknown, not refused, and no
# rule of kvwatch was read for it.
OUTSIDE = "KvwatchUnregisteredForCausalLM"
DROPPED = sorted(a for a in PREVIOUSLY_SUPPORTED if a not in IN_TRANSFORMERS)[0]

K = FailureKind
Case = tuple[str, Callable[[], dict], tuple[str, ...], Device, FailureKind]
CASES: list[Case] = [
    ("rules.py kernel limit: TRITON_MLA fp8 on SM 12.x", lambda: KIMI,
     ("--kv-cache-dtype", "fp8", "--kv-cache-memory-bytes", "40G"), preset("rtx-pro-6000"), K.KERNEL_OUT_OF_RESOURCES),
    ("backend_legality.py: an --attention-backend that is not valid", llama_config,
     ("--attention-backend", "FLASHMLA", "--kv-cache-memory-bytes", "8G"), preset("h100"), K.NO_ATTENTION_BACKEND),
    ("backend_legality.py: a KV dtype no backend stores", llama_config,
     ("--kv-cache-dtype", "fp8",), CPU_NO_AVX512, K.KV_DTYPE_UNSUPPORTED),
    ("backend_legality.py: a block size the backend refuses", llama_config,
     ("--block-size", "24",), CPU, K.BLOCK_SIZE_UNSUPPORTED),
    ("config_refusals.py: max model len above the model's", llama_config,
     ("--max-model-len", "8192",), CPU, K.CONFIG_REFUSED),
    ("config_refusals.py: --max-model-len auto with no length in config.json",
     lambda: {k: v for k, v in llama_config().items() if k != "max_position_embeddings"},
     ("--max-model-len", "auto"), CPU, K.CONFIG_REFUSED),
    ("config_refusals.py: TP does not divide the heads", llama_config,
     ("-tp", "3", "--kv-cache-memory-bytes", "8G"), preset("h100"), K.CONFIG_REFUSED),
    ("config_refusals.py: a block size of 0", llama_config, ("--block-size", "0"), CPU, K.CONFIG_REFUSED),
    ("config_refusals.py: GPU memory utilization above 1", llama_config,
     ("--gpu-memory-utilization", "1.5", "--kv-cache-memory-bytes", "8G"), preset("h100"), K.CONFIG_REFUSED),
    ("config_refusals.py: batched tokens below max model len, chunked prefill off", llama_config,
     ("--max-num-batched-tokens", "1024", "--no-enable-chunked-prefill"), CPU, K.CONFIG_REFUSED),
    ("config_refusals.py: batched tokens below max num seqs", llama_config,
     ("--max-num-batched-tokens", "64", "--max-num-seqs", "128"), CPU, K.CONFIG_REFUSED),
    ("architectures.py: an architecture vLLM dropped",
     lambda: {**llama_config(), "architectures": [DROPPED]}, (), CPU, K.CONFIG_REFUSED),
    ("architectures.py: sparse attention on the CPU",
     lambda: {**deepseek_v2_config(), "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
              "index_topk": 64, "index_n_heads": 4, "index_head_dim": 128}, (), CPU, K.NO_ATTENTION_BACKEND),
    ("architectures.py: Qwen2 sliding only some layers",
     lambda: {**llama_config(layers=4), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "use_sliding_window": True, "sliding_window": 1024, "max_window_layers": 2}, (), CPU, K.CONFIG_REFUSED),
    ("plan.py: a KV cache too small for max model len", llama_config,
     ("--kv-cache-memory-bytes", "1M", "--max-model-len", "4096"), preset("h100"), K.KV_CACHE_TOO_SMALL),
    ("plan.py: no memory left for KV blocks", llama_config,
     ("--kv-cache-memory-bytes", "1K",), preset("h100"), K.NO_KV_CACHE_MEMORY),
    ("plan.py: max num seqs above the Mamba blocks", lambda: granite("4096")[0],
     tuple(granite("4096")[1]), preset("h100"), K.MAMBA_CACHE_TOO_SMALL),
]


def _outside(config: dict) -> dict:
    """The same config.json naming only an architecture kvwatch cannot classify (vLLM serves the first
    listed one it registers, architecture_kinds.unknown_reasons, so no registered one may follow it)."""
    return {**config, "architectures": [OUTSIDE]}


def _plan(config: dict, flags: tuple[str, ...], device: Device) -> Plan:
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    memory = MemoryInputs(cpu_kv_space_bytes=GiB if device.platform == "cpu" else None)
    return make_plan(geometry_from_config(config), settings, device, RULES, memory)


def test_the_outside_architecture_is_one_kvwatch_cannot_classify() -> None:
    """Unknown (not refused) in every release kvwatch reads, the table's newest among them."""
    release = table_release(None)
    assert release is not None and verdict(OUTSIDE, release).handling == UNKNOWN
    assert {verdict(OUTSIDE, r).handling for r in ("0.32.0", "0.33.0", "0.34.0")} == {UNKNOWN}


@pytest.mark.parametrize("rule,config,flags,device,kind", CASES, ids=[c[0] for c in CASES])
def test_every_rule_holds_only_where_kvwatch_knows_the_architecture(
        rule: str, config: Callable[[], dict], flags: tuple[str, ...], device: Device, kind: FailureKind) -> None:
    inside = _plan(config(), flags, device)
    assert inside.source != "unknown"
    assert any(w.kind == kind and w.certain for w in inside.warnings), (rule, inside.warnings)

    outside = _plan(_outside(config()), flags, device)
    assert outside.source == "unknown" and outside.unknown_layer_types
    assert not outside.will_fail and outside.fixes(certain_only=False).empty
    fired = [w for w in outside.warnings if w.kind == kind]
    if DROPPED in config().get("architectures", []):   # its rule is about that name, which `outside` no longer lists
        assert not fired
        return
    assert fired and all("not applied: kvwatch cannot classify" in w.message for w in fired)


@pytest.mark.parametrize("rule,config,flags,device,kind", CASES, ids=[c[0] for c in CASES])
def test_preflight_launches_a_command_outside_every_rule_as_given(
        rule: str, config: Callable[[], dict], flags: tuple[str, ...], device: Device, kind: FailureKind) -> None:
    command = EngineCommand.parse(["vllm", "serve", "m", *flags])

    def run(cfg: dict) -> tuple[EngineCommand, list]:
        read = lambda _model: ModelSource(Path("m"), cfg)   # noqa: E731
        fixed, fixes, _plan = preflight(command, device, RULES, {"VLLM_CPU_KVCACHE_SPACE": "1"}, Policy(),
                                        read_model=read)
        return fixed, fixes

    inside_command, _ = run(config())
    outside_command, outside_fixes = run(_outside(config()))
    assert outside_fixes == [] and outside_command.argv == command.argv
    if rule.startswith("rules.py"):   # the case: preflight did rewrite --kv-cache-dtype
        assert inside_command.argv != command.argv


def test_deepseek_v4_flash_as_served_is_launched_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's run: DeepSeek-V4-Flash, fp8 KV, TP 2 on RTX PRO 6000, MTP 2, 1M context, served."""
    model = tmp_path / "DeepSeek-V4-Flash"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(NEWEST["deepseek_v4_flash"]["config"]))
    argv = ["vllm", "serve", str(model), "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8",
            "--max-model-len", "1048576", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}']
    # As 0.34.0, which builds DeepSeek-V4 (kvwatch plans it), not as whatever release is installed here.
    assert main(["plan", "--preset", "rtx-pro-6000", "--vllm-version", "0.34.0", "--", *argv]) == 0
    out = capsys.readouterr().out
    assert "FAILS:" not in out and "OK: vLLM should accept this plan" in out
    command = EngineCommand.parse(argv)
    fixed, fixes, plan = preflight(command, preset("rtx-pro-6000"), ruleset_for("0.34.0"), {}, Policy())
    assert fixes == [] and fixed.argv == command.argv
    # preflight plans as the installed release: unknown where it builds no DeepSeek-V4 (0.32), else exact
    assert plan is not None and not plan.will_fail
