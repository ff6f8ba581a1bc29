"""vLLM's failure messages, as data: one Pattern per wording, old and new.

Each Pattern names its class, a priority (the more specific the root cause, the higher:
a kernel's resource limit beats the CUDA OOM it may cause, anything beats a wrapper),
the literal keywords a line must contain before its regex is tried (the scanner's cheap
prefilter), the regex, and a function that turns the match into facts.

Texts are from the vLLM 0.32 source (file noted per pattern) and, for wordings that 0.32
no longer prints, from real logs in vLLM's GitHub issues (tests/fixtures/logs/README.md).
JsonFacts are plain JSON values: ints, floats (GiB as vLLM prints them), strings, lists, dicts.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvwatch.diagnosis import refusals
from kvwatch.diagnosis.facts import JsonFacts
from kvwatch.diagnosis.startup_lines import KV_TOKENS, KV_TOKENS_MARKER, kv_tokens_of
from kvwatch.failure_kinds import FailureKind

Extractor = Callable[["re.Match[str]"], JsonFacts]

_UNIT_GIB = {"B": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0, "TiB": 1024.0}


def _gib(number: str, unit: str) -> float:
    return round(float(number) * _UNIT_GIB.get(unit, 1.0), 4)


def _no_facts(m: re.Match[str]) -> JsonFacts:
    return {}


@dataclass(frozen=True)
class Pattern:
    name: str                       # stable id, reported as facts["pattern"]
    kind: FailureKind
    priority: int
    keywords: tuple[str, ...]       # the line must contain one of these (case-sensitive)
    regex: re.Pattern[str]
    extract: Extractor = field(default=_no_facts)
    source: str = ""                # where the text comes from (vLLM file or version)
    # The message's distinctive head, its facts' groups optional: names the class when the line was
    # cut before the whole message (a paste, a log cut off), with the facts that are there.
    head: re.Pattern[str] | None = None


# -- fact extractors ---------------------------------------------------------------------

_BLOCK_RULE = re.compile(r"MultipleOf\((\d+)\)|(\d+)")


def block_rules(text: str) -> list[int | str]:
    """'[MultipleOf(32)]' / '16, 32, 64' -> [\"MultipleOf(32)\"] / [16, 32, 64] (JSON-friendly)."""
    out: list[int | str] = []
    for multiple, exact in _BLOCK_RULE.findall(text):
        out.append(f"MultipleOf({multiple})" if multiple else int(exact))
    return out


_BACKEND_SIZES = re.compile(r"(\w+): \[([^\]]*)\]")


def _no_common_block_size(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"block_size": int(m["block_size"])}
    if m["spec"]:
        facts["backend_block_sizes"] = {name: block_rules(sizes)
                                        for name, sizes in _BACKEND_SIZES.findall(m["spec"])}
    return facts


def _aligned_block_size(m: re.Match[str]) -> JsonFacts:
    return {"block_size": int(m["block_size"]),
            "backends": [b.strip() for b in (m["backends"] or "").split(",") if b.strip()]}


def _multiple_of(m: re.Match[str]) -> JsonFacts:
    return {"backend_block_sizes": {m["backend"] or "(unnamed)": [f"MultipleOf({m['multiple']})"]}}


def _unsupported_block_size(m: re.Match[str]) -> JsonFacts:
    # vLLM < 0.7 paged-attention kernels (csrc/attention/paged_attention_v*.cu): 8, 16, 32 only.
    return {"block_size": int(m["block_size"]), "backend_block_sizes": {"PAGED_ATTENTION": [8, 16, 32]}}


def _block_size_choices(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"block_size": int(m["block_size"])}
    if m["choices"]:
        facts["backend_block_sizes"] = {"(argparse choices)": block_rules(m["choices"])}
    return facts


def _fp8_head_size(m: re.Match[str]) -> JsonFacts:
    return {"kv_cache_dtype": "fp8", "head_size_multiple": int(m["multiple"]), "platform": "cpu"}


def _fp8_cpu_isa(m: re.Match[str]) -> JsonFacts:
    return {"kv_cache_dtype": "fp8", "requires": "AVX-512 or AMX", "platform": "cpu"}


def _fp8_triton(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"kv_cache_dtype": "fp8", "requires": "SM89+"}
    if m.groupdict().get("backend"):
        facts["backend"] = m["backend"]
    if m.groupdict().get("cc"):
        facts["compute_capability"] = m["cc"]
    if m.groupdict().get("suggested"):
        facts["suggested_kv_cache_dtype"] = m["suggested"]
    return facts


def _kv_dtype_choice(m: re.Match[str]) -> JsonFacts:
    return {"kv_cache_dtype": m["value"]}


def _out_of_resource(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"resource": m["resource"].strip()}
    if m["required"]:
        facts["required_bytes"] = int(m["required"])
        facts["hardware_limit_bytes"] = int(m["limit"])
    return facts


def _kv_too_small_new(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"max_model_len": int(m["max_model_len"]), "wording": "new"}
    if m["needed"]:
        facts["needed_gib"] = float(m["needed"])
    if m["available"]:
        facts["available_gib"] = float(m["available"])
    if m["estimated"]:
        facts["estimated_max_model_len"] = int(m["estimated"])
    return facts


def _kv_too_small_old(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"max_model_len": int(m["max_model_len"]), "wording": "old"}
    if m["tokens"]:
        facts["kv_cache_tokens"] = facts["estimated_max_model_len"] = int(m["tokens"])
    return facts


_ALLOC = re.compile(r"Tried to allocate ([\d.]+) ([KMGT]?i?B)")
_CAPACITY = re.compile(r"GPU (\d+) has a total capac?ity of ([\d.]+) ([KMGT]?i?B) "
                       r"of which ([\d.]+) ([KMGT]?i?B) is free")
_PROCESS = re.compile(r"Process (\d+) has ([\d.]+) ([KMGT]?i?B) memory in use")
_THIS_PROCESS = re.compile(r"this process has ([\d.]+) ([KMGT]?i?B) memory in use")
_MAX_PROCESSES = 16


def torch_oom_details(line: str) -> JsonFacts:
    """The numbers of torch's CUDA OOM message, wherever it is embedded."""
    facts: JsonFacts = {}
    if (a := _ALLOC.search(line)):
        facts["tried_to_allocate_gib"] = _gib(a[1], a[2])
    if (c := _CAPACITY.search(line)):
        facts["gpu_index"] = int(c[1])
        facts["total_gib"] = _gib(c[2], c[3])
        facts["free_gib"] = _gib(c[4], c[5])
    holders = [{"pid": int(pid), "memory_gib": _gib(n, u)}
               for pid, n, u in _PROCESS.findall(line)[:_MAX_PROCESSES]]
    if holders:
        facts["processes"] = holders
    if (t := _THIS_PROCESS.search(line)):
        facts["this_process_gib"] = _gib(t[1], t[2])
    return facts


def _sampler_oom(m: re.Match[str]) -> JsonFacts:
    return {"phase": "sampler_warmup", "dummy_requests": int(m["num"]), **torch_oom_details(m.string)}


def _load_oom(m: re.Match[str]) -> JsonFacts:
    return {"phase": "model_load", **torch_oom_details(m.string)}


def _torch_oom(m: re.Match[str]) -> JsonFacts:
    return torch_oom_details(m.string)


def _memory_busy(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"free_gib": float(m["free"]), "total_gib": float(m["total"])}
    if m["util"]:
        facts["utilization"] = float(m["util"])
    if m["requested"]:
        facts["requested_gib"] = float(m["requested"])
    if m["device"]:
        facts["device"] = m["device"]
    return facts


_REASONS = re.compile(r"(\w+): \[([^\]]*)\]")
_CONFIG_FIELD = re.compile(r"\b(head_size|dtype|kv_cache_dtype|block_size|use_mla|use_sparse|has_sink)=([\w.]+)")


def parse_backend_reasons(text: str) -> dict[str, list[str]]:
    """'{A: [r1, r2], B: [r3]}' -> {'A': ['r1', 'r2'], 'B': ['r3']}."""
    return {name: [r.strip() for r in reasons.split(", ") if r.strip()]
            for name, reasons in _REASONS.findall(text)}


_LITERALS = {"None": None, "True": True, "False": False}


def _config_fields(text: str) -> JsonFacts:
    out: JsonFacts = {}
    for key, value in _CONFIG_FIELD.findall(text):
        out[key] = int(value) if value.isdigit() else _LITERALS.get(value, value)
    return out


def _no_backend(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"device": m["device"], "selector_config": _config_fields(m["config"] or ""),
                        "reasons": parse_backend_reasons(m["reasons"] or "")}
    if not (m["reasons"] or "").rstrip().endswith("}"):
        facts["reasons_cut"] = True      # the reasons were cut off: those read may not be all
    return facts


def _selected_backend(m: re.Match[str]) -> JsonFacts:
    backend = (m["backend"] or m["platform_backend"]).rsplit(".", 1)[-1]
    text = m["reasons"] or ""
    quoted = re.findall(r"'([^']*)'", text)
    reasons = quoted or [r.strip(" []") for r in text.split(",") if r.strip(" []")]
    return {"selected_backend": backend, "reasons": {backend: reasons} if reasons else {}}


_HF_REPO = re.compile(r"huggingface\.co/(?!api/)([\w.-]+/[\w.-]+)")


def _model_facts(m: re.Match[str]) -> JsonFacts:
    what = m["what"]
    reason = ("gated" if "ated" in what or m["status"] == "401" else
              "offline" if "Offline" in what or "LocalEntry" in what else "not_found")
    facts: JsonFacts = {"reason": reason}
    if (repo := _HF_REPO.search(m.string)) is not None:
        facts["repo"] = repo[1]
    return facts


def _died(m: re.Match[str]) -> JsonFacts:
    return {"marker": m[0][:120]}


def _kernel_sizes(m: re.Match[str]) -> JsonFacts:
    # A kernel size must divide the block size: each size is a MultipleOf rule for the block.
    facts: JsonFacts = {"backend_block_sizes": {"(kernel)": [f"MultipleOf({k})" for k in re.findall(r"\d+", m["sizes"])]}}
    if m["block_size"]:
        facts["block_size"] = int(m["block_size"])
    return facts


def _sentence(m: re.Match[str]) -> JsonFacts:
    sentence = m["sentence"].strip()
    return {"sentence": sentence, **refusals.classify(sentence)}


CONFIG_PRIORITY = 87
# A refusal's sentence that only vLLM's validation writes: named without its framing (the
# "Value error, " or the traceback lost in a paste).
_BARE_REFUSAL = re.compile(
    r"(?P<sentence>(?:Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)"
    r"|User-specified max_model_len \(\d+\) is greater than the derived max_model_len"
    r"|max_num_batched_tokens \(\d+\) (?:is smaller than max_model_len|must be greater than or equal to "
    r"max_num_seqs) \(\d+\)|Pipeline parallelism is not supported for this model"
    r"|Model architecture \w+ was supported in vLLM until)[^\[]*)")

# -- the table ---------------------------------------------------------------------------
# Priorities: kernel limit 90 > backend / dtype 85 > block size 80 > GPU busy 75
# > KV cache sizing 70 > CUDA OOM 60-65 > engine death 10 (only when nothing else explains it).

PATTERNS: tuple[Pattern, ...] = (
    Pattern("triton_out_of_resource", FailureKind.KERNEL_OUT_OF_RESOURCES, 90,
            ("out of resource", "OutOfResources"),
            re.compile(r"out of resource: (?P<resource>[\w ]+?)(?:, Required: (?P<required>\d+), "
                       r"Hardware limit: (?P<limit>\d+))?(?:[.,]|$)"),
            _out_of_resource, "triton.runtime.errors.OutOfResources (triton compiler)"),

    Pattern("no_valid_attention_backend", FailureKind.NO_ATTENTION_BACKEND, 85,
            ("No valid attention backend",),
            re.compile(r"No valid attention backend found for (?P<device>\S+) with (?P<config>.*?)\. "
                       r"Reasons: (?P<reasons>\{.*\})"),
            _no_backend, "platforms/cuda.py, platforms/rocm.py (>= 0.11)",
            re.compile(r"No valid attention backend found for (?P<device>[^\s.,]+)(?: with (?P<config>.*?)"
                       r"(?:\. Reasons: (?P<reasons>\{.*))?)?\s*$")),
    Pattern("selected_backend_invalid", FailureKind.NO_ATTENTION_BACKEND, 85,
            ("is not valid for this configuration",),
            re.compile(r"(?:Selected (?:[\w ]+ )?backend (?P<backend>\S+)|(?P<platform_backend>\w+) on \w+) is not valid "
                       r"for this configuration(?:\. Reason:|:) (?P<reasons>.*)"),
            _selected_backend, "platforms/cuda.py (--attention-backend given)",
            re.compile(r"(?:Selected (?:[\w ]+ )?backend (?P<backend>\S+)|(?P<platform_backend>\w+) on \w+) is not valid "
                       r"for this configuration(?:(?:\. Reason:|:) (?P<reasons>.*))?")),

    Pattern("cpu_fp8_head_size", FailureKind.KV_DTYPE_UNSUPPORTED, 85,
            ("FP8 KV cache requires head_size",),
            re.compile(r"FP8 KV cache requires head_size divisible by (?P<multiple>\d+) on CPU"),
            _fp8_head_size, "v1/attention/backends/cpu_attn.py"),
    Pattern("cpu_fp8_isa", FailureKind.KV_DTYPE_UNSUPPORTED, 85,
            ("FP8 KV cache on CPU requires",),
            re.compile(r"FP8 KV cache on CPU requires x86 with AVX-512 or AMX"),
            _fp8_cpu_isa, "v1/attention/backends/cpu_attn.py"),
    # 0.33+: an 8-bit KV dtype on CPU for an MLA model (vLLM 0.33.0, vllm/platforms/cpu.py:158-162)
    Pattern("cpu_mla_kv_dtype", FailureKind.KV_DTYPE_UNSUPPORTED, 85,
            ("is not supported by MLA attention on CPU",),
            re.compile(r"--kv-cache-dtype (?P<dtype>[\w.-]+) is not supported by MLA attention on CPU"),
            lambda m: {"kv_cache_dtype": m["dtype"], "platform": "cpu"}, "platforms/cpu.py (0.33+)"),
    # the cache dtype validator, inside pydantic's "Value error, " line from 0.33 (vLLM 0.33.0,
    # vllm/config/cache.py:470-474), the attention selector's before (0.11.2, attention/selector.py:86);
    # above the generic config refusal
    Pattern("invalid_kv_cache_dtype", FailureKind.KV_DTYPE_UNSUPPORTED, 88,
            ("Invalid kv_cache_dtype: ",),
            re.compile(r"Invalid kv_cache_dtype: '?(?P<dtype>[\w.-]{1,64})'?\. Valid values are"),
            lambda m: {"kv_cache_dtype": m["dtype"]}, "config/cache.py _validate_cache_dtype (0.33+), attention/selector.py"),
    # 0.33+: an explicit 16-bit KV dtype other than the model's (vLLM 0.33.0, vllm/config/vllm.py:1492-1508)
    Pattern("mismatched_16bit_kv", FailureKind.KV_DTYPE_UNSUPPORTED, 88,
            ("is incompatible with dtype=",),
            re.compile(r'kv_cache_dtype="(?P<dtype>float16|bfloat16)" is incompatible with dtype="(?P<model>\w+)"'),
            lambda m: {"kv_cache_dtype": m["dtype"], "model_dtype": m["model"]},
            "config/vllm.py _reject_mismatched_float_kv_cache (0.33+)"),
    Pattern("triton_fp8_kv", FailureKind.KV_DTYPE_UNSUPPORTED, 85,
            ("FP8 KV cache is not supported by the Triton",),
            re.compile(r"FP8 KV cache is not supported by the (?P<backend>Triton[\w ]*?) backend"
                       r"(?: on (?P<dev>.*?) \(compute capability (?P<cc>[\d.]+)\))?"
                       r"(?:.*?--kv-cache-dtype (?P<suggested>\w+))?"),
            _fp8_triton, "v1/attention/backends/triton_attn.py, mla/triton_mla.py"),
    Pattern("triton_fp8_reshape", FailureKind.KV_DTYPE_UNSUPPORTED, 85,
            ("FP8 KV cache needs native fp8e4nv",),
            re.compile(r"an FP8 KV cache needs native fp8e4nv \(SM89\+\)"),
            _fp8_triton, "v1/attention/ops/triton_reshape_and_cache_flash.py"),
    Pattern("fp8e4nv_arch", FailureKind.KV_DTYPE_UNSUPPORTED, 85,   # (second wording: triton, vllm#8641)
            ("fp8e4nv not supported", "fp8e4nv data type is not supported"),
            re.compile(r"type fp8e4nv not supported in this architecture"
                       r"|fp8e4nv data type is not supported on CUDA arch < 89"),
            _fp8_triton, "triton compiler on < SM89"),
    Pattern("fp8_kv_not_supported", FailureKind.KV_DTYPE_UNSUPPORTED, 84,
            ("FP8 KV cache not", "FP8 KV cache requires FA", "FP8 KV cache is not yet supported"),
            re.compile(r"(?P<backend>[\w-]+(?: V1)?) with FP8 KV cache not (?:yet )?supported"
                       r"|FP8 KV cache requires FA3|FP8 KV cache is not yet supported with KV transfer"),
            lambda m: {"kv_cache_dtype": "fp8"}, "flash_attn.py, flashattn_mla.py, platforms/cpu.py"),
    Pattern("kv_cache_dtype_choice", FailureKind.KV_DTYPE_UNSUPPORTED, 84,
            ("--kv-cache-dtype: invalid choice",),
            re.compile(r"--kv-cache-dtype: invalid choice: '?(?P<value>[\w.-]+)'?"),
            _kv_dtype_choice, "argparse"),

    Pattern("no_common_block_size", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("No common block size",),
            re.compile(r"No common block size for (?P<block_size>\d+)(?: \((?P<spec>.*)\))?"),
            _no_common_block_size, "v1/worker/utils.py (0.30+)"),
    Pattern("aligned_block_size", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("Aligned KV cache block size",),
            re.compile(r"Aligned KV cache block size (?P<block_size>\d+) is not supported by "
                       r"attention backend\(s\): (?P<backends>[\w, ]+)"),
            _aligned_block_size, "platforms/interface.py",
            re.compile(r"Aligned KV cache block size (?P<block_size>\d+) is not supported by "
                       r"attention backend(?:\(s\): (?P<backends>[\w, ]+))?")),
    Pattern("block_size_multiple", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("multiple of",),
            re.compile(r"(?:(?P<backend>[A-Z][\w]*) requires )?[Bb]lock[ _]size (?:must be|to be) "
                       r"a multiple of (?P<multiple>\d+)"),
            _multiple_of, "v1/attention/backends/flash_attn.py (0.8), flex_attention.py"),
    Pattern("unsupported_block_size", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("Unsupported block size",),
            re.compile(r"Unsupported block size: (?P<block_size>\d+)"),
            _unsupported_block_size, "csrc/attention/paged_attention_v*.cu (< 0.7)"),
    Pattern("block_size_choice", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("--block-size: invalid choice",),
            re.compile(r"--block-size: invalid choice: '?(?P<block_size>\d+)'? \(choose from (?P<choices>[^)]*)\)"),
            _block_size_choices, "argparse (<= 0.6, --block-size had choices)",
            re.compile(r"--block-size: invalid choice: '?(?P<block_size>\d+)'?(?: \(choose from (?P<choices>[^)]*)\))?")),

    Pattern("free_memory_on_startup", FailureKind.GPU_MEMORY_BUSY, 75,
            ("on startup is less than",),
            re.compile(r"Free memory on device(?: (?P<device>\S+))? \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) "
                       r"on startup is less than (?:desired GPU memory utilization|the engine's budget after excluding "
                       r"external process's weights) "
                       r"\((?P<util>[\d.]+), (?P<requested>[\d.]+) GiB\)"),
            _memory_busy, "v1/worker/utils.py",
            re.compile(r"Free memory on device(?: (?P<device>\S+))? \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) "
                       r"on startup is less than(?: (?:desired GPU memory utilization|the engine's budget[^(]*) "
                       r"\((?P<util>[\d.]+), (?P<requested>[\d.]+) GiB\))?")),

    Pattern("kv_cache_too_small", FailureKind.KV_CACHE_TOO_SMALL, 70,
            ("To serve at least one request",),
            re.compile(r"To serve at least one request with the models?'s max seq len \((?P<max_model_len>\d+)\), "
                       r"\((?P<needed>[\d.]+) GiB KV cache is needed, which is larger than the available KV "
                       r"cache memory \((?P<available>[\d.]+) GiB\)\.(?: Based on the available memory, the "
                       r"estimated maximum model length is (?P<estimated>\d+)\.)?"),
            _kv_too_small_new, "v1/core/kv_cache_utils.py (0.9+)",
            re.compile(r"To serve at least one request with the models?'s max seq len \((?P<max_model_len>\d+)\)"
                       r"(?:, \((?P<needed>[\d.]+) GiB KV cache is needed(?:, which is larger than the available KV "
                       r"cache memory \((?P<available>[\d.]+) GiB\))?)?(?P<estimated>)")),
    Pattern("kv_cache_too_small_old", FailureKind.KV_CACHE_TOO_SMALL, 70,
            ("maximum number of tokens that can be stored", "is larger than the maximum number of tokens"),
            re.compile(r"The model's max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number "
                       r"of tokens that can be stored in KV cache \((?P<tokens>\d+)\)"),
            _kv_too_small_old, "worker/worker.py, v1 kv_cache_utils.py (< 0.9)",
            re.compile(r"The model's max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number "
                       r"of tokens(?: that can be stored in KV cache \((?P<tokens>\d+)\))?")),

    Pattern("mamba_cache_too_small", FailureKind.MAMBA_CACHE_TOO_SMALL, 72,
            ("exceeds available Mamba cache blocks",),
            re.compile(r"max_num_seqs \((?P<max_num_seqs>\d+)\) exceeds available Mamba cache blocks "
                       r"\((?P<blocks>\d+)\)"),
            lambda m: {"max_num_seqs": int(m["max_num_seqs"]),
                       **({"mamba_blocks": int(m["blocks"])} if m["blocks"] else {})},
            "config/compilation.py (0.32: full CUDA graphs of a Mamba hybrid)",
            re.compile(r"max_num_seqs \((?P<max_num_seqs>\d+)\) exceeds available Mamba cache blocks"
                       r"(?: \((?P<blocks>\d+)\))?")),
    Pattern("no_cache_blocks", FailureKind.NO_KV_CACHE_MEMORY, 70,
            ("No available memory for the cache blocks",),
            re.compile(r"No available memory for the cache blocks"),
            _no_facts, "v1/core/kv_cache_utils.py, worker/worker.py (all versions)"),
    Pattern("auto_fit_no_memory", FailureKind.NO_KV_CACHE_MEMORY, 70,
            ("Cannot auto-fit max_model_len",),
            re.compile(r"Cannot auto-fit max_model_len: not enough GPU memory"),
            _no_facts, "v1/core/kv_cache_utils.py (--max-model-len auto)"),

    Pattern("sampler_warmup_oom", FailureKind.CUDA_OOM, 65,
            ("warming up sampler",),
            re.compile(r"CUDA out of memory occurred when warming up sampler with (?P<num>\d+) dummy requests"),
            _sampler_oom, "v1/worker/gpu_model_runner.py"),
    Pattern("model_load_oom", FailureKind.CUDA_OOM, 62,
            ("Failed to load model - not enough GPU memory",),
            re.compile(r"Failed to load model - not enough GPU memory"),
            _load_oom, "v1/worker/gpu_model_runner.py"),
    Pattern("torch_cuda_oom", FailureKind.CUDA_OOM, 60,
            ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory"),
            re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
            _torch_oom, "torch"),
    # The same exhaustion in other words: the CUDA driver (a custom op repacking weights, e.g.
    # gptq_marlin_repack), ROCm's HIP and Intel's XPU builds.
    Pattern("device_oom_other", FailureKind.CUDA_OOM, 60,
            ("driver error: out of memory", "HIP out of memory", "HIP error: out of memory",
             "XPU out of memory", "OUT_OF_DEVICE_MEMORY", "hipErrorOutOfMemory"),
            re.compile(r"(?:CUDA|cuda) driver error: out of memory|HIP (?:error: )?out of memory"
                       r"|XPU out of memory|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|hipErrorOutOfMemory"),
            _torch_oom, "CUDA driver (c10 CUDA_DRIVER_CHECK), torch HIP/XPU allocators"),

    # -- failures no flag fixes (failure_kinds.ALWAYS_FATAL), and the LoRA rank (--max-lora-rank) --
    Pattern("lora_rank_above_max", FailureKind.LORA_RANK_TOO_LARGE, 86,
            ("is greater than max_lora_rank",),
            re.compile(r"LoRA rank (?P<rank>\d+) is greater than max_lora_rank (?P<max>\d+)"),
            lambda m: {"lora_rank": int(m["rank"]), **({"max_lora_rank": int(m["max"])} if m["max"] else {})},
            "lora/peft_helper.py validate_legal (all releases)",
            re.compile(r"LoRA rank (?P<rank>\d+) is greater than max_lora_rank(?: (?P<max>\d+))?")),
    Pattern("no_kernel_image", FailureKind.NO_KERNEL_IMAGE, 88,
            ("no kernel image is available", "invalid device function", "is not compatible with the current PyTorch"),
            re.compile(r"no kernel image is available for execution on the device|HIP error: invalid device function"
                       r"|with CUDA capability (?P<sm>sm_\d+a?) is not compatible with the current PyTorch"),
            lambda m: {"capability": m["sm"]} if m["sm"] else {},
            "CUDA runtime (cudaErrorNoKernelImageForDevice) via torch; torch/cuda/__init__.py's warning"),
    Pattern("jit_toolchain_missing", FailureKind.JIT_TOOLCHAIN_MISSING, 86,
            ("nvcc", "inja"),
            re.compile(r"Could not find nvcc|nvcc: not found|No such file or directory: '(?:[^']*/)?(?P<tool>nvcc|ninja)'"
                       r"|Ninja is required to load C\+\+ extensions|ninja: not found|nvcc not found"),
            lambda m: {"tool": m["tool"] or ("ninja" if "inja" in m[0] else "nvcc")},
            "flashinfer/jit (cpp_ext.py, env.py), torch.utils.cpp_extension"),
    Pattern("compile_failed", FailureKind.COMPILE_FAILED, 55,
            ("LoweringException", "InductorError", "BackendCompilerFailed", "CompilationError"),
            re.compile(r"(?:torch\._inductor\.exc\.)?(?P<error>LoweringException|InductorError"
                       r"|BackendCompilerFailed|(?:triton\.compiler\.errors\.)?CompilationError):(?: |$)"),   # the exception, not its raise
            lambda m: {"error": m["error"].rsplit(".", 1)[-1]},
            "torch._inductor.exc, torch._dynamo.exc, triton.compiler.errors"),
    Pattern("tool_parser_unknown", FailureKind.TOOL_PARSER_UNKNOWN, 89,
            ("invalid tool call parser", "--tool-call-parser: invalid choice"),
            re.compile(r"invalid tool call parser: '?(?P<parser>[^\s']+)'? \(cho(?:o)?se from (?P<choices>[^)]*)\)"
                       r"|--tool-call-parser: invalid choice: '(?P<choice>[^']+)'(?: \(choose from (?P<choices2>[^)]*)\))?"),
            lambda m: {"tool_call_parser": m["parser"] or m["choice"]},
            "entrypoints/openai/api_server.py, entrypoints/common/cli_args.py validate_parsed_serve_args; "
            "argparse choices (< 0.8)"),
    Pattern("placement_group_unavailable", FailureKind.PLACEMENT_GROUP_UNAVAILABLE, 86,
            ("Cannot provide a placement group", "Ray does not allocate any GPUs",
             "exceeds the total number of available GPUs in the placement group"),
            re.compile(r"Cannot provide a placement group (?:requiring (?P<gpus>[\d.]+) GPUs|of )"
                       r"|Ray does not allocate any GPUs on the driver node"
                       r"|The number of required GPUs exceeds the total number of available GPUs in the placement group"),
            lambda m: {"gpus": float(m["gpus"])} if m["gpus"] else {},
            "executor/ray_utils.py, v1/executor/ray_utils.py _wait_until_pg_ready / initialize_ray_cluster"),
    Pattern("nccl_error", FailureKind.NCCL_ERROR, 50,
            ("NCCL error", "ncclInternalError", "ncclUnhandledCudaError", "ncclSystemError", "ncclRemoteError"),
            re.compile(r"NCCL error:? (?P<what>[\w ]+?)(?: \(|[.,]|$)|(?P<code>nccl(?:Internal|UnhandledCuda|System|Remote)Error)"),
            lambda m: {"nccl": (m["what"] or m["code"] or "").strip()},
            "distributed/device_communicators/pynccl_wrapper.py NCCL_CHECK; torch ProcessGroupNCCL"),
    Pattern("port_in_use", FailureKind.PORT_IN_USE, 86,
            ("ddress already in use", "EADDRINUSE"),
            re.compile(r"(?:error while attempting to bind on address \('(?P<host>[^']*)', (?P<port>\d+)\): )?"
                       r"\[?(?:[Ee]rrno 98\]? )?[Aa]ddress already in use|EADDRINUSE"),
            lambda m: {"port": int(m["port"]), "host": m["host"]} if m["port"] else {},
            "uvicorn / asyncio create_server, entrypoints/openai/api_server.py create_server_socket, "
            "torch TCPStore"),
    Pattern("model_unavailable", FailureKind.MODEL_UNAVAILABLE, 86,
            ("GatedRepoError", "gated repo", "401 Client Error", "RepositoryNotFoundError", "Repository Not Found",
             "404 Client Error", "Invalid repository ID or local directory", "LocalEntryNotFoundError",
             "OfflineModeIsEnabled", "is not a valid model identifier"),
            re.compile(r"(?P<what>GatedRepoError|Cannot access gated repo|You are trying to access a gated repo"
                       r"|(?P<status>401|404) Client Error|RepositoryNotFoundError|Repository Not Found"
                       r"|Invalid repository ID or local directory|LocalEntryNotFoundError|OfflineModeIsEnabled"
                       r"|is not a local folder and is not a valid model identifier)"),
            lambda m: _model_facts(m),
            "huggingface_hub.errors via transformers/vllm transformers_utils/config.py; "
            "vllm transformers_utils/config.py (Invalid repository ID)"),
    Pattern("architecture_unsupported", FailureKind.CONFIG_REFUSED, 87,
            ("are not supported for now", "is not supported for now"),
            re.compile(r"(?P<sentence>Model architectures? \[.*?\] (?:are|is) not supported for now\.?)"),
            lambda m: {"sentence": m["sentence"], **refusals.classify(m["sentence"])},
            "model_executor/models/registry.py _raise_for_unsupported (all releases)"),
    # The CPU's conv prepack refusing a weight: any conv not 4 wide (0.22-0.31), or a float32 one
    # (Kimi Delta Attention's, 0.29-0.30); refusals.classify names which
    Pattern("cpu_conv_prepack", FailureKind.CONFIG_REFUSED, 87,
            ("causal_conv1d_weight_pack: support only width", "causal_conv1d_fwd_kernel_impl\" not implemented"),
            re.compile(r"(?P<sentence>causal_conv1d_weight_pack: support only width of \d+"
                       r"|\"causal_conv1d_fwd_kernel_impl\" not implemented for 'Float')"),
            lambda m: {"sentence": m["sentence"], **refusals.classify(m["sentence"])},
            "the CPU conv kernel via model_executor/layers/utils.py dispatch_cpu_unquantized_gemm "
            "(vllm_releases/kv_layout.py CPU_CONV_PREPACK, CPU_CONV_PREPACK_FLOAT_REFUSED)"),
    Pattern("config_sentence", FailureKind.CONFIG_REFUSED, CONFIG_PRIORITY,
            ("must be divisible by tensor parallel size", "is greater than the derived max_model_len",
             "is smaller than max_model_len", "must be greater than or equal to max_num_seqs",
             "Pipeline parallelism is not supported for this model", "was supported in vLLM until"),
            _BARE_REFUSAL, _sentence, "config/model.py, config/scheduler.py (the sentence alone)"),
    Pattern("kernel_block_size_divide", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("None of the kernel sizes",),
            re.compile(r"None of the kernel sizes \[(?P<sizes>[\d, ]*)\] can divide physical block size "
                       r"(?P<block_size>\d+)"),
            _kernel_sizes, "v1/worker/utils.py select kernel block size (0.18+; Ascend's kernels: 128)",
            re.compile(r"None of the kernel sizes \[(?P<sizes>[\d, ]*)\](?: can divide physical block size"
                       r"(?: (?P<block_size>\d+))?)?")),
    Pattern("flashinfer_page_size", FailureKind.BLOCK_SIZE_UNSUPPORTED, 80,
            ("numTokensPerPage <= 128", "failed to dispatch page size"),
            re.compile(r"numTokensPerPage <= (?P<max>\d+)|failed to dispatch page size (?P<page>\d+)"),
            lambda m: {"backend": "FLASHINFER", **({"max_page_size": int(m["max"])} if m["max"] else {}),
                       **({"block_size": int(m["page"])} if m["page"] else {})},
            "flashinfer csrc/trtllm_fmha_kernel_launcher.cu, prefill dispatch (a kernel's own page-size limit)"),

    Pattern("engine_dead", FailureKind.ENGINE_DIED, 10,
            ("EngineDeadError", "EngineCore encountered an issue", "died unexpectedly",
             "exited unexpectedly"),
            re.compile(r"EngineDeadError|EngineCore encountered an issue|engine core exited unexpectedly"
                       r"|Engine core proc \S+ died unexpectedly|Worker proc \S+ died unexpectedly"),
            _died, "v1/engine/exceptions.py, core_client.py, multiproc_executor.py"),
)

# vLLM's refusals of its configuration (diagnosis/refusals.py). Not in PATTERNS: the scanner runs
# them itself, because a pydantic field error names its field on the line before, and a plain
# ValueError is a refusal only when the frame that raised it is vLLM's configuration code.


def _value_error(m: re.Match[str]) -> JsonFacts:
    return {"sentence": m["sentence"], **refusals.classify(m["sentence"])}


CONFIG_VALUE_ERROR = Pattern("config_value_error", FailureKind.CONFIG_REFUSED, CONFIG_PRIORITY,
                             ("Value error, ",), refusals.VALUE_ERROR_LINE, _value_error,
                             "pydantic model validators of vllm/config/*.py")
CONFIG_FIELD_ERROR = Pattern("config_field_error", FailureKind.CONFIG_REFUSED, CONFIG_PRIORITY,
                             ("[type=",), refusals.FIELD_ERROR_LINE, _no_facts,
                             "pydantic Field constraints of vllm/config/*.py")
CONFIG_EXCEPTION = Pattern("config_exception", FailureKind.CONFIG_REFUSED, CONFIG_PRIORITY,
                           (), refusals.CONFIG_EXCEPTION, _value_error,
                           "ValueError raised in vllm/config/*.py or engine/arg_utils.py")
CONFIG_KEYWORDS: tuple[str, ...] = ("Value error, ", "[type=", "validation error", 'File "')
# A traceback starts, or continues with the exception its handler raised (same chain).
TRACEBACK_START = "Traceback (most recent call last)"
CHAIN_MARKERS: tuple[str, ...] = ("The above exception was the direct cause", "During handling of the above exception")

# Lines that wrap a root cause printed elsewhere: never a diagnosis by themselves.
WRAPPERS: tuple[tuple[str, str], ...] = (
    ("Engine core initialization failed", "engine_core_initialization_failed"),
    ("EngineCore failed to start", "engine_core_failed_to_start"),
    ("Worker failed with error", "worker_failed"),
    ("WorkerProc hit an exception", "worker_exception"),
    ("EngineCore hit an exception", "engine_core_exception"),
    ("Got fatal signal from worker processes", "fatal_signal"),
    ("original error:", "original_error"),
)

# The engine reached READY (so a later crash is a death, not a startup failure).
READY_MARKERS: tuple[str, ...] = ("Application startup complete", "Starting vLLM API server")
# A new engine run starts: what came before belongs to an earlier run.
RUN_START_MARKERS: tuple[str, ...] = ("non-default args:", "vLLM API server version")

# Context: the engine's own account of its settings (facts["context"]).
CONTEXT_PATTERNS: tuple[tuple[str, re.Pattern[str], str, Callable[[str], Any]], ...] = (
    ("kv_cache_dtype=", re.compile(r"\bkv_cache_dtype=(\w+)"), "kv_cache_dtype", str),
    ("'kv_cache_dtype': ", re.compile(r"'kv_cache_dtype': '(\w+)'"), "kv_cache_dtype", str),
    ("'block_size': ", re.compile(r"'block_size': (\d+)"), "block_size", int),
    ("'gpu_memory_utilization': ", re.compile(r"'gpu_memory_utilization': ([\d.]+)"),
     "gpu_memory_utilization", float),
    ("'max_num_seqs': ", re.compile(r"'max_num_seqs': (\d+)"), "max_num_seqs", int),
    ("Setting kv cache block size to", re.compile(r"Setting kv cache block size to (\d+)"), "block_size", int),
    ("Using max model len", re.compile(r"Using max model len (\d+)"), "max_model_len", int),
    ("attention backend out of potential", re.compile(r"Using (\w+) attention backend out of potential"),
     "attention_backend", str),
    (KV_TOKENS_MARKER, KV_TOKENS, "kv_cache_tokens", kv_tokens_of),
)

# The profile's figure for the KV cache, when it is below zero (V1 0.x and V0 wordings): a log cut off
# before vLLM's raise still names the failure by it.
NEGATIVE_KV_KEYWORDS: tuple[str, ...] = ("Available KV cache memory:", "reserved for KV Cache is")
NEGATIVE_KV = re.compile(r"(?:Available KV cache memory:|the rest of the memory reserved for KV Cache is)\s*"
                         r"(-\d+(?:\.\d+)?)\s*GiB")

# A line that looks like an exception: kept as the evidence of an unknown failure.
EXCEPTION_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception|Interrupt): \S|\bAssertionError\s*$")
EXCEPTION_KEYWORDS: tuple[str, ...] = ("Error: ", "Exception: ", "AssertionError")

# Everything the prefilter looks for, each keyword -> what may match behind it.
ROOT_KEYWORDS: tuple[str, ...] = tuple(dict.fromkeys(k for p in PATTERNS for k in p.keywords))
