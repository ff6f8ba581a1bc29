"""The reasons a command lies outside the one scope a model's own planner was checked on (pure).

GLM-5-Next, Qwen4-Exp, Dots3 and Mistral Large 4 are planned exactly on one scope each: the releases
their oracle ran, CUDA SM 9.0, a bf16 model, vLLM's default block size, no pipeline parallelism, the
attention backend vLLM picks there and the hybrid KV cache manager on. Those reasons are written once
here; each planner adds its own (its KV dtype rule, its draft, what the TP size must divide).
"""
from __future__ import annotations

from collections.abc import Iterable

from kvwatch.planner.deepseek_v4 import drafts_with_mtp
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.values.versions import VllmVersion

SM = (9, 0)
Reason = tuple[bool, str]   # (the command meets it, why the plan is then unsure)


def cuda_sm(device: Device) -> tuple[int, int]:
    """The device's compute capability as a pair; (0, 0) for anything but a CUDA device."""
    major, _, minor = device.sm.partition(".")
    return (int(major), int(minor or 0)) if device.platform == "cuda" and major.isdigit() and minor.isdigit() else (0, 0)


def bf16_model(settings: EngineSettings, config_dtype: str | None) -> bool:
    """Whether the model runs in bf16: --dtype, or config.json's where --dtype is auto."""
    dtype = (config_dtype or "not given") if settings.dtype == "auto" else settings.dtype
    return dtype in ("bfloat16", "bf16")


def mtp_draft_reason(settings: EngineSettings, model: str, mtp_reasons: str) -> str | None:
    """Why the command's draft is not the checkpoint's MTP head planned with the target: "" where it
    drafts not at all, None where it drafts with that head (the model's own checks come next)."""
    if not (settings.num_speculative_tokens > 0 or settings.speculative_config):
        return ""
    if not drafts_with_mtp(settings.speculative_method, settings.num_speculative_tokens):
        return f"--speculative-config method {settings.speculative_method!r}: only {model}'s MTP draft is planned"
    return mtp_reasons or None


def outside(settings: EngineSettings, device: Device, version: VllmVersion | None, *, checked: Iterable[tuple[int, int]],
            config_reasons: str, dtype: Reason, draft: str, backend: str | None, own: Iterable[Reason] = ()) -> str:
    """Why this command lies outside the scope ("" when it lies inside): the shared reasons, then the model's
    own. `checked`: the releases the oracle ran; `dtype`: the model's KV dtype rule; `draft`: why its draft is
    not planned; `backend`: an --attention-backend the scope takes besides none."""
    minors = sorted(set(checked))
    releases = " and ".join(f"{a}.{b}" for a, b in minors)
    reasons: list[Reason] = [
        (bool(config_reasons), config_reasons),
        (version is not None and version.parts[:2] not in minors,
         f"vLLM {version}: only {releases} {'are' if len(minors) > 1 else 'is'} checked"),
        (device.platform != "cuda" or cuda_sm(device) != SM, f"{device.platform} SM {device.sm}: only CUDA SM 9.0 is checked"),
        dtype,
        (settings.block_size is not None, "--block-size set"),
        (bool(draft), draft),
        (settings.pipeline_parallel_size > 1, "pipeline parallelism"),
        (settings.attention_backend not in (None, backend), "--attention-backend set"),
        (settings.disable_hybrid_kv_cache_manager, "--disable-hybrid-kv-cache-manager"),
        *own,
    ]
    return "; ".join(why for hit, why in reasons if hit)


def mamba_defaults(settings: EngineSettings) -> list[Reason]:
    """The Mamba-state settings the hybrid scopes were checked with: prefix caching on, align mode, auto dtypes."""
    return [(settings.enable_prefix_caching is False or settings.mamba_cache_mode not in (None, "align"),
             "no prefix caching or another Mamba cache mode"),
            ((settings.mamba_cache_dtype, settings.mamba_ssm_cache_dtype) != ("auto", "auto"), "a Mamba cache dtype set")]
