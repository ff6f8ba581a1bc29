"""Remedies: the flag change per failure class, on the real diagnoses of tests/fixtures/logs."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from gpu_log_corpus import all_runs, plan_run
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.diagnosis import SAME_PLAN_REASON, Diagnosis, FailureKind, GpuContext, Remedy, diagnose, propose_remedy
from kvwatch.planner.devices import preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.rules import ruleset_for
from kvwatch.policy import Policy

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
KIMI = str(Path(__file__).resolve().parent.parent / "examples" / "kimi-k2")
GiB = 2**30
BASE = ["vllm", "serve", "/models/m"]


def diag(name: str, *extra_lines: str) -> Diagnosis:
    lines = (LOGS / name).read_text(encoding="utf-8", errors="replace").splitlines()
    return diagnose(lines + list(extra_lines))


def cmd(*flags: str) -> EngineCommand:
    """The failed command, read as 0.33 reads it: these remedies are those of the profile's estimate-based
    sizing (an unset utilization is 0.92); 0.34's extensible KV cache has its own (test_extensible_kv.py)."""
    return EngineCommand.parse(BASE + list(flags), "0.33.0")


# fixture, flags of the failed command, expected set, expected remove
CASES = [
    ("cpu_block_size_8.log", ["--block-size", "8"], {"--block-size": 32}, ()),
    ("cpu_fp8_head16.log", ["--kv-cache-dtype", "fp8"], {"--kv-cache-dtype": "auto"}, ()),
    ("cpu_fp8_head32.log", ["--kv-cache-dtype", "fp8"], {"--kv-cache-dtype": "auto"}, ()),
    ("cpu_max_model_len.log", ["--max-model-len", "262144"], {"--max-model-len": 130944}, ()),
    ("gpu_kernel_oor_sm120_fp8.log", ["--kv-cache-dtype", "fp8", "--block-size", "64"],
     {"--kv-cache-dtype": "auto"}, ()),
    ("gpu_sampler_warmup_oom.log", [], {"--max-num-seqs": 512}, ()),
    ("gpu_sampler_warmup_oom_dp.log", ["--max-num-seqs", "1024"], {"--max-num-seqs": 512}, ()),
    ("gpu_load_oom.log", ["--gpu-memory-utilization", "0.9"], {"--gpu-memory-utilization": 0.85}, ()),
    ("gpu_torch_oom.log", [], {"--gpu-memory-utilization": 0.87}, ()),
    ("gpu_memory_busy.log", ["--gpu-memory-utilization", "0.9"], {"--gpu-memory-utilization": 0.85}, ()),
    ("gpu_no_kv_cache_memory.log", ["--gpu-memory-utilization", "0.9"], {"--gpu-memory-utilization": 0.95}, ()),
    ("gpu_no_kv_cache_memory_v1.log", [], {"--gpu-memory-utilization": 0.95}, ()),
    ("gpu_kv_cache_too_small_old.log", ["--max-model-len", "29000"], {"--max-model-len": 23648}, ()),
    ("gpu_kv_cache_too_small_old.log", ["--max-model-len", "29000", "--block-size", "64"],
     {"--max-model-len": 23616}, ()),
    ("gpu_no_attention_backend_block.log", ["--block-size", "8"], {"--block-size": 16}, ()),
    ("gpu_block_size_old.log", ["--block-size", "8"], {"--block-size": 16}, ()),
    # vLLM's refusals of its configuration.
    ("cpu_refusal_max_model_len.log", ["--max-model-len", "300000"], {"--max-model-len": 1024}, ()),
    ("cpu_refusal_batched_tokens.log",
     ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "512", "--max-model-len", "1024"],
     {"--max-num-batched-tokens": 1024}, ()),
    ("cpu_refusal_batched_lt_seqs.log", ["--max-num-batched-tokens", "64", "--max-num-seqs", "128"],
     {"--max-num-batched-tokens": 128}, ()),
    ("cpu_refusal_gpu_utilization.log", ["--gpu-memory-utilization", "1.5"], {"--gpu-memory-utilization": 0.95}, ()),
    ("cpu_refusal_block_size_0.log", ["--block-size", "0"], {}, ("--block-size",)),
]


@pytest.mark.parametrize("name,flags,expected_set,expected_remove", CASES, ids=[c[0] for c in CASES])
def test_fixture_remedy(name, flags, expected_set, expected_remove):
    command = cmd(*flags)
    remedy = propose_remedy(diag(name), command, tried=(command.argv,))
    assert remedy is not None
    assert remedy.change.set == expected_set and remedy.change.remove == expected_remove
    assert remedy.reason
    new = remedy.apply(command)
    assert new.argv != command.argv
    for flag, value in expected_set.items():
        assert new.get(flag) == str(value)


@pytest.mark.parametrize("name", ["gpu_kernel_oor_auto_kv.log", "gpu_no_attention_backend_hw.log",
                                  "cpu_refusal_tp_heads.log", "cpu_lfm2_conv_prepack_0.31.log",
                                  "cpu_kimi_linear_conv_float_0.30.log"])
def test_fatal_has_no_remedy(name):
    d = diag(name)
    assert d.fatal
    assert propose_remedy(d, cmd("--block-size", "64", "--kv-cache-dtype", "fp8")) is None


def test_engine_died_restarts_with_the_same_plan_even_when_tried():
    command = cmd("--max-model-len", "4096")
    remedy = propose_remedy(diag("cpu_engine_died.log"), command, tried=(command.argv,))
    assert remedy == Remedy(FlagChange(), SAME_PLAN_REASON)
    assert remedy.same_plan and remedy.apply(command) == command


def test_unknown_is_restarted_as_it_is():
    """A crash is a restart, never a verdict: no flag is known to help, the same plan runs again (the
    watchdog bounds it by the restart budget)."""
    d = diagnose(["RuntimeError: Engine core initialization failed. See root cause above."])
    remedy = propose_remedy(d, cmd())
    assert remedy is not None and remedy.same_plan and "no failure line names a cause" in remedy.reason


# -- block size ------------------------------------------------------------------------

def test_block_size_options_in_order_then_none():
    d = diag("cpu_block_size_8.log")
    command = cmd("--block-size", "8")
    tried = [command.argv]
    first = propose_remedy(d, command, tried=tried)
    assert first.change.set == {"--block-size": 32}
    tried.append(first.apply(command).argv)
    second = propose_remedy(d, command, tried=tried)       # the rule table says 32 too: next is removal
    assert second.change.set == {} and second.change.remove == ("--block-size",)
    tried.append(second.apply(command).argv)
    assert propose_remedy(d, command, tried=tried) is None


def test_block_size_common_to_every_backend():
    d = diagnose(["ValueError: No common block size for 16 (FLASHINFER: [16, 32, 64]; FLASHMLA: [64])."])
    assert propose_remedy(d, cmd("--block-size", "16")).change.set == {"--block-size": 64}


def test_block_size_from_the_rule_table_when_the_message_names_no_sizes():
    d = diagnose(["ValueError: Aligned KV cache block size 48 is not supported by attention backend(s): FLASHMLA."])
    assert propose_remedy(d, cmd("--block-size", "48")).change.set == {"--block-size": 64}


def test_block_size_removed_when_no_legal_size_is_known():
    d = diagnose(["RuntimeError: Unsupported block size: 128"])
    remedy = propose_remedy(d, cmd("--block-size", "128"))
    assert remedy.change.set == {} and remedy.change.remove == ("--block-size",)


def test_block_size_switched_off_by_policy():
    policy = Policy(allow_block_size_change=False)
    assert propose_remedy(diag("cpu_block_size_8.log"), cmd("--block-size", "8"), policy=policy) is None
    assert propose_remedy(diag("gpu_no_attention_backend_block.log"), cmd("--block-size", "8"),
                          policy=policy) is None


# -- KV dtype and kernel limits --------------------------------------------------------

def test_kv_dtype_switched_off_by_policy():
    policy = Policy(allow_kv_dtype_change=False)
    for name in ("cpu_fp8_head16.log", "gpu_kernel_oor_sm120_fp8.log"):
        assert propose_remedy(diag(name), cmd("--kv-cache-dtype", "fp8"), policy=policy) is None


def test_kernel_limit_never_changes_block_size():
    d = diag("gpu_kernel_oor_sm120_fp8.log")
    command = cmd("--kv-cache-dtype", "fp8", "--block-size", "64")
    tried = [command.argv]
    while (remedy := propose_remedy(d, command, tried=tried)) is not None:
        assert "--block-size" not in remedy.change.set and "--block-size" not in remedy.change.remove
        tried.append(remedy.apply(command).argv)
    assert len(tried) == 2


def test_kernel_limit_with_bf16_kv_has_no_remedy():
    assert propose_remedy(diag("gpu_kernel_oor_sm120_fp8.log"), cmd("--kv-cache-dtype", "bfloat16")) is None


def test_kernel_limit_when_the_checkpoint_chose_fp8():
    # --kv-cache-dtype left at auto, but the engine's config line says fp8 (an NVFP4 checkpoint
    # asks for it): `auto` would change nothing, so the KV dtype is named explicitly.
    d = diag("gpu_kernel_oor_sm120_fp8.log",
             "(EngineCore pid=1) INFO 06-25 12:00:00 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
             "config: model='moonshotai/Kimi-K2.7', dtype=torch.bfloat16, kv_cache_dtype=fp8, device_config=cuda")
    assert d.kind is FailureKind.KERNEL_OUT_OF_RESOURCES and not d.fatal
    assert propose_remedy(d, cmd()).change.set == {"--kv-cache-dtype": "bfloat16"}


def test_kernel_limit_with_the_planner_plan():
    plan = plan_command(["vllm", "serve", KIMI, "--kv-cache-dtype", "fp8"], preset("rtx-pro-6000"),
                        ruleset_for("0.32.0"))
    assert plan.backend == "TRITON_MLA"
    command = EngineCommand.parse(["vllm", "serve", KIMI, "--kv-cache-dtype", "fp8"])
    remedy = propose_remedy(diag("gpu_kernel_oor_sm120_fp8.log"), command, plan=plan)
    assert remedy.change.set == {"--kv-cache-dtype": "auto"}


# -- KV cache sizing ---------------------------------------------------------------------

def test_max_model_len_rounded_to_the_plan_block_size():
    plan = plan_command(["vllm", "serve", KIMI], preset("h200"), ruleset_for("0.32.0"))
    d = diag("gpu_kv_cache_too_small_old.log")
    command = cmd("--max-model-len", "29000", "--block-size", "16")
    assert propose_remedy(d, command, plan=replace(plan, block_size=64)).change.set == {"--max-model-len": 23616}
    assert propose_remedy(d, command, plan=replace(plan, block_size=16)).change.set == {"--max-model-len": 23648}


def test_kv_too_small_falls_back_to_more_memory():
    d = diag("cpu_max_model_len.log")
    command = cmd("--max-model-len", "262144")
    tried = [command.argv, cmd("--max-model-len", "130944").argv]
    assert propose_remedy(d, command, tried=tried).change.set == {"--gpu-memory-utilization": 0.95}
    policy = Policy(allow_max_model_len_change=False)
    assert propose_remedy(d, command, policy=policy).change.set == {"--gpu-memory-utilization": 0.95}
    policy = Policy(allow_max_model_len_change=False, allow_gpu_memory_utilization_change=False)
    assert propose_remedy(d, command, policy=policy) is None


def test_no_kv_memory_respects_cap_room_and_policy():
    d = diag("gpu_no_kv_cache_memory.log")
    assert "tensor-parallel-size" in d.facts["help"]
    assert propose_remedy(d, cmd("--gpu-memory-utilization", "0.95")) is None            # at the cap
    assert propose_remedy(d, cmd("--gpu-memory-utilization", "0.8"),
                          policy=Policy(max_gpu_memory_utilization=0.9)).change.set == {"--gpu-memory-utilization": 0.85}
    full = GpuContext(free_bytes=70 * GiB, total_bytes=80 * GiB)                          # 0.875 free
    assert propose_remedy(d, cmd("--gpu-memory-utilization", "0.9"), gpu=full) is None
    room = GpuContext(free_bytes=79 * GiB, total_bytes=80 * GiB)
    assert propose_remedy(d, cmd("--gpu-memory-utilization", "0.9"), gpu=room).change.set == \
        {"--gpu-memory-utilization": 0.95}
    assert propose_remedy(d, cmd(), policy=Policy(allow_gpu_memory_utilization_change=False)) is None


def test_no_kv_memory_from_the_dummy_sequences_halves_them_as_the_plan_says(tmp_path: Path) -> None:
    """Llama 3.2 Vision on V0 at 256 sequences (vllm#9445): no utilization frees enough, the plan's
    fix is fewer dummy sequences, and the restart takes it before any utilization step; the same log
    without that plan keeps the utilization step."""
    run = next(r for r in all_runs() if r["name"] == "pr12126_llama32_11b_vision_h100")
    run = {**run, "status": "ok", "gpu": "NVIDIA A100-SXM4-80GB", "total_gpu_memory_gib": 79.15,
           "flags": ["--max-model-len 1024", "--gpu-memory-utilization 0.9"], "planned_for_vllm_version": "0.6.3"}
    plan = plan_run(run, tmp_path / "m")
    fix = next(w.fix for w in plan.warnings if w.kind == FailureKind.NO_KV_CACHE_MEMORY)
    d = diag("gpu_no_kv_cache_memory.log")
    command = cmd("--max-model-len", "1024", "--gpu-memory-utilization", "0.9")
    remedy = propose_remedy(d, command, plan=plan)
    assert remedy is not None and remedy.change == fix and "--max-num-seqs" in remedy.change.set
    assert propose_remedy(d, command, plan=plan, tried=[remedy.apply(command).argv]).change.set == \
        {"--gpu-memory-utilization": 0.95}
    assert propose_remedy(d, command).change.set == {"--gpu-memory-utilization": 0.95}


def test_utilization_steps_past_a_tried_value():
    d = diag("gpu_no_kv_cache_memory.log")
    command = cmd("--gpu-memory-utilization", "0.8")
    tried = [command.argv, cmd("--gpu-memory-utilization", "0.85").argv]
    assert propose_remedy(d, command, tried=tried).change.set == {"--gpu-memory-utilization": 0.9}


# -- CUDA OOM ----------------------------------------------------------------------------

def test_sampler_oom_then_utilization():
    d = diag("gpu_sampler_warmup_oom.log")
    command = cmd("--max-num-seqs", "256", "--gpu-memory-utilization", "0.9")
    assert propose_remedy(d, command).change.set == {"--max-num-seqs": 128}
    tried = [command.argv, cmd("--max-num-seqs", "128", "--gpu-memory-utilization", "0.9").argv]
    assert propose_remedy(d, command, tried=tried).change.set == {"--gpu-memory-utilization": 0.85}


def test_sampler_oom_default_max_num_seqs_follows_vllm():
    d = Diagnosis(FailureKind.CUDA_OOM, None, {"phase": "sampler_warmup"}, False)
    assert propose_remedy(d, cmd()).change.set == {"--max-num-seqs": 128}                         # 256 default
    h200 = GpuContext(free_bytes=140 * GiB, total_bytes=141 * GiB)
    assert propose_remedy(d, cmd(), gpu=h200).change.set == {"--max-num-seqs": 512}              # 1024 on >= 70 GiB


def test_oom_utilization_floor():
    d = diag("gpu_torch_oom.log")
    assert propose_remedy(d, cmd("--gpu-memory-utilization", "0.5")) is None
    assert propose_remedy(d, cmd("--gpu-memory-utilization", "0.52")).change.set == {"--gpu-memory-utilization": 0.5}


# -- GPU busy ----------------------------------------------------------------------------

def test_busy_gpu_held_by_our_processes_is_the_watchdogs_to_clear():
    gpu = GpuContext(free_bytes=2 * GiB, total_bytes=22 * GiB,
                     holders=((4242, "VLLM::EngineCore", True), (99, "python", False)))
    command = cmd("--gpu-memory-utilization", "0.9")
    remedy = propose_remedy(diag("gpu_memory_busy.log"), command, gpu=gpu, tried=(command.argv,))
    assert remedy.same_plan and "4242" in remedy.reason


def test_busy_gpu_fits_utilization_to_free_memory_now():
    gpu = GpuContext(free_bytes=60 * GiB, total_bytes=80 * GiB, holders=((99, "python", False),))
    remedy = propose_remedy(diag("gpu_memory_busy.log"), cmd("--gpu-memory-utilization", "0.9"), gpu=gpu)
    assert remedy.change.set == {"--gpu-memory-utilization": 0.73} and "99 (python)" in remedy.reason


def test_busy_gpu_freed_since_restarts_the_same_plan():
    gpu = GpuContext(free_bytes=79 * GiB, total_bytes=80 * GiB)
    remedy = propose_remedy(diag("gpu_memory_busy.log"), cmd("--gpu-memory-utilization", "0.9"), gpu=gpu)
    assert remedy.same_plan


def test_busy_gpu_too_full_or_switched_off():
    d = diag("gpu_memory_busy.log")
    nearly_full = GpuContext(free_bytes=30 * GiB, total_bytes=80 * GiB)
    assert propose_remedy(d, cmd(), gpu=nearly_full) is None                              # below the floor
    assert propose_remedy(d, cmd(), policy=Policy(allow_gpu_memory_utilization_change=False)) is None


# -- attention backend -------------------------------------------------------------------

def test_backend_rejected_for_kv_dtype_only():
    # The format string of platforms/cuda.py, filled for an fp8 KV cache on a GPU without fp8 kernels.
    d = diagnose(["ValueError: No valid attention backend found for cuda with AttentionSelectorConfig("
                  "head_size=128, dtype=torch.float16, kv_cache_dtype=fp8, block_size=16, use_mla=False). "
                  "Reasons: {FLASH_ATTN: [kv_cache_dtype not supported], FLASHINFER: [compute capability not "
                  "supported], TRITON_ATTN: [kv_cache_dtype not supported]}."])
    assert d.kind is FailureKind.NO_ATTENTION_BACKEND and not d.fatal
    assert propose_remedy(d, cmd("--kv-cache-dtype", "fp8")).change.set == {"--kv-cache-dtype": "auto"}
    assert propose_remedy(d, cmd("--kv-cache-dtype", "fp8"), policy=Policy(allow_kv_dtype_change=False)) is None


def test_forced_backend_is_dropped():
    d = diagnose(["ValueError: Selected backend AttentionBackendEnum.FLASHMLA is not valid for this "
                  "configuration. Reason: ['compute capability not supported']"])
    remedy = propose_remedy(d, cmd("--attention-backend", "FLASHMLA"))
    assert remedy.change.remove == ("--attention-backend",)


# -- never a tried argv ------------------------------------------------------------------

FIXTURES = sorted(p.name for p in LOGS.glob("*.log"))
FLAG_CHOICES = st.lists(st.sampled_from([
    ("--block-size", "8"), ("--block-size", "64"), ("--kv-cache-dtype", "fp8"), ("--kv-cache-dtype", "auto"),
    ("--max-model-len", "262144"), ("--max-model-len", "29000"), ("--gpu-memory-utilization", "0.9"),
    ("--gpu-memory-utilization", "0.5"), ("--max-num-seqs", "1024"), ("--attention-backend", "FLASHMLA"),
]), max_size=5, unique_by=lambda f: f[0])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FIXTURES), FLAG_CHOICES, st.booleans(), st.booleans())
def test_remedies_never_repeat_a_tried_argv(name, flags, allow_dtype, allow_util):
    d = diag(name)
    command = cmd(*[t for f in flags for t in f])
    policy = Policy(allow_kv_dtype_change=allow_dtype, allow_gpu_memory_utilization_change=allow_util)
    tried = [command.argv]
    for _ in range(30):
        remedy = propose_remedy(d, command, policy=policy, tried=tried)
        if remedy is None:
            break
        if remedy.same_plan:
            assert d.kind in (FailureKind.ENGINE_DIED, FailureKind.GPU_MEMORY_BUSY)
            break
        argv = remedy.apply(command).argv
        assert argv not in tried
        if not allow_dtype:
            assert "--kv-cache-dtype" not in remedy.change.set
        if not allow_util:
            assert "--gpu-memory-utilization" not in remedy.change.set
        tried.append(argv)
    else:
        pytest.fail("remedies never ran out")
