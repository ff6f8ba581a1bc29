"""vLLM's scheduler limits as the KV cache sees them: prefix caching, and what one request may hold (pure)."""
from __future__ import annotations

from kvwatch.planner.cpu_mla import runs_amx_mla
from kvwatch.planner.cross_attention import CROSS, max_num_encoder_input_tokens
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.gpu_budget import Release, api_defaults
from kvwatch.planner.kv_groups import Demand
from kvwatch.values.versions import VllmVersion, parse_version
from kvwatch.vllm_releases.kv_layout import (
    HYBRID_PREFIX_CACHING_BY_DEFAULT,
    IN_FLIGHT_TOKENS,
    MAMBA_ALIGN_BY_DEFAULT,
    MAMBA_PREFIX_CACHING_CLASSES,
)


def prefix_caching_on(geometry: ModelGeometry, settings: EngineSettings, version: VllmVersion | None = None) -> bool:
    """Whether prefix caching is on: the flag, else vLLM's default (config/model.py
    is_prefix_caching_supported: on for decoders and hybrids, off for attention-free models; a
    hybrid's off before 0.28, vllm_releases/kv_layout.py HYBRID_PREFIX_CACHING_BY_DEFAULT)."""
    if settings.enable_prefix_caching is not None:
        return settings.enable_prefix_caching
    if geometry.layout.state is not None and geometry.attention != "none":
        return HYBRID_PREFIX_CACHING_BY_DEFAULT.holds(version)
    return geometry.attention != "none"


def mamba_cache_mode(geometry: ModelGeometry, settings: EngineSettings, version: VllmVersion | None = None) -> str:
    """vLLM's mamba_cache_mode for a model with state layers (MambaModelConfig.verify_and_update_config):
    "none" without prefix caching; with it, --mamba-cache-mode, else "all" before 0.28 where the model
    class supports Mamba prefix caching (kv_layout.MAMBA_ALIGN_BY_DEFAULT), else "align"; "all" on a
    class without that support falls back to "align"."""
    if geometry.layout.state is None or not prefix_caching_on(geometry, settings, version):
        return "none"
    supports = any(a in MAMBA_PREFIX_CACHING_CLASSES for a in geometry.architectures)
    mode = settings.mamba_cache_mode or "none"
    if mode == "none":
        mode = "all" if supports and not MAMBA_ALIGN_BY_DEFAULT.holds(version) else "align"
    return "align" if mode == "all" and not supports else mode


def request_demand(geometry: ModelGeometry, settings: EngineSettings, device: Device, max_model_len: int,
                   release: Release) -> Demand:
    """What one request may hold: max_model_len, and the tokens in flight that sliding-window and
    chunked layers keep on top of their window (VllmConfig.max_in_flight_tokens)."""
    batched = settings.max_num_batched_tokens or api_defaults(device, settings, release)[0]
    chunked_prefill = settings.enable_chunked_prefill
    version = parse_version(release.defaults.release)
    if device.platform == "cpu" and geometry.attention == "mla" and not runs_amx_mla(device, version,
                                                                                      settings.attention_backend):
        chunked_prefill = False            # platforms/cpu.py: the reference MLA kernel turns chunked prefill off
        batched = max(max_model_len, 2048) if settings.max_num_batched_tokens is None else batched
    elif chunked_prefill is False and settings.max_num_batched_tokens is None:
        batched = max(max_model_len, batched)
    pp = max(1, settings.pipeline_parallel_size)
    # Async scheduling (on by default on GPUs, always off on the CPU platform) overlaps two batches; the
    # windows hold every batch in flight from 0.26, one before (kv_layout.IN_FLIGHT_TOKENS)
    concurrent_batches = 2 if pp == 1 and device.platform != "cpu" else pp
    if not IN_FLIGHT_TOKENS.holds(version):
        concurrent_batches = 1
    # prefix caching is on by default (off on CPU for MLA); on a hybrid it keeps states aligned, or
    # (before 0.28, a class that supports it) one state per block of tokens
    mode = mamba_cache_mode(geometry, settings, version)
    encoder_tokens = 0
    if CROSS in geometry.layout.kinds:
        default_batched, default_seqs = api_defaults(device, settings, release)
        encoder_tokens = max_num_encoder_input_tokens(
            settings.max_num_batched_tokens, settings.enable_chunked_prefill, default_batched,
            settings.max_num_seqs or default_seqs, max_model_len, geometry.max_source_positions, version.parts)
    return Demand(max_model_len=max_model_len, max_in_flight_tokens=concurrent_batches * batched,
                  mamba_align=mode == "align", mamba_all=mode == "all", encoder_tokens=encoder_tokens)
