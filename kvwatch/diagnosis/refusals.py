"""vLLM's refusals of its own configuration, as data: which sentence, what it says, whether a flag fixes it.

vLLM validates its configuration before it loads anything: pydantic dataclasses
(`config/model.py`, `config/cache.py`, `config/scheduler.py`, `config/parallel.py`,
`config/vllm.py`) and `engine/arg_utils.py`. A refusal reaches the log in one of three shapes:

    pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
      Value error, User-specified max_model_len (300000) is greater than ... [type=value_error, ...]

    pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig
    gpu_memory_utilization
      Input should be less than or equal to 1 [type=less_than_equal, input_value=1.5, input_type=float]

    ValueError: <sentence>          (raised in a frame under vllm/config/ or engine/arg_utils.py)

The header line is a wrapper; the sentence is the evidence. classify() names the refusal the
sentence is; a refusal whose name is in FIXABLE has a remedy (diagnosis/remedies.py), every
other one ends the watchdog at once (no flag kvwatch may change fixes it).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.diagnosis.facts import JsonFacts
from kvwatch.vllm_releases.kv_layout import (
    CPU_CONV_PREPACK_FLOAT_REFUSED,
    CPU_CONV_PREPACK_NO_FLAG,
    CPU_CONV_PREPACK_REFUSED,
    KDA_CUTLASS_AT_MODEL_INIT,
    cpu_conv_prepack_releases,
)

# Lines as pydantic prints them, after an optional vLLM process prefix "(EngineCore pid=N) ".
_PREFIX = r"^(?:\([A-Za-z_][\w.-]*(?: rank=\d+)? pid=\d+\) )*"
VALUE_ERROR_LINE = re.compile(_PREFIX + r"\s*Value error, (?P<sentence>.+?)(?: \[type=\w+.*\])?\s*$")
FIELD_ERROR_LINE = re.compile(_PREFIX + r"\s+(?P<sentence>(?:Input|Value|Extra inputs|Field required)\b.*?)"
                              r"(?: \[type=(?P<type>\w+)(?:, input_value=(?P<value>.*?))?"
                              r"(?:, input_type=\w+)?\])?\s*$")
FIELD_NAME_LINE = re.compile(_PREFIX + r"(?P<field>[A-Za-z_][\w.]*)\s*$")
VALIDATION_HEADER = re.compile(r"ValidationError: \d+ validation errors? for (?P<config>\w+)")
# A frame of vLLM's configuration code, or of the transformers config class vLLM loads config.json
# through (vLLM 0.32.0, vllm/transformers_utils/config.py:399): an exception raised there is a refusal
# of the configuration.
CONFIG_FRAME = re.compile(r'File "[^"]*/(?:vllm/(?:config(?:/\w+)?|engine/arg_utils)'
                          r'|transformers/models/\w+/configuration_\w+)\.py", line \d+')
CONFIG_EXCEPTION = re.compile(_PREFIX + r"(?:\w+\.)*(?:ValueError|NotImplementedError|TypeError|ZeroDivisionError): "
                              r"(?P<sentence>.+)$")


def _num(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() else value


@dataclass(frozen=True)
class Refusal:
    name: str
    regex: re.Pattern[str]
    extract: Callable[[re.Match[str]], JsonFacts]
    source: str
    help: str = ""           # what the operator can do when kvwatch may not


def _max_model_len(m: re.Match[str]) -> JsonFacts:
    facts: JsonFacts = {"max_model_len": int(m["max_model_len"]), "derived_key": m["key"],
                    "derived_max_model_len": int(float(m["derived"]))}
    if m["model_max_length"] not in (None, "None"):
        try:
            facts["model_max_length"] = int(float(m["model_max_length"]))
        except ValueError:
            pass
    return facts


REFUSALS: tuple[Refusal, ...] = (
    Refusal("max_model_len_above_derived",
            re.compile(r"User-specified max_model_len \((?P<max_model_len>\d+)\) is greater than the derived "
                       r"max_model_len \((?P<key>[\w.]+)=(?P<derived>[\d.]+) or model_max_length="
                       r"(?P<model_max_length>[\w.]+)"),
            _max_model_len, "config/model.py _get_and_verify_max_len"),
    Refusal("max_num_batched_tokens_below_max_model_len",
            re.compile(r"max_num_batched_tokens \((?P<max_num_batched_tokens>\d+)\) is smaller than "
                       r"max_model_len \((?P<max_model_len>\d+)\)"),
            lambda m: {"max_num_batched_tokens": int(m[1]), "max_model_len": int(m[2])},
            "config/scheduler.py verify_max_model_len (chunked prefill off)"),
    Refusal("max_num_batched_tokens_below_max_num_seqs",
            re.compile(r"max_num_batched_tokens \((?P<max_num_batched_tokens>\d+)\) must be greater than or "
                       r"equal to max_num_seqs \((?P<max_num_seqs>\d+)\)"),
            lambda m: {"max_num_batched_tokens": int(m[1]), "max_num_seqs": int(m[2])},
            "config/scheduler.py verify_max_model_len"),
    # 0.34: the extensible KV cache asked for where it cannot be (vLLM 0.34.0, vllm/config/vllm.py:3263)
    Refusal("extensible_kv_cache_unsupported",
            re.compile(r"enable_extensible_kv_cache: (?P<why>.{1,300}?)\.?$"),
            lambda m: {"why": m["why"]}, "config/vllm.py _resolve_extensible_kv_cache (0.34+)",
            "drop --enable-extensible-kv-cache (vLLM then sizes the cache from its profile)"),
    Refusal("tensor_parallel_size_not_dividing_heads",
            re.compile(r"Total number of attention heads \((?P<heads>\d+)\) must be divisible by tensor "
                       r"parallel size \((?P<tp>\d+)\)"),
            lambda m: {"num_attention_heads": int(m[1]), "tensor_parallel_size": int(m[2])},
            "config/model.py verify_with_parallel_config",
            "choose a --tensor-parallel-size that divides the number of attention heads "
            "(kvwatch does not change how many GPUs an engine uses)"),
    Refusal("pipeline_parallel_not_supported",
            re.compile(r"Pipeline parallelism is not supported for this model"),
            lambda m: {}, "config/model.py verify_with_parallel_config",
            "this model runs without --pipeline-parallel-size (use tensor parallelism)"),
    Refusal("architecture_not_supported",
            re.compile(r"Model architectures (?P<architectures>\[.*?\]) (?:are|is) not supported"),
            lambda m: {"architectures": m["architectures"]}, "model_executor/models/registry.py",
            "this vLLM version has no implementation of the model's architecture: another vLLM version "
            "or a supported checkpoint"),
    Refusal("architecture_no_longer_supported",
            re.compile(r"Model architecture (?P<architecture>\w+) was supported in vLLM until "
                       r"v(?P<last_release>[\w.]+), and is not supported anymore"),
            lambda m: {"architecture": m["architecture"], "last_release": m["last_release"]},
            "model_executor/models/registry.py _raise_for_unsupported (_PREVIOUSLY_SUPPORTED_MODELS)",
            "this vLLM dropped the architecture: serve it with the release the sentence names or older"),
    # Not a config check: the CPU's conv kernel refuses while the model loads, and no flag avoids
    # it (vllm_releases/kv_layout.py CPU_CONV_PREPACK); the planner predicts it as config_refused too.
    Refusal("cpu_conv_prepack_width",
            re.compile(re.escape(CPU_CONV_PREPACK_REFUSED.split(": ", 1)[1])),
            lambda m: {}, "the CPU causal_conv1d_weight_pack kernel, called from "
            "model_executor/layers/utils.py dispatch_cpu_unquantized_gemm",
            "vLLM {0} and the releases after it, up to {1}, prepack every causal-conv weight on a CPU with AMX tiles or AVX-512 BF16 for a "
            "kernel that takes a width of 4 only, whatever the dtype or quantization ({3}): no flag avoids it "
            "for a conv of another width (LFM2's is 3). Serve the model with vLLM {1} or newer, which "
            "prepacks only 4-wide bfloat16 weights ({2}), on a CPU without AVX-512 BF16, or on a GPU"
            .format(*cpu_conv_prepack_releases(), CPU_CONV_PREPACK_NO_FLAG)),
    # The same prepack meeting a float32 conv weight (Kimi Delta Attention's, on 0.29 and 0.30): the
    # kernel has no float32 path, and no flag changes that weight's dtype.
    Refusal("cpu_conv_prepack_float",
            re.compile(re.escape(CPU_CONV_PREPACK_FLOAT_REFUSED.split(": ", 1)[1])),
            lambda m: {}, "the CPU causal_conv1d_weight_pack kernel, called from "
            "model_executor/layers/utils.py dispatch_cpu_unquantized_gemm",
            f"the CPU prepacks every causal-conv weight on a CPU with AMX tiles or AVX-512 BF16 "
            f"({CPU_CONV_PREPACK_NO_FLAG}), and its kernel takes no float32 weight, which Kimi Delta "
            f"Attention's conv is: no flag avoids it. From 0.31 the model needs NVIDIA's cutlass on the CPU "
            f"as well ({KDA_CUTLASS_AT_MODEL_INIT.source}): serve it on a GPU"),
    # EXAONE's config classes list layer_types with a modulo by sliding_window_pattern (planner/layer_pattern.py)
    Refusal("layer_types_from_pattern",
            re.compile(r"unsupported operand type\(s\) for %: 'int' and '(?P<pattern_type>str|NoneType)'"
                       r"|integer modulo by zero"),
            lambda m: {"pattern_type": m["pattern_type"] or "0"},
            "transformers' Exaone4Config / ExaoneMoeConfig __post_init__, reached from "
            "transformers_utils/config.py get_config",
            "config.json has no layer_types and a sliding_window_pattern (or sliding_window) the config class "
            "cannot take a modulo by: list layer_types in config.json, or give the pattern as the period of "
            "its full layers (\"LLLG\" is 4) with a sliding_window"),
    Refusal("unknown_dtype",
            re.compile(r"Unknown dtype: '?(?P<dtype>[\w.]+)'?"),
            lambda m: {"dtype": m["dtype"]}, "config/model.py _get_and_verify_dtype"),
)

# Pydantic's field constraints: "Input should be <relation> <limit>".
_FIELD_LIMIT = re.compile(r"Input should be (?P<relation>greater than or equal to|greater than|less than or "
                          r"equal to|less than) (?P<limit>-?[\d.]+)")

# The refusals a flag change fixes (diagnosis/remedies.py has the change for each).
FIXABLE = frozenset({
    "max_model_len_above_derived",
    "max_num_batched_tokens_below_max_model_len",
    "max_num_batched_tokens_below_max_num_seqs",
    "field:gpu_memory_utilization",
    "field:block_size",
    "extensible_kv_cache_unsupported",
})
_GENERIC_HELP = "a setting vLLM refuses that kvwatch has no remedy for: change the command as the sentence says"


def classify(sentence: str) -> JsonFacts:
    """The refusal a sentence of vLLM's validation is, with the numbers it names."""
    for refusal in REFUSALS:
        m = refusal.regex.search(sentence)
        if m is not None:
            try:
                facts = refusal.extract(m)
            except (ValueError, IndexError, TypeError):
                facts = {}
            return {"refusal": refusal.name, **facts}
    return {"refusal": "other"}


def field_error_facts(field: str | None, m: re.Match[str]) -> JsonFacts:
    """JsonFacts of a pydantic field error ("gpu_memory_utilization" / "Input should be ... [type=...]")."""
    facts: JsonFacts = {"refusal": f"field:{field}" if field else "field", "sentence": m["sentence"]}
    if field:
        facts["field"] = field
    if m["type"]:
        facts["constraint"] = m["type"]
    if (limit := _FIELD_LIMIT.search(m["sentence"])) is not None:
        facts["relation"] = limit["relation"]
        facts["limit"] = _num(limit["limit"])
    if m["value"] is not None:
        try:
            facts["value"] = _num(m["value"])
        except ValueError:
            facts["value"] = m["value"][:200]
    return facts


def is_fixable(refusal: str | None) -> bool:
    return refusal in FIXABLE


def help_for(refusal: str | None) -> str:
    named = next((r for r in REFUSALS if r.name == refusal), None)
    return (named.help if named is not None and named.help else _GENERIC_HELP)
