"""Which attention backend vLLM will pick, and why the others were rejected (pure)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.rules import FP8_KV_DTYPES, PACKED_MLA_BYTES, BackendRule, RuleSet
from kvwatch.values.block_sizes import MultipleOf
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.cuda_kernel_blocks import (
    KernelContext,
    accepts_multiples,
    kernel_block_sizes,
    preferred_block_size,
)
from kvwatch.vllm_releases.release_defaults import defaults_for


@dataclass(frozen=True)
class BackendChoice:
    backend: BackendRule | None
    candidates: tuple[str, ...]                 # in vLLM's priority order
    reasons: dict[str, tuple[str, ...]]          # rejected backend -> reasons, vLLM's wording


def kv_dtype_reason(rule: BackendRule, kv_dtype: str, device: Device, geometry: ModelGeometry) -> str | None:
    """Why `rule` cannot store a KV cache of `kv_dtype` on `device`, or None when it can."""
    if kv_dtype not in rule.kv_dtypes and not (kv_dtype in PACKED_MLA_BYTES and kv_dtype in rule.kv_dtypes):
        return "kv_cache_dtype not supported"
    if kv_dtype in FP8_KV_DTYPES:
        cc = device.compute_capability
        if rule.fp8_majors is not None and (cc is None or cc[0] not in rule.fp8_majors):
            return "kv_cache_dtype not supported"
        if rule.fp8_min_capability is not None and (cc is None or cc < rule.fp8_min_capability):
            return "kv_cache_dtype not supported (fp8 needs SM89+)"
        if rule.cpu_fp8_needs_isa and not device.cpu_fp8_kv:
            return "FP8 KV cache on CPU requires x86 with AVX-512 or AMX"
        if rule.fp8_head_size_multiple and geometry.head_size % rule.fp8_head_size_multiple:
            return f"FP8 KV cache requires head_size divisible by {rule.fp8_head_size_multiple} on CPU"
    return None


def rejection_reasons(rule: BackendRule, device: Device, geometry: ModelGeometry, kv_dtype: str,
                      user_block_size: int | None) -> tuple[str, ...]:
    reasons = []
    if not rule.supports_capability(device.compute_capability):
        reasons.append("compute capability not supported")
    dtype_reason = kv_dtype_reason(rule, kv_dtype, device, geometry)
    if dtype_reason:
        reasons.append(dtype_reason)
    if rule.head_sizes is not None and geometry.head_size not in rule.head_sizes:
        reasons.append("head_size not supported")
    if (user_block_size is not None and rule.forced_block_size is None
            and not rule.supports_block_size(user_block_size)):
        reasons.append("block_size not supported")
    return tuple(reasons)


def choose_backend(rules: RuleSet, device: Device, geometry: ModelGeometry, kv_dtype: str,
                   user_block_size: int | None, requested: str | None = None) -> BackendChoice:
    """vLLM's selection: the first backend in priority order with no reason to reject it."""
    major = device.compute_capability[0] if device.compute_capability else None
    key = (device.platform, geometry.attention, major)
    names = rules.priorities.get(key) or rules.priorities[(device.platform, geometry.attention, None)]
    if requested:
        names = (requested.upper(),)
    reasons: dict[str, tuple[str, ...]] = {}
    for name in names:
        rule = rules.backend(name)
        if rule is None or rule.attention != geometry.attention or rule.platform != device.platform:
            reasons[name] = ("not a backend for this model and device",)
            continue
        rejected = rejection_reasons(rule, device, geometry, kv_dtype, user_block_size)
        if not rejected:
            return BackendChoice(rule, tuple(names), reasons)
        reasons[name] = rejected
    return BackendChoice(None, tuple(names), reasons)


def kernel_context(geometry: ModelGeometry, device: Device, settings: EngineSettings) -> KernelContext:
    """What the CUDA backends' kernel block sizes depend on, as vLLM's config holds it."""
    state = geometry.layout.state
    ssm = settings.mamba_ssm_cache_dtype if settings.mamba_ssm_cache_dtype != "auto" else (state.ssm_dtype if state else None)
    float32_state = state is not None and geometry.attention != "none" and (
        settings.mamba_cache_dtype == "float32" or ssm == "float32")
    return KernelContext(device.compute_capability, geometry.num_attention_heads or geometry.num_kv_heads,
                         geometry.num_kv_heads, geometry.head_size, geometry.head_size_v, settings.kv_cache_dtype,
                         hybrid_state_float32=float32_state, softcap="attn_logit_softcapping" in geometry.present_fields)


def default_preference(rule: BackendRule, default: int) -> int:
    """The block size a backend takes when --block-size is unset, before any kernel row raises it:
    the release's CacheConfig.DEFAULT_BLOCK_SIZE (16; 64 from 0.34) where the backend accepts it, else
    its smallest kernel block (AttentionBackend.get_preferred_block_size, vLLM 0.34.0,
    vllm/v1/attention/backend.py:158-166; the same in 0.33.0). So from 0.34 FLASH_ATTN, FLASHINFER,
    TRITON_ATTN and the MultipleOf(16) MLA backends take 64, FLASHINFER_MLA 64 (32 before), CUTLASS_MLA
    keeps 128."""
    if rule.supports_block_size(default):
        return default
    return min(r.base if isinstance(r, MultipleOf) else r for r in rule.block_sizes)


def with_release_kernel_blocks(rules: RuleSet, version: VllmVersion | None, context: KernelContext) -> RuleSet:
    """The rules with each CUDA backend's kernel block sizes (and the block size it prefers) as
    this release gives them for this model and card, and whether it accepts their multiples
    (vllm_releases/cuda_kernel_blocks.py)."""
    version = version or DEFAULT_RELEASE
    default = defaults_for(version).block_size
    backends = []
    for rule in rules.backends:
        if rule.platform != "cuda":
            backends.append(rule)
            continue
        rule = replace(rule, accepts_multiples=accepts_multiples(version))
        sizes = kernel_block_sizes(rule.name, version, context)
        if sizes is not None:
            rule = replace(rule, block_sizes=sizes)
        rule = replace(rule, preferred_block_size=preferred_block_size(
            rule.name, version, context, default_preference(rule, default)))
        backends.append(rule)
    return replace(rules, backends=tuple(backends))


def attention_block_size(shape: BackendRule | None, settings: EngineSettings, default_block: int) -> tuple[int, str]:
    """The block size of the attention layers and where it comes from: the flag, else the backend's
    preference; some platforms override both."""
    # platforms/cpu.py: CPU_MLA's kernel forces 16; AMX_MLA (an AMX host's pick, 0.29+) forces none
    if shape is not None and shape.forced_block_size is not None:
        return shape.forced_block_size, "platform override"
    if settings.block_size is not None:
        return settings.block_size, "flag"
    return (shape.preferred_block_size if shape else default_block), "backend default"
