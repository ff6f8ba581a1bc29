"""Bytes per token: of one KV element, one attention layer, each cache layer, and one recurrent
layer's state, as vLLM's KV cache specs size them (pure; v1/kv_cache_interface.py)."""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.layers import MAMBA, SLIDING
from kvwatch.planner.minimax_sparse import with_indexers
from kvwatch.planner.rules import FP8_KV_DTYPES, PACKED_MLA_BYTES
from kvwatch.planner.scheduler import prefix_caching_on
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.gdn_checkpoint import gdn_checkpoint_alignment
from kvwatch.vllm_releases.kv_layout import SSM_FLOAT32_WITH_AVX512_BF16, mla_entry_elements
from kvwatch.vllm_releases.skip_layer_pages import MLA_SKIP_LAYERS

_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class TokenBytes:
    """One worker's bytes per token, as the plan's later steps read them."""

    dtype_bytes: int                 # one KV element
    model_bytes: int                 # one element in the weights' and states' dtype
    per_token_layer: int             # one attention layer (MLA: the latent, or its packed layout)
    packed_extra: int                # what a packed MLA layout adds to the latent, per token and layer
    skip_layers: tuple[str, ...]     # --kv-cache-dtype-skip-layers, when the KV cache is quantized
    skip_token: int                  # one token of a layer kept in the model's dtype
    layer_token_bytes: tuple[int, ...]   # per cache layer in model order (a state layer: 0; indexers included)
    state_bytes: int                 # one recurrent layer's state (0: none)
    checkpoint_alignment: int | None   # the gated delta net's prefill checkpoint alignment


def token_sizes(geometry: ModelGeometry, settings: EngineSettings, device: Device, version: VllmVersion | None,
                env: dict[str, str]) -> TokenBytes:
    """The plan's step 3: the bytes of one token in each layer, and of one recurrent state."""
    kv_dtype = settings.kv_cache_dtype
    dtype_bytes = kv_dtype_bytes(kv_dtype, settings.dtype, geometry.config_dtype)
    model_bytes = kv_dtype_bytes("auto", settings.dtype, geometry.config_dtype)   # the weights' and states' dtype
    mla = geometry.attention == "mla"
    if mla:   # one latent per token; every TP rank holds all of it
        entry = mla_entry_elements(geometry.head_size, model_bytes, version, device.platform,
                                   env) * dtype_bytes   # 0.7.x pads it (kv_layout.py)
        per_token_layer = PACKED_MLA_BYTES.get(kv_dtype, entry)
        packed_extra = max(0, per_token_layer - entry)
    else:
        per_token_layer = token_bytes(geometry.num_kv_heads, geometry.head_size, settings, dtype_bytes,
                                      geometry.head_size_v)
        packed_extra = 0
    # Per cache layer where layers differ (Gemma 4: wider full-attention heads, fewer KV heads).
    # Layers kept out of quantization (--kv-cache-dtype-skip-layers) keep the model's dtype.
    # An MLA layer reads only its index there, and only from 0.26 (vllm_releases/skip_layer_pages.py).
    skip = settings.kv_cache_dtype_skip_layers if kv_dtype != "auto" else ()
    layer_skip = tuple(s for s in skip if s.isdigit()) if mla and MLA_SKIP_LAYERS.holds(version) \
        else () if mla else skip
    skip_token = mla_entry_elements(geometry.head_size, model_bytes, version, device.platform, env) * model_bytes \
        if mla else token_bytes(geometry.num_kv_heads, geometry.head_size, settings, model_bytes, geometry.head_size_v)
    layers = layer_token_bytes(geometry, settings, dtype_bytes, per_token_layer, model_bytes, layer_skip, skip_token)
    indexer = geometry.sparse_indexer   # MiniMax-M3: each sparse layer's indexer cache follows it
    layers = with_indexers(layers, indexer, indexer.token_bytes() if indexer else 0)
    return TokenBytes(dtype_bytes, model_bytes, per_token_layer, packed_extra, skip, skip_token, tuple(layers),
                      recurrent_state_bytes(geometry, settings, model_bytes, device, version),
                      prefill_checkpoint_alignment(geometry, settings, device, version))


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str, config_dtype: str | None) -> int:
    """Bytes per KV element: 8-bit names are 1; `auto` follows the model dtype."""
    if kv_cache_dtype in FP8_KV_DTYPES or kv_cache_dtype in PACKED_MLA_BYTES:
        return 1
    if kv_cache_dtype in _DTYPE_BYTES:
        return _DTYPE_BYTES[kv_cache_dtype]
    if model_dtype != "auto":
        return _DTYPE_BYTES.get(model_dtype, 2)
    # vLLM's auto dtype downcasts float32 (and a missing dtype) to the platform's first: bf16.
    return 2 if config_dtype in (None, "float32") else _DTYPE_BYTES.get(config_dtype, 2)


def prefill_checkpoint_alignment(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                                 version: VllmVersion | None) -> int | None:
    """The prefill checkpoint alignment of a Qwen gated delta net hybrid's state layers, where the
    release and the device make them export checkpoints (vllm_releases/gdn_checkpoint.py); None else."""
    state = geometry.layout.state
    if state is None or state.family != "gated_delta_net" or geometry.attention == "none":
        return None
    align = prefix_caching_on(geometry, settings, version)   # mamba_cache_mode "align"
    return gdn_checkpoint_alignment(version, device.platform, device.compute_capability, state.state_size, align,
                                    settings.gdn_prefill_backend)


def recurrent_state_bytes(geometry: ModelGeometry, settings: EngineSettings, model_bytes: int,
                          device: Device, version: VllmVersion | None = None) -> int:
    """One Mamba/linear-attention layer's state on one TP rank (MambaSpec.page_size_bytes before
    padding): conv state in --mamba-cache-dtype, SSM state in --mamba-ssm-cache-dtype, each
    "auto" meaning the model's dtype (the SSM state: the model's own choice where it has one)."""
    state = geometry.layout.state
    if state is None:
        return 0
    conv, ssm = state.element_counts(max(1, settings.tensor_parallel_size))
    conv_bytes = _DTYPE_BYTES.get(settings.mamba_cache_dtype, model_bytes)
    ssm_name = settings.mamba_ssm_cache_dtype if settings.mamba_ssm_cache_dtype != "auto" else state.ssm_dtype
    if device.platform == "cpu" and ssm_name != "float32" and _cpu_resets_ssm_to_float32(
            device, state.family, ssm_name, version):
        ssm_name = "float32"
    ssm_bytes = _DTYPE_BYTES.get(ssm_name or "", conv_bytes)
    return conv * conv_bytes + ssm * ssm_bytes


def _cpu_resets_ssm_to_float32(device: Device, family: str, ssm_name: str | None, version: VllmVersion | None) -> bool:
    """platforms/cpu.py: the accelerated CPU state kernels keep SSM states in float32 (16-bit kept
    only when asked for, by the gated-delta-net kernel) wherever AVX-512 BF16 is there; before 0.29,
    with AMX tiles only (vllm_releases/kv_layout.py SSM_FLOAT32_WITH_AVX512_BF16)."""
    if not SSM_FLOAT32_WITH_AVX512_BF16.holds(version):
        return device.cpu_amx
    return device.cpu_avx512_bf16 and not (family == "gated_delta_net" and ssm_name in ("float16", "bfloat16"))


def token_bytes(kv_heads: int, head_size: int, settings: EngineSettings, dtype_bytes: int,
                head_size_v: int | None = None) -> int:
    """One token of one attention layer on one TP rank: K and V of its KV heads (at least one head
    per rank: vLLM replicates KV heads when TP exceeds them); a V head of its own size where it
    differs (AttentionSpec.head_size_v: openPangu's sink attention, planner/static_sink.py)."""
    return max(1, kv_heads // settings.tensor_parallel_size) * (head_size + (head_size_v or head_size)) * dtype_bytes


def layer_token_bytes(geometry: ModelGeometry, settings: EngineSettings, dtype_bytes: int,
                      uniform: int, model_bytes: int = 0, skip: tuple[str, ...] = (),
                      skip_token: int | None = None) -> list[int]:
    """Bytes per token of each cache layer (a state layer: 0), in model order; a layer `skip` names
    (its index, or "sliding_window" for a sliding one: vLLM 0.33.0,
    vllm/model_executor/layers/attention/attention.py:300) in the model's dtype, `skip_token` bytes
    a token where the layers are alike (default: K and V of the model's heads)."""
    layout = geometry.layout

    def skipped(index: int, layer_kind: str) -> bool:
        return str(index) in skip or (layer_kind == SLIDING and "sliding_window" in skip)

    if layout.head_sizes is None or layout.kv_heads is None or geometry.attention == "mla":
        wide = uniform if not skip else skip_token if skip_token is not None else \
            token_bytes(geometry.num_kv_heads, geometry.head_size, settings, model_bytes, geometry.head_size_v)
        return [0 if layer_kind == MAMBA else wide if skipped(i, layer_kind) else uniform
                for i, layer_kind in enumerate(layout.kinds)]
    return [0 if layer_kind == MAMBA else
            token_bytes(heads, size, settings, model_bytes if skipped(i, layer_kind) else dtype_bytes)
            for i, (layer_kind, size, heads) in enumerate(zip(layout.kinds, layout.head_sizes, layout.kv_heads,
                                                              strict=True))]
