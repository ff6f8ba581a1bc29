#!/usr/bin/env python3
"""Oracles from vLLM's own code: run each unpacked release's pure functions on this CPU and compare
them with kvwatch's data on a table of inputs.

    python scripts/check_release_functions.py [SRC_ROOT] [--write FIXTURE] [--only CHECK,...]

SRC_ROOT holds one unpacked wheel per release, SRC_ROOT/<version>/vllm/... (default: the
KVWATCH_VLLM_SRC environment variable). Nothing of vLLM is installed or copied: each function is
compiled from the release's file and run with stubs for what it reaches outside itself (the current
platform: the card asked about; the enums: their member names; imports of vllm modules: those stubs).

Checks, per release where the function exists:
- batch_defaults: engine/arg_utils.py get_batch_defaults (0.10: the same code inline in the V1
  default-setting method) for the API server, against vllm_releases.release_defaults.api_batch_defaults,
  on every card of CARDS and CPU world sizes;
- backend_priorities: platforms/cuda.py _get_backend_priorities (0.11+), the backends kvwatch models
  in vLLM's order, against the priorities of kvwatch's rule set for that release;
- sliding_block_size: model_executor/layers/attention/attention.py Attention.get_kv_cache_spec
  (0.20+) for a sliding-window layer with no padded page: the block it starts from, on each
  backend's kernel block sizes (kvwatch's rule for it) and block sizes in force, against
  kv_groups.sliding_block_size with that release's kv_layout rules;
- cpu_attn_kernel_blocks: v1/attention/backends/cpu_attn.py CPUAttentionBackend
  .get_supported_kernel_block_sizes (else the AttentionBackend default, v1/attention/backend.py),
  against CPU_ATTN's block sizes in kvwatch's rule set for that release.
- max_model_len, hybrid_block_size: see their functions;
- gdn_checkpoint: model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py QwenGatedDeltaNetAttention
  (0.22+): its spec's prefill checkpoint blocks and alignment, against vllm_releases/gdn_checkpoint.py;
- skip_layer_block_size: platforms/interface.py Platform._align_heterogeneous_kv_block_size (0.25+):
  the block size and skip_page_size_padded with --kv-cache-dtype-skip-layers beside fp8, against
  kv_groups.skip_layer_block_size; on pages given per token, and on MLA models' configs (one KV head
  of the latent), the spec computing its page from what the release passes it, against
  kv_groups.platform_skip_pages as the plan reads it;
- kv_groups: v1/core/kv_cache_utils.py get_kv_cache_groups (0.33: kv_cache_planning.py; 0.10: the
  groups of get_kv_cache_config) on specs built with the release's own classes, run by
  scripts/oracle_kv_groups.py in a process per release (torch needed: without it the check is
  skipped, and --write refuses), against planner/kv_groups on GROUP_CASES (among them skip layers'
  specs: fp8 layers beside bf16 ones, MLA and full, at the block the platform grew).

Any difference is printed naming the release, the check, the input and both answers, and the exit
status is 1; a known one (KNOWN_DIFFERENCES, with its reason) is printed as such and does not fail. `--write` records every result (tests/fixtures/release_oracles.json) for the test that
CI runs without the sources.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import enum
import functools
import inspect
import json
import os
import sys
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvwatch.planner.geometry import geometry_from_config  # noqa: E402
from kvwatch.planner.kv_groups import (  # noqa: E402
    Demand,
    LayerSpec,
    blocks_per_request,
    hybrid_block_size,
    kv_groups,
    layer_specs,
    pages_refused,
    platform_skip_pages,
    promote_local_layers,
    promotion_refused,
    skip_layer_block_size,
    sliding_block_size,
)
from kvwatch.planner.layers import CHUNKED, FULL, MAMBA, SLIDING  # noqa: E402
from kvwatch.planner.rules import ruleset_for  # noqa: E402
from kvwatch.values.versions import parse_version  # noqa: E402
from kvwatch.vllm_releases import KNOWN  # noqa: E402
from kvwatch.vllm_releases.defaults import DEFAULTS  # noqa: E402
from kvwatch.vllm_releases.gdn_checkpoint import GDN_CHECKPOINT_BLOCKS, gdn_checkpoint_alignment  # noqa: E402
from kvwatch.vllm_releases.hybrid_alignment import hybrid_alignment_for  # noqa: E402
from kvwatch.vllm_releases.kv_layout import (  # noqa: E402
    KV_PAGE_UNIFICATION,
    SLIDING_BLOCK_DIVIDES_PRIMARY,
    SLIDING_BLOCK_FROM_KERNEL,
    SLIDING_BLOCK_WITHIN_PRIMARY_PAGE,
    grouping_rule_for,
)
from kvwatch.vllm_releases.release_defaults import api_batch_defaults  # noqa: E402
from kvwatch.vllm_releases.skip_layer_pages import SKIP_LAYER_PAGE_ALIGNMENT  # noqa: E402

GiB = 1 << 30
FIXTURE = ROOT / "tests" / "fixtures" / "release_oracles.json"


@dataclass(frozen=True)
class Card:
    """A device as vLLM's current platform reports it (NVML's total, the name, the capability)."""
    name: str
    memory_bytes: int
    capability: tuple[int, int]


CARDS = (
    Card("NVIDIA A100-SXM4-40GB", 40_960 * 2**20, (8, 0)),
    Card("NVIDIA A100-SXM4-80GB", 81_920 * 2**20, (8, 0)),
    Card("NVIDIA L40S", 46_068 * 2**20, (8, 9)),
    Card("NVIDIA H100 80GB HBM3", 81_559 * 2**20, (9, 0)),
    Card("NVIDIA H100 NVL", 95_830 * 2**20, (9, 0)),
    Card("NVIDIA H200", 143_771 * 2**20, (9, 0)),
    Card("NVIDIA GH200 480GB", 97_871 * 2**20, (9, 0)),
    Card("NVIDIA B200", 183_359 * 2**20, (10, 0)),
    Card("NVIDIA B300", 275_040 * 2**20, (10, 3)),
    Card("NVIDIA GB10", 122_502 * 2**20, (12, 1)),
    Card("NVIDIA RTX PRO 6000 Blackwell", 97_887 * 2**20, (12, 0)),
    Card("NVIDIA GeForce RTX 5090", 32_607 * 2**20, (12, 0)),
    Card("AMD Instinct MI300X", 196_592 * 2**20, (9, 4)),
    Card("a card at the 70 GiB floor", 70 * GiB, (9, 0)),
    Card("a card just under 160 GiB", 160 * GiB - 1, (10, 0)),
    Card("a card at 160 GiB", 160 * GiB, (10, 0)),
)
CPU_WORLDS = (1, 2, 4)
CAPABILITIES = ((8, 0), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0), (12, 1))


class _Members(type):
    """An enum stand-in: any member is its own name (AttentionBackendEnum.FLASH_ATTN -> 'FLASH_ATTN')."""

    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return name


class AttentionBackendEnum(metaclass=_Members):
    pass


class UsageContext(enum.Enum):
    UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
    LLM_CLASS = "LLM_CLASS"
    API_SERVER = "API_SERVER"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"
    OPENAI_BATCH_RUNNER = "OPENAI_BATCH_RUNNER"
    ENGINE_CONTEXT = "ENGINE_CONTEXT"


class DeviceCapability(NamedTuple):
    major: int
    minor: int


class Platform:
    """The current platform as vLLM's functions ask it; anything else they ask is an error."""

    def __init__(self, card: Card | None) -> None:
        self.card = card

    def get_device_total_memory(self, device_id: int = 0) -> int:
        assert self.card is not None
        return self.card.memory_bytes

    def get_device_name(self, device_id: int = 0) -> str:
        assert self.card is not None
        return self.card.name

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return self.card is None

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        assert self.card is not None
        if isinstance(capability, tuple):
            return self.card.capability == capability
        return self.card.capability[0] * 10 + self.card.capability[1] == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        assert self.card is not None
        return self.card.capability[0] * 10 == capability // 10 * 10

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the oracle's platform stub has no {name!r}: extend it")


class Oracle:
    """Compiles single functions out of one release's files and runs them with stubs."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.stubs: dict[str, Any] = {"AttentionBackendEnum": AttentionBackendEnum, "UsageContext": UsageContext}

    def _import(self, name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if name == "vllm" or name.startswith("vllm."):
            module = types.ModuleType(name)
            for item in fromlist or ():
                if item not in self.stubs:
                    raise ImportError(f"the oracle has no stub for {name}.{item}")
                setattr(module, item, self.stubs[item])
            return module
        return builtins.__import__(name, globals_, locals_, fromlist, level)

    def function(self, rel: str, name: str, extra: dict[str, Any]) -> Callable[..., Any] | None:
        path = self.tree / rel
        if not path.exists():
            return None
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None:
            return None
        fn.decorator_list = []
        return self._compile(path, ast.Module(body=[fn], type_ignores=[]), name, extra)

    def method(self, rel: str, cls: str, name: str, extra: dict[str, Any]) -> Callable[..., Any] | None:
        """One method of one class of a release's file, compiled as a plain function (its first
        parameter, cls or self, is the caller's)."""
        path = self.tree / rel
        if not path.exists():
            return None
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        owner = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None)
        fn = next((n for n in (owner.body if owner else ()) if isinstance(n, ast.FunctionDef) and n.name == name),
                  None)
        if fn is None:
            return None
        fn.decorator_list = []
        return self._compile(path, ast.Module(body=[fn], type_ignores=[]), name, extra)

    def _compile(self, path: Path, module: ast.Module, name: str, extra: dict[str, Any]) -> Callable[..., Any]:
        ast.fix_missing_locations(module)
        scope = {"__builtins__": {**vars(builtins), "__import__": self._import}, "__name__": f"oracle.{name}", **extra}
        exec(compile(module, str(path), "exec"), scope)
        return scope[name]   # type: ignore[no-any-return]

    def inline_batch_defaults(self, extra: dict[str, Any]) -> Callable[..., Any] | None:
        """0.10: the batch defaults are inline in a method that sets them on self; run the same
        statements (from the device query to the CPU values) and return the two tables."""
        rel = "vllm/engine/arg_utils.py"
        path = self.tree / rel
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            body = fn.body
            start = next((i for i, s in enumerate(body) if isinstance(s, ast.Try)
                          and "get_device_total_memory" in ast.unparse(s)), None)
            end = next((i for i, s in enumerate(body) if isinstance(s, ast.If)
                        and ast.unparse(s.test) == "current_platform.is_cpu()"), None)
            if start is not None and end is not None and end > start:
                ret = ast.parse("return default_max_num_batched_tokens, default_max_num_seqs").body
                args = ast.parse("def f(self, world_size): pass").body[0].args   # type: ignore[attr-defined]
                new = ast.FunctionDef(name="batch_defaults", args=args, body=body[start:end + 1] + ret,
                                      decorator_list=[], returns=None, type_params=[])
                return self._compile(path, ast.Module(body=[new], type_ignores=[]), "batch_defaults", extra)
        return None


class _Self:
    """What the 0.10 inline code reads of the engine arguments."""

    def __init__(self, world: int) -> None:
        self.pipeline_parallel_size, self.tensor_parallel_size = 1, world


def check_batch_defaults(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    results = []
    inputs: list[tuple[str, Card | None, int]] = [("cuda", c, 1) for c in CARDS] + [("cpu", None, w) for w in CPU_WORLDS]
    extra = {"current_platform": Platform(None), "GiB_bytes": GiB}
    fn = oracle.function("vllm/engine/arg_utils.py", "get_batch_defaults", extra)
    inline = oracle.inline_batch_defaults(extra) if fn is None else None
    if fn is None and inline is None:
        raise SystemExit(f"{release}: no batch defaults found to run")
    for platform, card, world in inputs:
        target = fn or inline
        target.__globals__["current_platform"] = Platform(card)   # type: ignore[union-attr]
        tokens, seqs = fn(None, world) if fn is not None else inline(_Self(world), world)   # type: ignore[misc]
        vllm = [tokens[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]]
        args = {"platform": platform, "memory_bytes": card.memory_bytes if card else 0,
                "name": card.name if card else "cpu", "capability": list(card.capability) if card else None,
                "world": world}
        label = f"{card.name} ({card.memory_bytes / GiB:.2f} GiB, sm {card.capability[0]}.{card.capability[1]})" \
            if card else f"cpu, world size {world}"
        results.append({"release": release, "check": "batch_defaults", "input": label, "args": args,
                        "vllm": vllm, "kvwatch": kvwatch_batch_defaults(release, args)})
    return results


def kvwatch_batch_defaults(release: str, args: dict[str, Any]) -> list[int]:
    """kvwatch's answer for one input of the batch_defaults check."""
    cap = tuple(args["capability"]) if args["capability"] else None
    return list(api_batch_defaults(DEFAULTS[release], args["platform"], args["memory_bytes"], args["name"],
                                   cap, args["world"]))   # type: ignore[arg-type]


def kvwatch_backend_priorities(release: str, args: dict[str, Any]) -> list[str]:
    """kvwatch's answer for one input of the backend_priorities check."""
    rules = ruleset_for(release)
    attention = "mla" if args["mla"] else "full"
    return list(rules.priorities.get(("cuda", attention, args["capability"][0]))
                or rules.priorities[("cuda", attention, None)])


def check_backend_priorities(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    # the release's own is_quantized_kv_cache, wherever that release keeps it
    quantized = next((q for rel in ("vllm/v1/kv_cache_interface.py", "vllm/utils/torch_utils.py",
                                    "vllm/v1/attention/backend.py",
                                    "vllm/attention/backends/abstract.py")
                      if (q := oracle.function(rel, "is_quantized_kv_cache", {})) is not None), None)
    try:
        assert quantized is not None and quantized("fp8") and not quantized("auto")
    except (AssertionError, NameError):
        # 0.33's reaches further into kv_cache_interface (get_kv_quant_mode): for the two dtypes
        # asked about here, fp8 is quantized and auto is not, in every release
        quantized = _fp8_is_quantized
    oracle.stubs["is_quantized_kv_cache"] = quantized
    fn = oracle.function("vllm/platforms/cuda.py", "_get_backend_priorities",
                         {"AttentionBackendEnum": AttentionBackendEnum, "DeviceCapability": DeviceCapability,
                          "is_quantized_kv_cache": quantized})
    if fn is None:
        return []
    rules = ruleset_for(release)
    modelled = {b.name for b in rules.backends if b.platform == "cuda"}
    accepted = set(inspect.signature(fn).parameters)
    results = []
    for mla in (False, True):
        attention = "mla" if mla else "full"
        for cap in CAPABILITIES:
            for kv in ("auto", "fp8"):
                kwargs: dict[str, Any] = {"num_heads": 128, "kv_cache_dtype": kv, "use_non_causal": False,
                                          "head_size": 576 if mla else 128, "use_mm_prefix": False}
                kwargs = {k: val for k, val in kwargs.items() if k in accepted}
                order = fn(mla, DeviceCapability(*cap), **kwargs)
                vllm = [str(b) for b in order if str(b) in modelled]
                args = {"mla": mla, "capability": list(cap), "kv_cache_dtype": kv}
                label = f"{attention} attention, sm {cap[0]}.{cap[1]}, kv {kv}"
                results.append({"release": release, "check": "backend_priorities", "input": label, "args": args,
                                "vllm": vllm, "kvwatch": kvwatch_backend_priorities(release, args)})
    return results


class _Config:
    """A config.json as vLLM reads it from transformers' config object: its keys as attributes,
    `rope_scaling` with rope_type filled from `type` and `rope_parameters` the same (with rope_theta),
    as transformers and vLLM's patch_rope_parameters normalise them."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.__dict__.update(config)
        rope = config.get("rope_scaling")
        if isinstance(rope, dict):
            rope = {**rope, "rope_type": rope.get("rope_type", rope.get("type", "default"))}
            if rope["rope_type"] == "su":
                rope["rope_type"] = "longrope"
            self.rope_scaling = rope
            self.rope_parameters = {**rope, "rope_theta": config.get("rope_theta", 10000.0)}
        else:
            self.rope_parameters = {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0)}


class _Logger:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


class _Envs:
    VLLM_ALLOW_LONG_MAX_MODEL_LEN = False


class _LenPlatform:
    """A CUDA platform, as the max-model-len derivation asks it."""

    @staticmethod
    def check_max_model_len(max_model_len: int) -> int:
        return max_model_len

    @staticmethod
    def is_tpu() -> bool:
        return False


ALLOWED_ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "linear_attention")
_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
MAX_LEN_CONFIGS: dict[str, dict[str, Any]] = {
    "plain 32768": {**_LLAMA, "max_position_embeddings": 32768},
    "llama3 rope (prescaled)": {**_LLAMA, "max_position_embeddings": 131072,
                                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "linear rope x2": {**_LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}},
    "dynamic rope x4": {**_LLAMA, "max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 4.0}},
    "yarn x4 on 32768": {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 32768,
                         "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
    "gemma3 linear x8": {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"],
                         "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    "longrope (phi3)": {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 131072,
                        "original_max_position_embeddings": 4096,
                        "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}},
    "gpt2 n_positions": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_positions": 1024},
    "model_max_length wins": {"model_type": "cohere", "architectures": ["CohereForCausalLM"],
                              "max_position_embeddings": 131072, "model_max_length": 8192},
    "smallest key": {**_LLAMA, "max_position_embeddings": 8192, "seq_length": 4096},
    "no length key": {**_LLAMA},
}


def check_max_model_len(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """vLLM's default max_model_len for a config.json (config/model.py _get_and_verify_max_len with
    no --max-model-len; 0.14+: the derived length from the convertor's base class first)."""
    rel = next((r for r in ("vllm/config/model.py", "vllm/config/__init__.py")
                if (oracle.tree / r).exists() and "def _get_and_verify_max_len" in (oracle.tree / r).read_text()), None)
    if rel is None:
        return []
    helpers: dict[str, Any] = {"ALLOWED_ATTENTION_LAYER_TYPES": ALLOWED_ATTENTION_LAYER_TYPES,
                               "ALLOWED_LAYER_TYPES": ALLOWED_ATTENTION_LAYER_TYPES}   # transformers' constant
    for name in ("is_rope_parameters_nested", "iter_rope_parameters"):
        fn = oracle.function("vllm/transformers_utils/config.py", name, helpers)
        if fn is not None:
            helpers[name] = fn
            oracle.stubs[name] = fn
    extra = {**helpers, "logger": _Logger(), "envs": _Envs(), "current_platform": _LenPlatform(),
             "ALLOWED_LAYER_TYPES": ALLOWED_ATTENTION_LAYER_TYPES}   # transformers' constant
    verify = oracle.function(rel, "_get_and_verify_max_len", extra)
    derive = oracle.function("vllm/transformers_utils/model_arch_config_convertor.py",
                             "derive_max_model_len_and_key", {})
    assert verify is not None
    params = list(inspect.signature(verify).parameters)
    results = []
    for label, config in MAX_LEN_CONFIGS.items():
        hf = _Config(config)
        kwargs: dict[str, Any] = {"hf_config": hf, "tokenizer_config": None, "max_model_len": None,
                                  "disable_sliding_window": False, "sliding_window": None}
        if "model_arch_config" in params:
            assert derive is not None
            kwargs["model_arch_config"] = types.SimpleNamespace(
                derived_max_model_len_and_key=derive(types.SimpleNamespace(hf_text_config=hf)))
        vllm: Any
        try:
            vllm = verify(**{k: v for k, v in kwargs.items() if k in params})
        except (ValueError, NotImplementedError) as exc:   # a refusal is an answer too
            vllm = f"error: {type(exc).__name__}"
        results.append({"release": release, "check": "max_model_len", "input": label, "args": {"config": config},
                        "vllm": vllm, "kvwatch": kvwatch_max_model_len(release, {"config": config})})
    return results


def kvwatch_max_model_len(release: str, args: dict[str, Any]) -> int:
    """kvwatch's answer for one input of the max_model_len check: the plan's default max_model_len."""
    return geometry_from_config(args["config"] | _SHAPE, release).default_max_model_len


_SHAPE = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "intermediate_size": 512, "vocab_size": 1024, "torch_dtype": "bfloat16"}


def _fp8_is_quantized(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")

class MultipleOf:
    """vLLM's MultipleOf(n), as the oracle hands a backend's kernel block sizes to vLLM's code."""

    def __init__(self, base: int) -> None:
        self.base = base


class _Spec:
    """A KV cache spec whose page size is the input's (the alignment reads nothing else of it)."""

    def __init__(self, page_size_bytes: int) -> None:
        self.page_size_bytes = page_size_bytes


@dataclass(frozen=True)
class HybridCase:
    """One input of _align_hybrid_block_size: the attention backend (its kernel block sizes are
    kvwatch's rule for it), the bytes of one token's attention page and of one recurrent state,
    the block size in force, and the mamba cache mode."""
    backend: str
    attn_page_1_token: int
    mamba_page: int
    block_size: int
    mamba_cache_mode: str = "none"
    checkpoint_alignment: int | None = None   # the state layers' prefill checkpoint alignment (GDN on FlashInfer: 64)

    @property
    def label(self) -> str:
        checkpoint = f", checkpoint alignment {self.checkpoint_alignment}" if self.checkpoint_alignment else ""
        return (f"{self.backend}, attention {self.attn_page_1_token} B/token, state {self.mamba_page} B, "
                f"block {self.block_size}, mamba_cache_mode {self.mamba_cache_mode}{checkpoint}")


def _hybrid_cases() -> list[HybridCase]:
    # Pages of real hybrids: Qwen3-Next (GDN state 1,179,648 B per layer at TP 1 with 2 KV heads of 256,
    # bf16 -> 2,048 B/token), Nemotron-H / Granite-4.0-H (Mamba2, ~(4,096 B/token, 1.5 MiB)), Jamba
    # (8 KV heads of 128 -> 4,096 B/token); a small one and an MLA hybrid (576-wide latent, bf16).
    pages = ((2_048, 1_179_648), (4_096, 1_622_016), (4_096, 135_168), (512, 34_816), (1_152, 1_179_648),
             (1_024, 1_024), (8_192, 4_096))
    cases = []
    for backend, block in (("FLASH_ATTN", 16), ("FLASHINFER", 16), ("TRITON_ATTN", 16), ("CPU_ATTN", 128),
                           ("FLASH_ATTN", 64), ("FLASHINFER", 32)):
        for attn, mamba in pages[:6]:
            for mode in ("none", "align"):
                cases.append(HybridCase(backend, attn, mamba, block, mode))
    for backend, block in (("FLASHMLA", 64), ("TRITON_MLA", 16), ("CUTLASS_MLA", 128), ("FLASHINFER_MLA", 32)):
        for attn, mamba in ((1_152, 1_179_648), (1_152, 34_816), (8_192, 4_096)):
            for mode in ("none", "align"):
                cases.append(HybridCase(backend, attn, mamba, block, mode))
    # a gated delta net hybrid on FlashInfer's GDN prefill (vllm_releases/gdn_checkpoint.py): its layers
    # declare a 64-token checkpoint alignment, which vLLM reads in align mode only
    for backend, block in (("FLASH_ATTN", 16), ("FLASHINFER", 16), ("TRITON_ATTN", 16), ("FLASH_ATTN", 64),
                           ("FLASHINFER", 32), ("FLASH_ATTN", 96), ("FLASHMLA", 64)):
        for attn, mamba in pages[:6]:
            for mode in ("none", "align"):
                cases.append(HybridCase(backend, attn, mamba, block, mode, checkpoint_alignment=64))
    return cases


HYBRID_CASES = _hybrid_cases()


class _HybridConfig:
    """The VllmConfig _align_hybrid_block_size reads (and writes: block_size, mamba_page_size_padded)."""

    def __init__(self, case: HybridCase, mla: bool) -> None:
        self.cache_config = types.SimpleNamespace(
            cache_dtype="auto", block_size=case.block_size, mamba_cache_mode=case.mamba_cache_mode,
            mamba_page_size_padded=None, mamba_block_size=None, user_specified_mamba_block_size=False,
            kv_cache_dtype_skip_layers=None, calculate_kv_scales=False, enable_prefix_caching=False)
        self.model_config = types.SimpleNamespace(
            dtype="bfloat16", use_mla=mla, architecture="HybridForCausalLM", max_model_len=4096,
            get_num_kv_heads=lambda parallel: 1, get_head_size=lambda: 128, get_mamba_chunk_size=lambda: 256)
        self.parallel_config = types.SimpleNamespace(tensor_parallel_size=1)
        self.attention_config = types.SimpleNamespace(backend=None)


def _hybrid_stubs(case: HybridCase, kernel_sizes: list[Any]) -> tuple[dict[str, Any], Any]:
    import contextlib
    backend_cls = types.SimpleNamespace(get_supported_kernel_block_sizes=lambda: kernel_sizes,
                                        customize_spec=lambda spec: spec)
    model_cls = types.SimpleNamespace(get_mamba_state_shape_from_config=lambda config: (),
                                      get_mamba_state_dtype_from_config=lambda config: ())
    stubs: dict[str, Any] = {
        "set_current_vllm_config": lambda config: contextlib.nullcontext(),
        "ModelRegistry": types.SimpleNamespace(resolve_model_cls=lambda arch, model_config=None: (model_cls, arch)),
        "cdiv": lambda a, b: -(-a // b),
        "STR_DTYPE_TO_TORCH_DTYPE": {},
        "MultipleOf": MultipleOf,
        "FullAttentionSpec": lambda **kw: _Spec(case.attn_page_1_token),
        "MLAAttentionSpec": lambda **kw: _Spec(case.attn_page_1_token),
        "AttentionSpec": lambda **kw: _Spec(case.attn_page_1_token),
        "MambaSpec": lambda **kw: _Spec(case.mamba_page),
        "get_kv_quant_mode": lambda dtype: None,
        # the state layers' checkpoint alignment (0.33+ reads it in align mode)
        "get_mamba_prefill_checkpoint_alignment": lambda config: case.checkpoint_alignment,
        # 0.34: the state's byte alignment, 16 only with --use-replayssm on the FlashInfer Mamba backend
        # (vLLM 0.34.0, vllm/model_executor/layers/mamba/mamba_utils.py:31-33); the case gives the page
        "mamba_state_alignment": lambda config: 1,
        "AttentionBackendEnum": AttentionBackendEnum,
        "MambaModelConfig": types.SimpleNamespace(verify_and_update_config=lambda config: None),
        "logger": _Logger(),
        # the backend is vLLM's own choice (no VLLM_ATTENTION_BACKEND, no --attention-backend), on an SM 9.0 card
        "envs": types.SimpleNamespace(VLLM_USE_V1=True, VLLM_ATTENTION_BACKEND=None),
        "current_platform": Platform(Card("NVIDIA H100 80GB HBM3", 81_559 * 2**20, (9, 0))),
    }
    cls = types.SimpleNamespace(_find_non_ssm_backends=lambda config: [backend_cls],
                                _get_indexer_block_alignment=lambda config: 0)
    return stubs, (cls, backend_cls)


def kvwatch_hybrid_block_size(release: str, args: dict[str, Any]) -> list[int | None]:
    """kvwatch's answer for one input of the hybrid_block_size check: the block size after the
    alignment and the padded state page (None when the pages are equal)."""
    rule = ruleset_for(release).backend(args["backend"])
    assert rule is not None
    # the plan hands the checkpoint alignment on in align mode only (plan.py _gdn_checkpoint_alignment)
    checkpoint = args.get("checkpoint_alignment") if args["mamba_cache_mode"] == "align" else None
    block = hybrid_block_size(hybrid_alignment_for(release), rule, args["block_size"], args["attn_page_1_token"],
                              args["mamba_page"], rule.attention == "mla", checkpoint)
    page = block * args["attn_page_1_token"]
    return [block, page if page != args["mamba_page"] else None]


def check_hybrid_block_size(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """vLLM's hybrid block-size alignment: Platform._align_hybrid_block_size (platforms/interface.py,
    0.20+), before that HybridAttentionMambaModelConfig.verify_and_update_config (models/config.py)."""
    results = []
    for case in HYBRID_CASES:
        rule = ruleset_for(release).backend(case.backend)
        assert rule is not None
        kernel = [MultipleOf(r.base) if hasattr(r, "base") else r for r in rule.block_sizes]
        stubs, (cls, backend_cls) = _hybrid_stubs(case, kernel)
        oracle.stubs.update(stubs)
        config = _HybridConfig(case, rule.attention == "mla")
        fn = oracle.method("vllm/platforms/interface.py", "Platform", "_align_hybrid_block_size", stubs)
        if fn is not None:
            fn(cls, config, backend_cls)
        else:
            fn = oracle.method("vllm/model_executor/models/config.py", "HybridAttentionMambaModelConfig",
                               "verify_and_update_config", stubs)
            assert fn is not None, f"{release}: no hybrid alignment found"
            fn(types.SimpleNamespace(), config)
        cache = config.cache_config
        args = {"backend": case.backend, "attn_page_1_token": case.attn_page_1_token, "mamba_page": case.mamba_page,
                "block_size": case.block_size, "mamba_cache_mode": case.mamba_cache_mode}
        if case.checkpoint_alignment:
            args["checkpoint_alignment"] = case.checkpoint_alignment
        results.append({"release": release, "check": "hybrid_block_size", "input": case.label, "args": args,
                        "vllm": [cache.block_size, cache.mamba_page_size_padded],
                        "kvwatch": kvwatch_hybrid_block_size(release, args)})
    return results


# (primary, skip) bytes per token of one layer: 8 KV heads of 128 in fp8 beside bf16 (x2), a packed
# 4-bit-like primary (not a divisor of the skip page), and pages already equal
SKIP_PAGES = ((2_048, 4_096), (1_152, 4_096), (4_096, 4_096))
SKIP_CASES = [(backend, block, primary, skip, mamba)
              for backend in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN") for block in (16, 32, 64, 128)
              for primary, skip in SKIP_PAGES for mamba in (None, 1_179_648)]


# MLA models (the platform is given the model's config, its FullAttentionSpec computes the page):
# DeepSeek-V3's latent of 576 and a latent of 512, fp8 beside bf16, on the CUDA MLA backends' kernel
# sizes and the block sizes they start from.
SKIP_MLA_CASES = [(backend, block, latent)
                  for backend in ("FLASHMLA", "CUTLASS_MLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASH_ATTN_MLA")
                  for block in (16, 64, 128, 256) for latent in (576, 512)]
_DTYPE_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1}


def kvwatch_skip_layer_block_size(release: str, args: dict[str, Any]) -> list[int | None] | None:
    """kvwatch's answer: the block size, the skip layers' shared page and the padded Mamba page
    (None for a release that does not align them: vllm_releases/skip_layer_pages.py). An MLA input
    gives the latent, whose pages per token kvwatch reads as the plan does (platform_skip_pages)."""
    version = KNOWN[[str(v) for v in KNOWN].index(release)]
    if not SKIP_LAYER_PAGE_ALIGNMENT.holds(version):
        return None
    rule = ruleset_for(release).backend(args["backend"])
    assert rule is not None
    primary, skip = (platform_skip_pages(1, args["mla_latent"], 1, 2) if "mla_latent" in args
                     else (args["primary"], args["skip"]))
    return list(skip_layer_block_size(rule, args["block_size"], primary, skip, args.get("mamba_padded")))


def _page_from_spec_fields(**kw: Any) -> _Spec:
    """FullAttentionSpec(block_size=1, ...).page_size_bytes as the spec computes it: K and V of its heads
    (vLLM 0.25.1, vllm/v1/kv_cache_interface.py:196-200)."""
    return _Spec(2 * kw["block_size"] * kw["num_kv_heads"] * kw["head_size"] * _DTYPE_BYTES[kw["dtype"]])


def check_skip_layer_block_size(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """Platform._align_heterogeneous_kv_block_size (platforms/interface.py, 0.25+) with a quantized
    primary (fp8) and one skip layer, on each backend's kernel sizes (kvwatch's rule for it); a release
    without the function gives one result, None."""
    import contextlib
    results = []
    for backend, block, primary, skip, mamba in SKIP_CASES:
        rule = ruleset_for(release).backend(backend)
        assert rule is not None
        kernel = [MultipleOf(r.base) if hasattr(r, "base") else r for r in rule.block_sizes]
        backend_cls = types.SimpleNamespace(get_supported_kernel_block_sizes=lambda k=kernel: k,
                                            customize_spec=lambda spec: spec)
        stubs: dict[str, Any] = {
            "set_current_vllm_config": lambda config: contextlib.nullcontext(), "cdiv": lambda a, b: -(-a // b),
            "STR_DTYPE_TO_TORCH_DTYPE": {"fp8": "float8_e4m3fn"}, "MultipleOf": MultipleOf, "logger": _Logger(),
            "get_kv_quant_mode": lambda dtype: None,
            # the page per token: the model's dtype for the skip layers, fp8 for the primary
            "FullAttentionSpec": lambda p=primary, k=skip, **kw: _Spec(k if kw["dtype"] == "bfloat16" else p)}
        oracle.stubs.update(stubs)
        fn = oracle.method("vllm/platforms/interface.py", "Platform", "_align_heterogeneous_kv_block_size", stubs)
        if fn is None:
            return [{"release": release, "check": "skip_layer_block_size", "input": "the alignment", "args": {},
                     "vllm": None, "kvwatch": kvwatch_skip_layer_block_size(release, {})}]
        config = types.SimpleNamespace(
            cache_config=types.SimpleNamespace(cache_dtype="fp8", block_size=block, kv_cache_dtype_skip_layers=["0"],
                                               mamba_page_size_padded=mamba, skip_page_size_padded=None),
            model_config=types.SimpleNamespace(dtype="bfloat16", get_num_kv_heads=lambda parallel: 8,
                                               get_head_size=lambda: 128),
            parallel_config=types.SimpleNamespace(tensor_parallel_size=1))
        fn(types.SimpleNamespace(), config, backend_cls)
        cache = config.cache_config
        args = {"backend": backend, "block_size": block, "primary": primary, "skip": skip, "mamba_padded": mamba}
        results.append({"release": release, "check": "skip_layer_block_size",
                        "input": f"{backend}, block {block}, primary {primary} B/token, skip {skip} B/token, "
                                 f"mamba page padded {mamba}", "args": args,
                        "vllm": [cache.block_size, cache.skip_page_size_padded, cache.mamba_page_size_padded],
                        "kvwatch": kvwatch_skip_layer_block_size(release, args)})
    for backend, block, latent in SKIP_MLA_CASES:
        rule = ruleset_for(release).backend(backend)
        if rule is None:   # a backend this release does not have
            continue
        kernel = [MultipleOf(r.base) if hasattr(r, "base") else r for r in rule.block_sizes]
        backend_cls = types.SimpleNamespace(get_supported_kernel_block_sizes=lambda k=kernel: k,
                                            customize_spec=lambda spec: spec)   # dense MLA backends keep it
        oracle.stubs["FullAttentionSpec"] = _page_from_spec_fields
        fn = oracle.method("vllm/platforms/interface.py", "Platform", "_align_heterogeneous_kv_block_size",
                           {**oracle.stubs})
        assert fn is not None
        # an MLA model's config: one KV head (vLLM 0.33.0, vllm/config/model.py:1675), the latent's width
        config = types.SimpleNamespace(
            cache_config=types.SimpleNamespace(cache_dtype="fp8", block_size=block, kv_cache_dtype_skip_layers=["0"],
                                               mamba_page_size_padded=None, skip_page_size_padded=None),
            model_config=types.SimpleNamespace(dtype="bfloat16", use_mla=True, get_num_kv_heads=lambda parallel: 1,
                                               get_head_size=lambda n=latent: n),
            parallel_config=types.SimpleNamespace(tensor_parallel_size=8))
        fn(types.SimpleNamespace(), config, backend_cls)
        cache = config.cache_config
        args = {"backend": backend, "block_size": block, "mla_latent": latent}
        results.append({"release": release, "check": "skip_layer_block_size",
                        "input": f"MLA latent {latent}, {backend}, block {block}, fp8 beside bf16", "args": args,
                        "vllm": [cache.block_size, cache.skip_page_size_padded, cache.mamba_page_size_padded],
                        "kvwatch": kvwatch_skip_layer_block_size(release, args)})
    return results


_GDN_LAYER = "vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
# (capability or None for the CPU, linear key head dim, mamba cache mode, --gdn-prefill-backend)
GDN_CASES = [(card, head_k_dim, mode, asked) for card in (None, *CAPABILITIES) for head_k_dim in (128, 256)
             for mode in ("none", "align") for asked in (None, "flashinfer", "triton", "cutedsl")]
GDN_STATE_PAGE = 1_179_648   # any page answers alike: the checkpoint replaces fields, never the page


class _GdnPlatform(Platform):
    """The platform _resolve_gdn_prefill_backend asks: a CUDA card of one capability (CUDA 13, the
    runtime 0.33's wheels are built for), or the CPU."""

    device_name = "stub"

    def is_cuda(self) -> bool:
        return self.card is not None

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def get_cuda_runtime_major(self) -> int:
        return 13


@dataclass(frozen=True)
class _GdnMambaSpec:
    """The MambaSpec fields the GDN layer's get_kv_cache_spec and max_memory_usage_bytes read."""
    page_size_bytes: int
    block_size: int
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None


def _class_methods(path: Path, cls: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    owner = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None)
    return {n.name: n for n in (owner.body if owner else ()) if isinstance(n, ast.FunctionDef)}


def _module_int(path: Path, name: str) -> int | None:
    if not path.exists():
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next((n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                 and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)), None)


class _SuperCall(ast.NodeTransformer):
    """super().f(...) -> _base_f(...): a method compiled alone has no class cell for super()."""

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name) \
                and f.value.func.id == "super":
            return ast.Call(func=ast.Name(id=f"_base_{f.attr}", ctx=ast.Load()), args=node.args, keywords=node.keywords)
        return node


def _gdn_layer(release: str, oracle: Oracle, card: Card | None, head_k_dim: int, mode: str,
               asked: str | None) -> list[Any] | None:
    """Run one release's QwenGatedDeltaNetAttention on one input: [its spec's prefill checkpoint
    blocks, its prefill checkpoint alignment, the state pages one request holds
    (MambaSpec.max_memory_usage_bytes / page)]; None where the release has no such class."""
    import math
    from dataclasses import replace
    layer_path = oracle.tree / _GDN_LAYER
    if not layer_path.exists():
        return None
    methods = _class_methods(layer_path, "QwenGatedDeltaNetAttention")
    if not methods:
        return None
    config = types.SimpleNamespace(
        cache_config=types.SimpleNamespace(mamba_cache_mode=mode, mamba_block_size=544, prefix_match_unit=None,
                                           mamba_page_size_padded=None),
        scheduler_config=types.SimpleNamespace(max_num_batched_tokens=8192),
        additional_config={} if asked is None else {"gdn_prefill_backend": asked},   # arg_utils passes the flag so
        model_config=types.SimpleNamespace(hf_text_config=types.SimpleNamespace(linear_key_head_dim=head_k_dim,
                                                                                linear_value_head_dim=128)))
    layer = types.SimpleNamespace(vllm_config=config, conv_kernel_size=4, _checkpoint_alignment=None)
    stubs: dict[str, Any] = {"current_platform": _GdnPlatform(card), "logger": _Logger(), "lcm": math.lcm,
                             "replace": replace, "MambaSpec": _GdnMambaSpec, "MambaBase": object,
                             "MambaPrefillCheckpointExporter": lambda **kw: None,
                             "get_layers_from_vllm_config": lambda cfg, base: {"layer": layer},
                             "FLASHINFER_GDN_CHECKPOINT_ALIGNMENT": _module_int(
                                 oracle.tree / "vllm/v1/attention/backends/gdn_attn.py",
                                 "FLASHINFER_GDN_CHECKPOINT_ALIGNMENT")}
    oracle.stubs.update(stubs)
    init = methods.get("__init__")
    # the statement of __init__ that sets the layer's checkpoint alignment (0.33+), run alone
    setter = next((n for n in ast.walk(init) if isinstance(n, ast.If)
                   and "_checkpoint_alignment" in ast.unparse(n.body[0])), None) if init else None
    if setter is not None:
        resolve = oracle.function(_GDN_LAYER, "_resolve_gdn_prefill_backend", stubs)
        assert resolve is not None, f"{release}: no _resolve_gdn_prefill_backend"
        layer.gdn_prefill_backend = resolve(config)[1]
        body = ast.parse("def set_alignment(self, vllm_config): pass").body[0]
        assert isinstance(body, ast.FunctionDef)
        body.body = [setter]
        oracle._compile(layer_path, ast.Module(body=[body], type_ignores=[]), "set_alignment", stubs)(layer, config)
    if "get_prefill_checkpoint_alignment" in methods:
        alignment = oracle.method(_GDN_LAYER, "QwenGatedDeltaNetAttention", "get_prefill_checkpoint_alignment",
                                  stubs)
        assert alignment is not None
        layer.get_prefill_checkpoint_alignment = lambda: alignment(layer)
    else:
        layer.get_prefill_checkpoint_alignment = lambda: None
    abstract = "vllm/model_executor/layers/mamba/abstract.py"
    for name in ("get_mamba_prefill_checkpoint_alignment", "get_mamba_prefill_checkpoint_grid"):
        fn = oracle.function(abstract, name, stubs)
        if fn is not None:
            stubs[name] = oracle.stubs[name] = fn
    base = _GdnMambaSpec(page_size_bytes=GDN_STATE_PAGE, block_size=544)
    spec = base
    if "get_kv_cache_spec" in methods:   # its own spec over the base one (super() -> the base spec)
        if "_exports_checkpoints" in methods:
            exports = oracle.method(_GDN_LAYER, "QwenGatedDeltaNetAttention", "_exports_checkpoints", stubs)
            assert exports is not None
            layer._exports_checkpoints = exports(layer)
        fn_node = _SuperCall().visit(methods["get_kv_cache_spec"])
        fn_node.decorator_list = []
        spec = oracle._compile(layer_path, ast.Module(body=[fn_node], type_ignores=[]), "get_kv_cache_spec",
                               {**stubs, "_base_get_kv_cache_spec": lambda cfg: base})(layer, config)
    usage = oracle.method("vllm/v1/kv_cache_interface.py", "MambaSpec", "max_memory_usage_bytes",
                          {**stubs, "cdiv": lambda a, b: -(-a // b)})
    assert usage is not None, f"{release}: no MambaSpec.max_memory_usage_bytes"
    return [spec.num_prefill_checkpoint_blocks, layer.get_prefill_checkpoint_alignment(),
            usage(spec, config) // spec.page_size_bytes]


def kvwatch_gdn_checkpoint(release: str, args: dict[str, Any]) -> list[Any]:
    """kvwatch's answer: the plan's alignment (plan.py _gdn_checkpoint_alignment), the checkpoint
    blocks it gives the state layers, and their blocks per request (kv_groups.blocks_per_request)."""
    version = KNOWN[[str(v) for v in KNOWN].index(release)]
    capability = tuple(args["capability"]) if args["capability"] else None
    align = args["mamba_cache_mode"] == "align"
    alignment = gdn_checkpoint_alignment(version, "cuda" if capability else "cpu", capability,  # type: ignore[arg-type]
                                         args["head_k_dim"], align, args["gdn_prefill_backend"])
    blocks = GDN_CHECKPOINT_BLOCKS if alignment is not None else 0
    spec = LayerSpec(MAMBA, 544, GDN_STATE_PAGE, GDN_STATE_PAGE, checkpoint_blocks=blocks)
    return [blocks, alignment, blocks_per_request(spec, Demand(4096, 8192, mamba_align=align))]


def check_gdn_checkpoint(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """The Qwen gated delta net layer's prefill checkpoint: QwenGatedDeltaNetAttention's
    get_kv_cache_spec, get_prefill_checkpoint_alignment and the __init__ statement that sets it, with
    _resolve_gdn_prefill_backend on the card (model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py,
    0.22+; a release whose class defines neither keeps MambaBase's spec), and the release's
    MambaSpec.max_memory_usage_bytes on the spec."""
    results = []
    for capability, head_k_dim, mode, asked in GDN_CASES:
        card = Card("a CUDA card", 80 * GiB, capability) if capability else None
        answer = _gdn_layer(release, oracle, card, head_k_dim, mode, asked)
        if answer is None:
            return []
        where = f"SM {capability[0]}.{capability[1]}" if capability else "CPU"
        args = {"capability": list(capability) if capability else None, "head_k_dim": head_k_dim,
                "mamba_cache_mode": mode, "gdn_prefill_backend": asked}
        results.append({"release": release, "check": "gdn_checkpoint",
                        "input": f"{where}, linear key heads {head_k_dim}, mamba_cache_mode {mode}, "
                                 f"--gdn-prefill-backend {asked or 'not given'}", "args": args,
                        "vllm": answer, "kvwatch": kvwatch_gdn_checkpoint(release, args)})
    return results


class AttentionType(metaclass=_Members):
    pass


SLIDING_CASES = [(backend, block) for backend in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN")
                 for block in (16, 32, 64, 80, 128)]
SLIDING_TOKEN_BYTES = 16_384    # Gemma 4 31B's sliding layer (16 KV heads of 256, bf16); any width answers alike


def kvwatch_sliding_block_size(release: str, args: dict[str, Any]) -> int:
    """kvwatch's answer for one input of the sliding_block_size check."""
    rule = ruleset_for(release).backend(args["backend"])
    assert rule is not None
    version = KNOWN[[str(v) for v in KNOWN].index(release)]
    return sliding_block_size(rule.block_sizes, args["block_size"], SLIDING_BLOCK_FROM_KERNEL.holds(version),
                              SLIDING_BLOCK_WITHIN_PRIMARY_PAGE.holds(version), SLIDING_BLOCK_DIVIDES_PRIMARY.holds(version))


def check_sliding_block_size(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """The block a sliding-window layer's spec starts from: Attention.get_kv_cache_spec (with the
    module's _largest_kernel_block_within where the release has it), no padded page."""
    rel = "vllm/model_executor/layers/attention/attention.py"

    class Spec:
        def __init__(self, **kw: Any) -> None:
            self.block_size = kw["block_size"]
            self.real_page_size_bytes = kw["block_size"] * SLIDING_TOKEN_BYTES

    stubs: dict[str, Any] = {"AttentionType": AttentionType, "get_kv_quant_mode": lambda dtype: None,
                             "SlidingWindowSpec": Spec, "FullAttentionSpec": Spec, "MultipleOf": MultipleOf}
    oracle.stubs.update(stubs)
    helper = oracle.function(rel, "_largest_kernel_block_within", stubs)
    if helper is not None:
        stubs["_largest_kernel_block_within"] = helper
    fn = oracle.method(rel, "Attention", "get_kv_cache_spec", stubs)
    if fn is None:
        return []
    results = []
    for backend, block in SLIDING_CASES:
        rule = ruleset_for(release).backend(backend)
        assert rule is not None
        kernel = [MultipleOf(r.base) if hasattr(r, "base") else r for r in rule.block_sizes]
        attn_backend = types.SimpleNamespace(get_supported_kernel_block_sizes=lambda *spec, k=kernel: k,
                                             customize_spec=lambda spec: spec, is_mla=lambda: False)
        layer = types.SimpleNamespace(attn_type=AttentionType.DECODER, kv_cache_dtype="auto", sliding_window=1024,
                                      num_kv_heads=16, head_size=256, head_size_v=256, kv_cache_torch_dtype=None,
                                      attn_backend=attn_backend)
        config = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=block, skip_page_size_padded=None),
                                       model_config=types.SimpleNamespace(use_mla=False))
        args = {"backend": backend, "block_size": block}
        results.append({"release": release, "check": "sliding_block_size", "input": f"{backend}, block {block}",
                        "args": args, "vllm": fn(layer, config).block_size,
                        "kvwatch": kvwatch_sliding_block_size(release, args)})
    return results


def _block_rule_text(rule: Any) -> str:
    return f"MultipleOf({rule.base})" if hasattr(rule, "base") else str(rule)


def kvwatch_cpu_attn_kernel_blocks(release: str, args: dict[str, Any]) -> list[str]:
    rule = ruleset_for(release).backend("CPU_ATTN")
    assert rule is not None
    return [_block_rule_text(r) for r in rule.block_sizes]


def check_cpu_attn_kernel_blocks(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """CPU_ATTN's kernel block sizes as the release declares them (or its backends' default)."""
    stubs: dict[str, Any] = {"MultipleOf": MultipleOf}
    oracle.stubs.update(stubs)
    fn = oracle.method("vllm/v1/attention/backends/cpu_attn.py", "CPUAttentionBackend",
                       "get_supported_kernel_block_sizes", stubs) \
        or oracle.method("vllm/v1/attention/backend.py", "AttentionBackend", "get_supported_kernel_block_sizes", stubs)
    if fn is None:
        return []
    return [{"release": release, "check": "cpu_attn_kernel_blocks", "input": "CPU_ATTN", "args": {},
             "vllm": [_block_rule_text(r) for r in fn()], "kvwatch": kvwatch_cpu_attn_kernel_blocks(release, {})}]


# -- cuda_kernel_blocks: the CUDA backends' kernel block sizes, the block sizes they accept and the
# one they prefer, per release, on a table of cards x layouts x KV dtypes.

class KernelCase(NamedTuple):
    """One model and cache as the backends' methods read them (vLLM's VllmConfig)."""
    label: str
    heads: int
    kv_heads: int
    head_size: int
    hybrid_float32_state: bool = False
    hybrid: bool = False
    softcap: bool = False


KERNEL_LAYOUTS = (
    KernelCase("GQA, head 128 (Llama 3 8B)", 32, 8, 128),
    KernelCase("MHA, head 128", 32, 32, 128),
    KernelCase("GQA, head 256 (Gemma 3 27B)", 32, 16, 256),
    KernelCase("GQA, head 256, soft capping (Gemma 2 27B)", 32, 16, 128 * 2, softcap=True),
    KernelCase("GQA, head 512 (Gemma 4 full layers)", 32, 4, 512),
    KernelCase("hybrid, head 256, bf16 state (Qwen3-Next)", 16, 2, 256, hybrid=True),
    KernelCase("hybrid, head 128, float32 SSM state (Nemotron-H)", 32, 8, 128, hybrid=True,
               hybrid_float32_state=True),
)
KERNEL_CAPABILITIES = ((8, 0), (9, 0), (10, 0), (12, 0))
KERNEL_KV_DTYPES = ("auto", "fp8")
KERNEL_BACKENDS = {   # name -> (file, class)
    "FLASH_ATTN": ("vllm/v1/attention/backends/flash_attn.py", "FlashAttentionBackend"),
    "FLASHINFER": ("vllm/v1/attention/backends/flashinfer.py", "FlashInferBackend"),
    "TRITON_ATTN": ("vllm/v1/attention/backends/triton_attn.py", "TritonAttentionBackend"),
    "FLASHMLA": ("vllm/v1/attention/backends/mla/flashmla.py", "FlashMLABackend"),
    "CUTLASS_MLA": ("vllm/v1/attention/backends/mla/cutlass_mla.py", "CutlassMLABackend"),
    "FLASHINFER_MLA": ("vllm/v1/attention/backends/mla/flashinfer_mla.py", "FlashInferMLABackend"),
    "TRITON_MLA": ("vllm/v1/attention/backends/mla/triton_mla.py", "TritonMLABackend"),
    "FLASH_ATTN_MLA": ("vllm/v1/attention/backends/mla/flashattn_mla.py", "FlashAttnMLABackend"),
}
KERNEL_BLOCK_PROBES = (16, 32, 48, 64, 128, 256)
_BASES = ("vllm/v1/attention/backend.py", "vllm/attention/backends/abstract.py")
_KERNEL_METHODS = ("get_supported_kernel_block_sizes", "supports_block_size", "get_preferred_block_size",
                   "_get_fa4_hd256_block_size", "_get_sm90_fa4_fp8_kv_block_size")
_KERNEL_ATTRS = ("supported_kernel_block_sizes", "head_size_v")


def _kernel_case_inputs() -> list[tuple[str, KernelCase, tuple[int, int], str]]:
    rows = []
    for backend in KERNEL_BACKENDS:
        mla = "MLA" in backend
        for cap in KERNEL_CAPABILITIES:
            for case in (KERNEL_LAYOUTS[:1] if mla else KERNEL_LAYOUTS):
                for dtype in KERNEL_KV_DTYPES:
                    rows.append((backend, case, cap, dtype))
    return rows


KERNEL_INPUTS = _kernel_case_inputs()


def _kernel_label(backend: str, case: KernelCase, cap: tuple[int, int], dtype: str) -> str:
    return f"{backend}, SM {cap[0]}.{cap[1]}, {case.label}, kv {dtype}"


def _kernel_config(case: KernelCase, dtype: str) -> Any:
    state = "float32" if case.hybrid_float32_state else "auto"
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(
            is_hybrid=case.hybrid, use_mla=False, get_num_attention_heads=lambda pc=None: case.heads,
            get_num_kv_heads=lambda pc=None: case.kv_heads, get_head_size=lambda: case.head_size,
            hf_text_config=types.SimpleNamespace(attn_logit_softcapping=50.0 if case.softcap else None),
            is_mm_prefix_lm=False, rswa_window=None, is_diffusion=False),
        cache_config=types.SimpleNamespace(mamba_ssm_cache_dtype=state, mamba_cache_dtype="auto", cache_dtype=dtype,
                                           block_size=None),
        parallel_config=types.SimpleNamespace(decode_context_parallel_size=1, tensor_parallel_size=1),
        attention_config=types.SimpleNamespace(use_trtllm_attention=None, flash_attn_version=None))


@functools.lru_cache(maxsize=512)
def _parsed(path: Path) -> ast.Module:
    """A release file's syntax tree, parsed once (the checks only strip decorators, idempotently)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _functions_into(oracle: Oracle, rel: str, names: Sequence[str], scope: dict[str, Any]) -> None:
    """Compile the module-level functions `names` of a release's file into one shared scope (they
    call each other by name), and its integer constants."""
    path = oracle.tree / rel
    if not path.exists():
        return
    tree = _parsed(path)
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            body.append(node)
        elif isinstance(node, ast.ClassDef) and node.name in names:   # an enum the functions compare with
            body.append(node)
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)):
            body.append(node)
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    scope.setdefault("__builtins__", {**vars(builtins), "__import__": oracle._import})
    exec(compile(module, str(path), "exec"), scope)


def _backend_class(oracle: Oracle, rel: str, name: str, scope: dict[str, Any]) -> Any | None:
    """A stand-in for one backend class: the methods and class variables that decide its block
    sizes, compiled from the release as a subclass of its base (AttentionBackend) so that super()
    and overrides behave as in vLLM."""
    base: Any = object
    for file, cls in [(b, "AttentionBackend") for b in _BASES] + [(rel, name)]:
        path = oracle.tree / file
        if not path.exists():
            continue
        tree = _parsed(path)
        owner = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if owner is None:
            continue
        body: list[ast.stmt] = []
        for node in owner.body:
            if isinstance(node, ast.FunctionDef) and node.name in _KERNEL_METHODS:
                node.decorator_list = [d for d in node.decorator_list
                                       if ast.unparse(d) in ("staticmethod", "classmethod")]
                body.append(node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and node.target.id in _KERNEL_ATTRS and node.value is not None:
                body.append(node)
        stand_in = ast.ClassDef(name=cls, bases=[ast.Name("_Base", ast.Load())], keywords=[],
                                body=body or [ast.Pass()], decorator_list=[], type_params=[])
        local = {**scope, "_Base": base}
        exec(compile(ast.fix_missing_locations(ast.Module(body=[stand_in], type_ignores=[])), str(path), "exec"),
             local)
        if cls == name:
            return local[cls]
        if base is object:
            base = local[cls]
    return None


class _KernelPlatform(Platform):
    def get_device_capability(self, device_id: int = 0) -> DeviceCapability:
        assert self.card is not None
        return DeviceCapability(*self.card.capability)

    def is_xpu(self) -> bool:
        return False

    def is_rocm(self) -> bool:
        return False

    def is_cuda(self) -> bool:
        return True


def _kernel_scope(oracle: Oracle, cap: tuple[int, int], config: Any) -> dict[str, Any]:
    """What the backends' methods reach outside their class. vLLM's own helpers are compiled from the
    release (the FlashAttention version, the FA4 head-256 kernel, FlashInfer's TRTLLM gate); what
    depends on the install or the network is fixed to a CUDA wheel's defaults: every FlashAttention
    version built (is_fa_version_supported), the NVIDIA artifactory reachable, no batch invariance."""
    from typing import Literal, get_args
    platform = _KernelPlatform(Card(f"an SM {cap[0]}.{cap[1]} card", 80 * GiB, cap))
    scope: dict[str, Any] = {
        "__builtins__": {**vars(builtins), "__import__": oracle._import},
        "MultipleOf": MultipleOf, "current_platform": platform, "logger": _Logger(),
        "envs": types.SimpleNamespace(VLLM_BATCH_INVARIANT=False), "get_args": get_args,
        "IntEnum": enum.IntEnum, "Enum": enum.Enum, "enum": enum,
        "BlockSize": Literal[1, 8, 16, 32, 64, 128, 256], "ClassVar": Any, "Any": Any,
        "get_current_vllm_config": lambda: config, "get_current_vllm_config_or_none": lambda: config,
        "has_nvidia_artifactory": lambda: True, "is_fa_version_supported": lambda version: True,
        "fa_version_unsupported_reason": lambda version: None,
        # 0.33's registry of out-of-tree KV dtypes: "None for upstream dtypes" (vllm/config/cache.py:161)
        "get_kv_cache_dtype_handler": lambda name: None,
        "AttentionSpec": type("AttentionSpec", (), {}), "KVCacheSpec": type("KVCacheSpec", (), {}),
        "KVQuantMode": types.SimpleNamespace(FP8_PER_TENSOR="FP8_PER_TENSOR"),
    }
    # from the module fa_utils takes it from (vllm/utils/torch_utils.py; 0.33: v1/kv_cache_interface.py)
    fa_utils = oracle.tree / "vllm/v1/attention/backends/fa_utils.py"
    source = next((n.module for n in (_parsed(fa_utils).body if fa_utils.exists() else ())
                   if isinstance(n, ast.ImportFrom) and n.module and any(a.name == "is_quantized_kv_cache" for a in n.names)),
                  "vllm.utils.torch_utils")
    _functions_into(oracle, source.replace(".", "/") + ".py",
                    ("is_quantized_kv_cache", "get_kv_quant_mode", "KVQuantMode"), scope)
    _functions_into(oracle, "vllm/v1/attention/backends/fa_utils.py",
                    ("get_flash_attn_version", "uses_fa4_hd256_kernel", "_fa4_hd256_fallback_reason"), scope)
    _functions_into(oracle, "vllm/utils/flashinfer.py",
                    ("can_use_trtllm_attention", "supports_trtllm_attention", "force_use_trtllm_attention"), scope)
    oracle.stubs.update({k: v for k, v in scope.items() if not k.startswith("__")})
    return scope


def _rule_texts(sizes: Any) -> list[str]:
    return [_block_rule_text(r) for r in sizes]


def _flag_releases() -> frozenset[str]:
    from kvwatch.planner.serve_options import known_releases
    return frozenset(known_releases())


KNOWN_FLAG_RELEASES = _flag_releases()


def kvwatch_cuda_kernel_blocks(release: str, args: dict[str, Any]) -> dict[str, Any]:
    """kvwatch's answer for one input of the cuda_kernel_blocks check: the backend's rule after the
    release's kernel rows (planner/backends.py with_release_kernel_blocks)."""
    from kvwatch.planner.backends import with_release_kernel_blocks
    from kvwatch.vllm_releases.cuda_kernel_blocks import KernelContext
    case = next(c for c in KERNEL_LAYOUTS if c.label == args["layout"])
    context = KernelContext(tuple(args["capability"]), case.heads, case.kv_heads, case.head_size, case.head_size,  # type: ignore[arg-type]
                            args["kv_cache_dtype"], hybrid_state_float32=case.hybrid_float32_state,
                            softcap=case.softcap)
    rule = with_release_kernel_blocks(ruleset_for(release), parse_version(release), context).backend(args["backend"])
    assert rule is not None
    # until 0.18 --block-size's choices (vllm_releases/generated/flags.py) are CacheConfig's BlockSize literals,
    # which supports_block_size also asks for
    from kvwatch.planner.serve_options import release_options
    found = release_options(release).match("--block-size") if release in KNOWN_FLAG_RELEASES else None
    choices = found.option.choices if found is not None and found.option is not None else None
    answer: dict[str, Any] = {"kernel": _rule_texts(rule.block_sizes),
                              "accepts": [b for b in KERNEL_BLOCK_PROBES if rule.supports_block_size(b)
                                          and (choices is None or str(b) in choices)]}
    if args["has_preferred"]:
        answer["preferred"] = rule.preferred_block_size
    return answer


def check_cuda_kernel_blocks(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """Each CUDA backend's get_supported_kernel_block_sizes (0.11: its supported_kernel_block_sizes),
    supports_block_size on KERNEL_BLOCK_PROBES and get_preferred_block_size(the release's default
    block size: 16, 64 from 0.34, read from its CacheConfig.DEFAULT_BLOCK_SIZE into defaults.py) where
    the release has it, run from the release's classes on KERNEL_INPUTS."""
    from kvwatch.vllm_releases.defaults import DEFAULTS
    default_block = DEFAULTS[release].block_size
    results = []
    for backend, case, cap, dtype in KERNEL_INPUTS:
        rel, name = KERNEL_BACKENDS[backend]
        scope = _kernel_scope(oracle, cap, _kernel_config(case, dtype))
        cls = _backend_class(oracle, rel, name, scope)
        if cls is None:
            continue
        if hasattr(cls, "get_supported_kernel_block_sizes"):
            kernel = cls.get_supported_kernel_block_sizes()
        elif hasattr(cls, "supported_kernel_block_sizes"):
            kernel = cls.supported_kernel_block_sizes
        else:
            continue
        answer: dict[str, Any] = {"kernel": _rule_texts(kernel),
                                  "accepts": [b for b in KERNEL_BLOCK_PROBES if cls.supports_block_size(b)]}
        has_preferred = hasattr(cls, "get_preferred_block_size")
        if has_preferred:
            answer["preferred"] = cls.get_preferred_block_size(default_block)
        args = {"backend": backend, "layout": case.label, "capability": list(cap), "kv_cache_dtype": dtype,
                "has_preferred": has_preferred}
        results.append({"release": release, "check": "cuda_kernel_blocks", "input": _kernel_label(backend, case, cap, dtype),
                        "args": args, "vllm": answer, "kvwatch": kvwatch_cuda_kernel_blocks(release, args)})
    return results


BF16 = 2


def _attention(kind: str, heads: int, head_size: int, window: int | None = None,
               dtype: str | None = None) -> dict[str, Any]:
    """One attention layer; `dtype` "fp8" for a quantized one beside layers kept in bf16
    (--kv-cache-dtype fp8 --kv-cache-dtype-skip-layers), else bf16."""
    layer = {"kind": kind, "heads": heads, "head_size": head_size, "window": window}
    return {**layer, "dtype": dtype} if dtype else layer


def _token_bytes(layer: dict[str, Any]) -> int:
    """One token of one attention layer in its dtype (MLA: one latent, not K and V)."""
    element = 1 if layer.get("dtype") == "fp8" else BF16
    return layer["heads"] * layer["head_size"] * element * (1 if layer["kind"] == "mla" else 2)


def _state_bytes(shapes: list[list[int]]) -> int:
    total = 0
    for shape in shapes:
        size = BF16
        for dim in shape:
            size *= dim
        total += size
    return total


def _group_case(label: str, layers: Sequence[dict[str, Any] | None], block_size: int = 16,
                disable_hybrid: bool = False) -> dict[str, Any]:
    """One input of get_kv_cache_groups. A Mamba layer's page is padded to the largest attention
    page, which the hybrid alignment (checked above) made hold one state: the block size given here
    is the aligned one."""
    pages = [block_size * _token_bytes(x) for x in layers if x is not None and x["kind"] != "mamba"]
    out = []
    for layer in layers:
        if layer is not None and layer["kind"] == "mamba":
            state = _state_bytes(layer["shapes"])
            assert not pages or max(pages) >= state, f"{label}: block {block_size} does not hold a state"
            layer = {**layer, "page_padded": max(pages) if pages else None}
        out.append(layer)
    return {"label": label, "layers": out, "block_size": block_size, "disable_hybrid": disable_hybrid}


def _interleaved(n: int, every: int, local: dict[str, Any], full: dict[str, Any]) -> list[dict[str, Any] | None]:
    """n layers, every `every`-th one (the last of each run) full, the others local."""
    return [full if i % every == every - 1 else local for i in range(n)]


# Layer layouts of real models (shapes at TP 1, bf16): Llama 3 8B; DeepSeek-V3 (MLA latent 576);
# Gemma 3 27B (5 sliding of 1,024 : 1 full, 16 KV heads of 128); gpt-oss-20b (1:1, window 128,
# 8 KV heads of 64); Llama 4 Scout (3 chunked of 8,192 : 1 full); Gemma 4-like (5 sliding, 8 heads
# of 256 : 1 full, 2 heads of 512; the last layers KV-shared); Qwen3-Next (3 GDN : 1 full, 2 heads
# of 256); Granite-4.0-H (9 Mamba2 : 1 full, 8 heads of 128); Mamba-2 / Falcon-Mamba (no attention).
_GDN = {"kind": "mamba", "shapes": [[3, 8192], [32, 128, 128]]}
_MAMBA2 = {"kind": "mamba", "shapes": [[3, 6400], [96, 64, 128]]}
_PURE_MAMBA = {"kind": "mamba", "shapes": [[3, 5376], [80, 64, 128]]}


def _group_cases() -> list[dict[str, Any]]:
    full128 = _attention("full", 8, 128)
    gemma3 = _interleaved(62, 6, _attention("sliding", 16, 128, 1024), _attention("full", 16, 128))
    gpt_oss = _interleaved(24, 2, _attention("sliding", 8, 64, 128), _attention("full", 8, 64))
    gemma4 = _interleaved(30, 6, _attention("sliding", 8, 256, 1024), _attention("full", 2, 512))
    mla_bf16, mla_fp8 = _attention("mla", 1, 576), _attention("mla", 1, 576, dtype="fp8")
    cases = [
        _group_case("uniform full attention, 32 layers", [full128] * 32),
        _group_case("uniform full attention, block 64", [full128] * 32, block_size=64),
        _group_case("MLA, 61 layers", [_attention("mla", 1, 576)] * 61, block_size=64),
        _group_case("full attention, head sizes 128 and 256", [full128, _attention("full", 8, 256)] * 8),
        _group_case("sliding only, one window", [_attention("sliding", 8, 128, 4096)] * 28),
        _group_case("Gemma 3 5:1 sliding:full", gemma3),
        _group_case("gpt-oss 1:1 sliding:full", gpt_oss),
        _group_case("Llama 4 3:1 chunked:full", _interleaved(48, 4, _attention("chunked", 8, 128, 8192), full128)),
        _group_case("two windows and full", [_attention("sliding", 8, 128, 512), _attention("sliding", 8, 128, 4096),
                                              full128] * 6),
        _group_case("Gemma 4-like 5:1, head sizes 256/512", gemma4),
        _group_case("Gemma 4-like 5:1, last 10 layers KV-shared", gemma4[:20] + [None] * 10),
        _group_case("Qwen3-Next 3:1 GDN:full", _interleaved(48, 4, _GDN, _attention("full", 2, 256)), block_size=576),
        _group_case("Granite-4.0-H 9:1 Mamba2:full", _interleaved(40, 10, _MAMBA2, full128), block_size=400),
        _group_case("pure Mamba, 64 layers", [_PURE_MAMBA] * 64),
        # buckets of nearly equal counts: 12 sliding : 10 full (x1.2) and 11 : 8 (x1.375)
        _group_case("12 sliding : 10 full", [_attention("sliding", 8, 128, 1024)] * 12 + [full128] * 10),
        _group_case("11 sliding : 8 full", [_attention("sliding", 8, 128, 1024)] * 11 + [full128] * 8),
        # --kv-cache-dtype fp8 with skip layers kept in bf16, at the block the platform grew
        # (vllm_releases/skip_layer_pages.py): MLA layers of two dtypes at one block (0.26+), and full ones
        _group_case("MLA fp8, layer 0 in bf16 (skip layer), block 128",
                    [mla_bf16] + [mla_fp8] * 60, block_size=128),
        _group_case("MLA fp8, layers 0 and 60 in bf16 (skip layers), block 256",
                    [mla_bf16] + [mla_fp8] * 59 + [mla_bf16], block_size=256),
        _group_case("full attention fp8, layer 0 in bf16 (skip layer), block 32",
                    [full128] + [_attention("full", 8, 128, dtype="fp8")] * 31, block_size=32),
        _group_case("full attention fp8, layer 0 in bf16 (skip layer), block 16",
                    [full128] + [_attention("full", 8, 128, dtype="fp8")] * 31),
    ]
    for label, layers in (("Gemma 3 5:1 sliding:full", gemma3), ("gpt-oss 1:1 sliding:full", gpt_oss),
                          ("Gemma 4-like 5:1, head sizes 256/512", gemma4),
                          ("Granite-4.0-H 9:1 Mamba2:full", _interleaved(40, 10, _MAMBA2, full128))):
        block = 400 if "Granite" in label else 16
        cases.append(_group_case(f"{label}, --disable-hybrid-kv-cache-manager", layers, block, disable_hybrid=True))
    return cases


GROUP_CASES = _group_cases()


def _kvwatch_groups(release: str, label: str) -> tuple[Any, list[tuple[int, Any]]] | str:
    """kvwatch's groups for one of GROUP_CASES, fed to kv_groups as planner/plan.py _kv_groups feeds
    them (promoted when the hybrid manager is off), with the case's present layers; or its refusal."""
    case = next(c for c in GROUP_CASES if c["label"] == label)
    present = [(i, x) for i, x in enumerate(case["layers"]) if x is not None]
    kinds = [x["kind"] if x["kind"] != "mla" else FULL for _, x in present]
    rule = grouping_rule_for(parse_version(release))
    block = case["block_size"]
    pages = [0 if x["kind"] == "mamba" else block * _token_bytes(x) for _, x in present]
    if case["disable_hybrid"]:
        if promotion_refused(kinds, [p for k, p in zip(kinds, pages, strict=True) if k != "mamba"],
                             rule.uniform_type):
            return "error: ValueError"
        kinds = promote_local_layers(kinds)
    windows = {x["window"] for _, x in present if x["kind"] in (SLIDING, CHUNKED)}
    if len(windows) > 1:
        return "not modelled: one window per model"
    state = next((_state_bytes(x["shapes"]) for _, x in present if x["kind"] == "mamba"), 0)
    specs = layer_specs(kinds, pages, block, windows.pop() if windows else None, state)
    if pages_refused(specs, KV_PAGE_UNIFICATION.holds(parse_version(release)), rule.uniform_type):
        return "error: NotImplementedError"
    return kv_groups(specs, rule.near_equal, rule.strided), present


def kvwatch_kv_groups(release: str, args: dict[str, Any]) -> Any:
    """kvwatch's answer for one input of the kv_groups check (_kvwatch_groups). The input is named by
    its label; the fixture records the case table once (kv_groups_cases)."""
    built = _kvwatch_groups(release, args["case"])
    if isinstance(built, str):
        return built
    groups, present = built
    return [{"kind": groups.specs[g[0]].layer_kind, "block_size": groups.specs[g[0]].block_size,
             "layers": [present[i][0] for i in g], "bytes_per_block": sum(groups.specs[i].page_bytes for i in g)}
            for g in groups.groups]


# The cache the kv_tokens check reports on: blocks, and the scheduler the oracle's VllmConfig gives
# (scripts/oracle_kv_groups.py: max_model_len 4096, 2048 tokens in flight, mamba_cache_mode "align").
TOKENS_NUM_BLOCKS = 10_000
TOKENS_DEMAND = {"max_model_len": 4096, "max_in_flight_tokens": 2048, "mamba_align": True}


def kvwatch_kv_tokens(release: str, args: dict[str, Any]) -> Any:
    """kvwatch's answer for one input of the kv_tokens check: the logged token count as the plan
    computes it (kv_groups capacity, vllm_releases/kv_tokens_report.py)."""
    from kvwatch.planner.kv_groups import Demand
    from kvwatch.vllm_releases.kv_tokens_report import reported_kv_tokens
    built = _kvwatch_groups(release, args["case"])
    if isinstance(built, str):
        return built
    groups, _present = built
    num_blocks = args["num_blocks"]
    tokens, _concurrency = groups.capacity(num_blocks, Demand(**TOKENS_DEMAND))
    smallest = min(groups.specs[g[0]].block_size for g in groups.groups)
    return reported_kv_tokens(tokens, num_blocks, len(groups.groups), smallest, parse_version(release))


def check_kv_tokens(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """The "GPU KV cache size: N tokens" the release logs for TOKENS_NUM_BLOCKS blocks in its own
    groups of each of GROUP_CASES (its _report_kv_cache_config, 0.28+ update_kv_cache_capacity),
    run by scripts/oracle_kv_groups.py --tokens in a process of its own."""
    import subprocess
    worker = ROOT / "scripts" / "oracle_kv_groups.py"
    done = subprocess.run([sys.executable, str(worker), str(oracle.tree), "--tokens", str(TOKENS_NUM_BLOCKS)],
                          input=json.dumps(GROUP_CASES), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{release}: the kv_tokens oracle failed:\n{done.stderr[-3000:]}")
    answers = json.loads(done.stdout)
    if answers is None:   # 0.10: the line is logged inside get_kv_cache_config, which sizes the cache itself
        return []
    results = []
    for case, answer in zip(GROUP_CASES, answers, strict=True):
        args = {"case": case["label"], "num_blocks": TOKENS_NUM_BLOCKS}
        results.append({"release": release, "check": "kv_tokens", "input": case["label"], "args": args,
                        "vllm": answer, "kvwatch": kvwatch_kv_tokens(release, args)})
    return results


def check_kv_groups(release: str, oracle: Oracle) -> list[dict[str, Any]]:
    """vLLM's get_kv_cache_groups (v1/core/kv_cache_utils.py; 0.33: kv_cache_planning.py) on specs
    built with the release's own classes, run by scripts/oracle_kv_groups.py in a process of its own."""
    import subprocess
    worker = ROOT / "scripts" / "oracle_kv_groups.py"
    done = subprocess.run([sys.executable, str(worker), str(oracle.tree)], input=json.dumps(GROUP_CASES),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{release}: the kv_groups oracle failed:\n{done.stderr[-3000:]}")
    answers = json.loads(done.stdout)
    if answers is None:   # no get_kv_cache_groups in this release
        return []
    return [{"release": release, "check": "kv_groups", "input": case["label"], "args": {"case": case["label"]},
             "vllm": answer, "kvwatch": kvwatch_kv_groups(release, {"case": case["label"]})}
            for case, answer in zip(GROUP_CASES, answers, strict=True)]


CHECKS = {"batch_defaults": check_batch_defaults, "backend_priorities": check_backend_priorities,
          "max_model_len": check_max_model_len, "hybrid_block_size": check_hybrid_block_size,
          "sliding_block_size": check_sliding_block_size, "cpu_attn_kernel_blocks": check_cpu_attn_kernel_blocks,
          "kv_groups": check_kv_groups, "cuda_kernel_blocks": check_cuda_kernel_blocks,
          "kv_tokens": check_kv_tokens, "gdn_checkpoint": check_gdn_checkpoint,
          "skip_layer_block_size": check_skip_layer_block_size}


def run(src_root: Path, releases: list[str], checks: list[str] | None = None) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for release in releases:
        oracle = Oracle(src_root / release)
        for name, check in CHECKS.items():
            if checks is None or name in checks:
                results.extend(check(release, oracle))
    return results


def torch_available() -> bool:
    """The kv_groups oracle builds vLLM's specs, which hold torch dtypes."""
    import importlib.util
    return importlib.util.find_spec("torch") is not None


# Differences kvwatch knows of and does not fix, by (check, input), in every release where they
# show: the reason is recorded in the fixture and the test checks that they still differ.
_TWO_WINDOWS = ("kvwatch's layer layout holds one window per model (planner/layers.py LayerLayout.window); "
                "no architecture kvwatch reads has two")
KNOWN_DIFFERENCES = {
    ("kv_groups", "two windows and full"): _TWO_WINDOWS,
    ("kv_tokens", "two windows and full"): _TWO_WINDOWS,
}


def differences(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The differences not known (KNOWN_DIFFERENCES)."""
    return [r for r in results if r["vllm"] != r["kvwatch"] and (r["check"], r["input"]) not in KNOWN_DIFFERENCES]


def known_differences(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r["vllm"] != r["kvwatch"] and (r["check"], r["input"]) in KNOWN_DIFFERENCES]


def render_fixture(releases: list[str], results: list[dict[str, Any]]) -> str:
    """One result a line: vLLM's answers are the recorded truth; kvwatch's are recomputed by the test."""
    lines = ",\n  ".join(json.dumps({k: v for k, v in r.items() if k != "kvwatch"}, sort_keys=True)
                          for r in results)
    known = {f"{check}: {label}": reason for (check, label), reason in KNOWN_DIFFERENCES.items()}
    return ('{"source": "vLLM\'s own functions, run from each release\'s wheel by scripts/check_release_functions.py",\n'
            f' "releases": {json.dumps(releases)},\n "known_differences": {json.dumps(known, sort_keys=True)},\n'
            f' "kv_groups_cases": {json.dumps(GROUP_CASES, sort_keys=True)},\n'
            f' "results": [\n  {lines}\n ]}}\n')


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src_root", nargs="?", default=os.environ.get("KVWATCH_VLLM_SRC"))
    ap.add_argument("--write", nargs="?", const=str(FIXTURE), help=f"record the results (default {FIXTURE.name})")
    ap.add_argument("--only", help="run only these checks (comma-separated names of CHECKS), while developing; "
                                   "not with --write, which records them all")
    ap.add_argument("--release", help="run only these releases (comma-separated); with --write, their results "
                                      "replace theirs in the fixture and the other releases' are kept")
    args = ap.parse_args(argv)
    if args.only and args.write:
        ap.error("--only runs part of the checks; --write records them all")
    if not args.src_root:
        ap.error("give SRC_ROOT or set KVWATCH_VLLM_SRC")
    src_root = Path(args.src_root)
    releases = [str(v) for v in KNOWN if (src_root / str(v) / "vllm").is_dir()]
    if args.release:
        asked = args.release.split(",")
        unknown = [r for r in asked if r not in {str(v) for v in KNOWN}]
        if unknown:
            ap.error(f"not a known release: {', '.join(unknown)} (kvwatch.vllm_releases.KNOWN)")
        missing = [r for r in asked if r not in releases]
        if missing:
            print(f"error: {', '.join(missing)} not unpacked under {src_root}", file=sys.stderr)
            return 2
        releases = [r for r in releases if r in asked]
    if not releases:
        print(f"error: no known release unpacked under {src_root}", file=sys.stderr)
        return 2
    checks = list(CHECKS)
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(CHECKS))
        if unknown:
            ap.error(f"no such check: {', '.join(unknown)} (checks: {', '.join(CHECKS)})")
        checks = [c for c in checks if c in args.only.split(",")]
    if not torch_available() and {"kv_groups", "kv_tokens"} & set(checks):
        if args.write:   # a fixture without the groups would drop vLLM's answers
            print("error: the kv_groups oracle needs torch in this environment (pip install torch, the CPU "
                  "build); nothing written", file=sys.stderr)
            return 2
        print("note: no torch here, the kv_groups and kv_tokens checks are skipped", file=sys.stderr)
        checks = [c for c in checks if c not in ("kv_groups", "kv_tokens")]
    results = run(src_root, releases, checks)
    diffs = differences(results)
    for d in diffs:
        print(f"DIFF vLLM {d['release']} {d['check']} [{d['input']}]: vLLM {d['vllm']} kvwatch {d['kvwatch']}")
    known = known_differences(results)
    for d in known:
        print(f"KNOWN vLLM {d['release']} {d['check']} [{d['input']}]: "
              f"{KNOWN_DIFFERENCES[(d['check'], d['input'])]}")
    counts: dict[str, int] = {}
    for r in results:
        counts[r["check"]] = counts.get(r["check"], 0) + 1
    print(f"{len(releases)} releases, " + ", ".join(f"{k}: {n} inputs" for k, n in counts.items())
          + f"; {len(diffs)} differences, {len(known)} known")
    if args.write:
        if args.release:
            releases, results = merged_with_fixture(Path(args.write), releases, results)
        Path(args.write).write_text(render_fixture(releases, results), encoding="utf-8")
    return 1 if diffs else 0


def merged_with_fixture(fixture: Path, releases: list[str], results: list[dict[str, Any]]
                        ) -> tuple[list[str], list[dict[str, Any]]]:
    """The recorded results of every other known release, with `releases`' results in their place,
    in KNOWN's order (so recording one release gives the same file as recording them all)."""
    recorded = json.loads(fixture.read_text(encoding="utf-8"))
    kept = [r for r in recorded["results"] if r["release"] not in releases]
    every = [str(v) for v in KNOWN if str(v) in set(recorded["releases"]) | set(releases)]
    by_release: dict[str, list[dict[str, Any]]] = {r: [] for r in every}
    for r in kept + results:
        by_release[r["release"]].append(r)
    return every, [r for release in every for r in by_release[release]]


if __name__ == "__main__":
    sys.exit(main())
