"""The KV cache plan: what vLLM will allocate for this model, these flags and this device (pure).

Follows vLLM 0.32: page size per layer (v1/kv_cache_interface.py), bytes per block and
num_blocks = available // bytes_per_block (v1/core/kv_cache_utils.py), one null block.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.architecture_kinds import unknown_reasons
from kvwatch.planner.architectures import IN_TRANSFORMERS
from kvwatch.planner.architectures import refusals as _architecture_refusals
from kvwatch.planner.backend_legality import backend_refusals
from kvwatch.planner.backends import BackendChoice, choose_backend, kernel_context, with_release_kernel_blocks
from kvwatch.planner.config_refusals import config_refusals
from kvwatch.planner.devices import Device, GiB
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.extensible_kv import effective_utilization, extensible_for
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.gpu_budget import GpuBudget, api_defaults, decoder_layer_bytes, estimate_budget, release_for
from kvwatch.planner.kv_dtype_refusal import mismatched_16bit_kv
from kvwatch.planner.kv_groups import (
    KvGroups,
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
from kvwatch.planner.layers import CHUNKED, MAMBA, SLIDING
from kvwatch.planner.predicted_refusal import (
    CONFIG_REFUSED,
    KV_CACHE_TOO_SMALL,
    MAMBA_CACHE_TOO_SMALL,
    NO_KV_CACHE_MEMORY,
    PredictedRefusal,
)
from kvwatch.planner.rules import FP8_KV_DTYPES, PACKED_MLA_BYTES, BackendRule, BlockSizeRule, RuleSet
from kvwatch.planner.scheduler import prefix_caching_on, request_demand
from kvwatch.planner.versions import VllmVersion
from kvwatch.planner.weights import (
    gpu_weights_bytes,
    mla_absorbed_bytes,
    mxfp4_triton_hopper_bytes,
    replicated_linear_bytes,
)
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.gdn_checkpoint import GDN_CHECKPOINT_BLOCKS, gdn_checkpoint_alignment
from kvwatch.vllm_releases.hybrid_alignment import hybrid_alignment_for
from kvwatch.vllm_releases.kv_layout import (
    CHUNKED_LOCAL_KEEPS_HYBRID_MANAGER,
    HYBRID_PROMOTION_REFUSED,
    HYBRID_PROMOTION_REFUSED_BEFORE,
    HYBRID_PROMOTION_WORDING,
    KV_PAGE_UNIFICATION,
    MAMBA2_PREFILL_CHECKPOINT,
    NULL_BLOCK_RESERVED_IN_CHECK,
    SLIDING_BLOCK_DIVIDES_PRIMARY,
    SLIDING_BLOCK_FROM_KERNEL,
    SLIDING_BLOCK_WITHIN_PRIMARY_PAGE,
    SSM_FLOAT32_WITH_AVX512_BF16,
    grouping_rule_for,
    mla_entry_elements,
)
from kvwatch.vllm_releases.kv_tokens_report import reported_kv_tokens
from kvwatch.vllm_releases.model_runner_v2 import env_refusals
from kvwatch.vllm_releases.release_defaults import defaults_for
from kvwatch.vllm_releases.skip_layer_pages import MLA_SKIP_LAYERS, SKIP_LAYER_PAGE_ALIGNMENT

_DTYPE_BYTES = {"float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4}

_CACHE_CONFIG_DEFAULT_BLOCK_SIZE = 16    # vLLM 0.32 config/cache.py:72 CacheConfig.DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class MemoryInputs:
    """What decides the KV memory, gathered by the caller (environment, NVML, state file)."""

    cpu_kv_space_bytes: int | None = None    # VLLM_CPU_KVCACHE_SPACE, in bytes
    weights_bytes: int | None = None         # weight files on disk
    non_kv_bytes: int | None = None          # measured on an earlier run of this engine
    vllm_version: VllmVersion | None = None  # the vLLM the plan is for (None: the newest kvwatch knows)
    vllm_env: tuple[tuple[str, str], ...] = ()   # the environment variables its memory profile reads
    flashinfer_installed: bool | None = None  # FlashInfer beside that vLLM (None: not known)


NO_MEMORY_INPUTS = MemoryInputs()   # nothing measured: the planner's own defaults


@dataclass(frozen=True)
class Plan:
    model: str
    device: str
    compute_capability: str
    attention: str
    backend: str | None
    block_size: int
    block_size_source: str               # "flag", "backend default", "platform override"
    kv_cache_dtype: str
    dtype_bytes: int
    kv_bytes_per_token_per_layer: int
    kv_bytes_per_token: int              # all layers on one rank
    page_size_bytes: int                 # one layer, one block
    layers_per_block: int
    bytes_per_block: int
    kv_memory_bytes: int                 # memory given to the KV cache
    kv_memory_source: str
    num_blocks: int
    kv_cache_tokens: int
    max_model_len: int | None
    max_concurrency: float | None
    estimated: bool
    padding_bytes: dict[str, int]
    warnings: tuple[PredictedRefusal, ...] = field(default=())
    backend_reasons: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The figures above are one rank's: one data-parallel engine core (each sizes its own KV
    # cache alone), and of it the pipeline stage with the most layers (vLLM takes the minimum
    # number of blocks over its workers). An engine with N DP ranks holds N such caches.
    data_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_cache_groups: int = 1              # vLLM's KV cache groups (hybrid models: several)
    padding_layers: int = 0               # empty layer slots vLLM adds to the last group of a kind
    blocks_per_request: int = 0           # blocks one request of max_model_len takes, over all groups
    recurrent_state_bytes: int = 0        # one Mamba/linear-attention layer's state, before padding
    max_model_len_fitted: bool = False    # --max-model-len auto: the length vLLM fits to the KV cache
    gpu_budget: GpuBudget | None = None   # an estimated GPU plan: vLLM's split of the card, part by part
    # Layer types kvwatch has no rule for (planned as full attention): the figures are then unsure.
    unknown_layer_types: tuple[str, ...] = ()
    # GPU only: the sparse-attention indexer's cache, every layer, one token (DeepSeek-V3.2, GLM-5);
    # counted per token, not in the blocks above (its grouping with the latent is not planned).
    indexer_bytes_per_token: int = 0

    @property
    def engine_num_blocks(self) -> int:
        return self.num_blocks * self.data_parallel_size

    @property
    def engine_kv_bytes(self) -> int:
        return self.planned_kv_bytes * self.data_parallel_size

    @property
    def source(self) -> str:
        """How the KV memory is known: "exact" (a flag or the environment fixes it), "learned" (from
        the engine's own profile on an earlier launch) or "estimated" (from config.json and the card)."""
        if self.unknown_layer_types:
            return "unknown"
        if self.estimated:
            return "estimated"
        return "learned" if self.kv_memory_source.startswith("learned") else "exact"

    @property
    def will_fail(self) -> bool:
        return any(w.certain for w in self.warnings)

    @property
    def planned_kv_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def padding_ratio(self) -> float:
        allocated = self.planned_kv_bytes
        return sum(self.padding_bytes.values()) / allocated if allocated else 0.0

    def fixes(self, certain_only: bool = True) -> FlagChange:
        """Every warning's fix in turn (certain ones only, by default), a later one deciding a flag."""
        merged = NO_CHANGE
        for w in self.warnings:
            if w.certain or not certain_only:
                merged = merged.then(w.fix)
        return merged

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["warnings"] = [w.to_json() for w in self.warnings]
        out["backend_reasons"] = {k: list(v) for k, v in self.backend_reasons.items()}
        out["planned_kv_bytes"] = self.planned_kv_bytes
        out["padding_ratio"] = self.padding_ratio
        out["will_fail"] = self.will_fail
        out["engine_num_blocks"] = self.engine_num_blocks
        out["engine_kv_bytes"] = self.engine_kv_bytes
        out["source"] = self.source
        out["gpu_budget"] = self.gpu_budget.to_json() if self.gpu_budget is not None else None
        return out


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


def _gpu_budget(device: Device, settings: EngineSettings, geometry: ModelGeometry, memory: MemoryInputs,
                model_bytes: int, max_model_len: int) -> GpuBudget:
    """GPU: vLLM's own split of the card (planner/gpu_budget.py): total x utilization, minus the
    weights, the profile's activation peak, non-torch memory and, where the release counts them, CUDA graphs."""
    ranks = settings.tensor_parallel_size * settings.pipeline_parallel_size
    weights = memory.weights_bytes if memory.weights_bytes is not None \
        else _weights_from_geometry(geometry, model_bytes, settings, device)
    weights = (weights + _kernel_format_bytes(geometry, settings, device, memory.vllm_version, weights,
                                              model_bytes)) // ranks
    return estimate_budget(settings, device, geometry.weight_count, weights, model_bytes, max_model_len,
                           memory.vllm_version, dict(memory.vllm_env), memory.flashinfer_installed,
                           quantized_experts=geometry.quantization is not None or settings.quantization is not None,
                           mla=geometry.attention == "mla",
                           replicated_linear_bytes=replicated_linear_bytes(geometry.weight_count, geometry.quantization,
                                                                           model_bytes, settings.quantization)
                           if geometry.weight_count is not None else 0,
                           architectures=geometry.architectures, hybrid="mamba" in geometry.layer_kinds)


def _estimate_gpu_kv_memory(device: Device, settings: EngineSettings, geometry: ModelGeometry,
                            memory: MemoryInputs, model_bytes: int) -> int:
    """The KV memory on a GPU: learned from an earlier launch's non-KV memory, else estimated."""
    budget = _gpu_budget(device, settings, geometry, memory, model_bytes,
                         settings.max_model_len or geometry.default_max_model_len)
    if memory.non_kv_bytes is not None:
        return max(0, budget.requested_bytes - memory.non_kv_bytes)
    return budget.kv_cache_bytes


def _kernel_format_bytes(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                         version: VllmVersion | None, weights: int, model_bytes: int) -> int:
    """What the kernels' weight formats add to the checkpoint's `weights` (all ranks) once loaded:
    MXFP4 experts under the Triton backend on Hopper (weights.mxfp4_triton_hopper_bytes); V0 0.7.x's
    absorbed MLA matrices (weights.mla_absorbed_bytes, per rank: times the ranks)."""
    count = geometry.weight_count
    if count is None:
        return 0
    parts = (version or DEFAULT_RELEASE).parts
    method = str((geometry.quantization or {}).get("quant_method", "")).lower()
    if geometry.attention == "mla" and device.platform == "cuda":
        fp8 = method == "fp8" or settings.quantization == "fp8"
        ranks = settings.tensor_parallel_size * settings.pipeline_parallel_size
        absorbed = ranks * mla_absorbed_bytes(count, settings.tensor_parallel_size, model_bytes, fp8, parts)
        if absorbed and settings.cpu_offload_gb > 0:
            # made from the layer's own weights, so they stay in host memory with an offloaded layer
            layers = decoder_layer_bytes(weights, count, model_bytes)
            moved = min(1.0, settings.cpu_offload_gb * GiB * ranks / layers) if layers > 0 else 1.0
            absorbed = int(absorbed * (1.0 - moved))
        return absorbed
    if method != "mxfp4":
        return 0
    return mxfp4_triton_hopper_bytes(count, settings.tensor_parallel_size, device.compute_capability, parts)


def _weights_from_geometry(geometry: ModelGeometry, model_bytes: int, settings: EngineSettings, device: Device) -> int:
    """The weights from config.json's shapes and quantization_config (or `--quantization`); their
    files, when present, win (MemoryInputs.weights_bytes)."""
    if geometry.weight_count is None:
        return 0
    return gpu_weights_bytes(geometry.weight_count, geometry.quantization, model_bytes,
                             settings.quantization, settings.model, settings.tensor_parallel_size,
                             device.compute_capability)


def architecture_refusals(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                          version: VllmVersion | None = None) -> list[PredictedRefusal]:
    """vLLM's refusals of this architecture on this platform (planner/architectures.py)."""
    return [PredictedRefusal(FailureKind(r.kind), r.message, FlagChange(r.fix) if r.fix else NO_CHANGE)
            for r in _architecture_refusals(geometry, settings, device, version)]


def make_plan(geometry: ModelGeometry, settings: EngineSettings, device: Device, rules: RuleSet,
              memory: MemoryInputs = NO_MEMORY_INPUTS, allow_long_max_model_len: bool = False) -> Plan:
    """The planner's one entry point (pure): the KV cache vLLM will build for this model, these
    flags and this device, and what it will refuse. In order: the refusals of the configuration
    (config_refusals), the block size and backend vLLM will pick, the bytes per token and per block,
    the layers of one worker in vLLM's KV cache groups, the KV memory (a flag or the environment
    fixes it, else the learned non-KV memory, else vLLM's own profile estimated) and the blocks it
    holds, the padding by cause, and the predicted failures, each with the flag change that avoids it.
    The watchdog's entry is kvwatch.watchdog.preflight.plan_with_learned, the boundary's
    kvwatch.boundary.plan_loader.plan_command (they read config.json and the environment)."""
    refusals = config_refusals(geometry, settings, allow_long_max_model_len)
    # Plan the rest as vLLM would once the refused values are fixed (no division by a zero block).
    if settings.block_size is not None and settings.block_size <= 0:
        settings = replace(settings, block_size=None)
    release = release_for(memory.vllm_version, dict(memory.vllm_env))
    if not 0 < settings.gpu_memory_utilization <= 1:
        settings = replace(settings, gpu_memory_utilization=release.default_utilization,
                           gpu_memory_utilization_given=False)
    refusals += [PredictedRefusal(CONFIG_REFUSED, f"ValueError: {message}", NO_CHANGE)
                 for message in env_refusals((memory.vllm_version or DEFAULT_RELEASE).parts, dict(memory.vllm_env))]
    mismatched = mismatched_16bit_kv(settings, geometry.config_dtype, memory.vllm_version)
    if mismatched is not None:
        refusals.append(mismatched)
    refused = extensible_for(settings, device.platform, release.defaults).refusal
    if refused is not None:   # asked for where it cannot be: vLLM 0.34.0, vllm/config/vllm.py:3263
        refusals.append(PredictedRefusal(CONFIG_REFUSED, f"vLLM refuses it: {refused}",
                                         FlagChange(remove=("--enable-extensible-kv-cache",))))
        settings = replace(settings, enable_extensible_kv_cache=None)
    kv_dtype = settings.kv_cache_dtype
    attention_free = geometry.attention == "none"
    if device.platform == "cuda":   # the release's kernel block sizes for this model and card
        rules = with_release_kernel_blocks(rules, memory.vllm_version, kernel_context(geometry, device, settings))
    # A pure state-space model has no attention layer, so no attention backend to choose.
    choice = BackendChoice(None, (), {}) if attention_free else choose_backend(
        rules, device, geometry, kv_dtype, settings.block_size, settings.attention_backend)
    warnings: list[PredictedRefusal] = list(refusals) + architecture_refusals(geometry, settings, device,
                                                                                  memory.vllm_version)
    backend = choice.backend

    # -- block size: the flag, else the backend's preference; some platforms override both.
    # With no valid backend, the first in vLLM's order stands in: vLLM sizes the cache with it
    # before a kernel refuses (seen: CPU fp8 without AVX-512 sizes 128-token blocks, then fails).
    shape = backend or next((b for b in map(rules.backend, choice.candidates) if b is not None), None)
    block_size, block_source = _attention_block_size(shape, device, geometry, settings)
    if not attention_free:
        warnings.extend(backend_refusals(choice, rules, device, geometry, settings))

    # -- bytes: one token of one attention layer, one page.
    dtype_bytes = kv_dtype_bytes(kv_dtype, settings.dtype, geometry.config_dtype)
    model_bytes = kv_dtype_bytes("auto", settings.dtype, geometry.config_dtype)   # the weights' and states' dtype
    if geometry.attention == "mla":   # one latent per token; every TP rank holds all of it
        entry = mla_entry_elements(geometry.head_size, model_bytes, memory.vllm_version, device.platform,
                                   dict(memory.vllm_env)) * dtype_bytes   # 0.7.x pads it (kv_layout.py)
        per_token_layer = PACKED_MLA_BYTES.get(kv_dtype, entry)
        packed_extra = max(0, per_token_layer - entry)
    else:
        per_token_layer = _token_bytes(geometry.num_kv_heads, geometry.head_size, settings, dtype_bytes)
        packed_extra = 0
    # Per cache layer where layers differ (Gemma 4: wider full-attention heads, fewer KV heads).
    # Layers kept out of quantization (--kv-cache-dtype-skip-layers) keep the model's dtype.
    # An MLA layer reads only its index there, and only from 0.26 (vllm_releases/skip_layer_pages.py).
    skip = settings.kv_cache_dtype_skip_layers if kv_dtype != "auto" else ()
    mla = geometry.attention == "mla"
    layer_skip = tuple(s for s in skip if s.isdigit()) if mla and MLA_SKIP_LAYERS.holds(memory.vllm_version) \
        else () if mla else skip
    skip_token = mla_entry_elements(geometry.head_size, model_bytes, memory.vllm_version, device.platform,
                                    dict(memory.vllm_env)) * model_bytes if mla else \
        _token_bytes(geometry.num_kv_heads, geometry.head_size, settings, model_bytes)
    layer_token_bytes = _layer_token_bytes(geometry, settings, dtype_bytes, per_token_layer, model_bytes, layer_skip,
                                           skip_token)
    state_bytes = _recurrent_state_bytes(geometry, settings, model_bytes, device, memory.vllm_version)
    checkpoint_alignment = _gdn_checkpoint_alignment(geometry, settings, device, memory.vllm_version)
    if state_bytes and shape is not None and not attention_free:   # a hybrid: attention pages hold a state
        aligned = hybrid_block_size(hybrid_alignment_for(release.defaults.release), shape, block_size,
                                    per_token_layer, state_bytes, geometry.attention == "mla", checkpoint_alignment)
        if aligned > block_size:
            block_size, block_source = aligned, "raised so a page holds the recurrent state"
    shared_page = None
    if skip and shape is not None and SKIP_LAYER_PAGE_ALIGNMENT.holds(memory.vllm_version):
        hybrid_page = block_size * per_token_layer if state_bytes and not attention_free else None
        # the platform's pages per token: a FullAttentionSpec's, MLA's too (skip_layer_pages.py)
        primary_token, platform_skip_token = platform_skip_pages(1, geometry.head_size, dtype_bytes, model_bytes) \
            if mla else (per_token_layer, skip_token)
        grown, shared_page, _ = skip_layer_block_size(
            shape, block_size, primary_token, platform_skip_token, hybrid_page if hybrid_page != state_bytes else None)
        if mla:
            shared_page = None   # no MLA spec pads to it
        if grown > block_size:
            block_size, block_source = grown, "raised so the quantized page covers the skip layers' page " \
                                              f"({SKIP_LAYER_PAGE_ALIGNMENT.source})"
    derived_len = geometry.default_max_model_len
    max_len = settings.max_model_len or derived_len
    if attention_free and not prefix_caching_on(geometry, settings):
        # model_executor/models/config.py MambaModelConfig: without prefix caching a state block
        # covers max_model_len, and the engine's block size is its groups' smallest
        block_size, block_source = max_len, "the max model len: one state block per request"
    elif attention_free:
        # MambaModelConfig copies the block size in force when it runs, before any platform sets its
        # own default; with no attention layer nothing aligns it again (recorded on the CPU engine)
        block_size = settings.block_size or _CACHE_CONFIG_DEFAULT_BLOCK_SIZE
        block_source = "flag" if settings.block_size else "vLLM's CacheConfig default (no attention backend)"
    page = block_size * per_token_layer

    # -- the layers of one worker (the fullest pipeline stage), grouped as vLLM groups them.
    # Sliding-window layers start from a kernel block of their own in some releases (kv_layout.py).
    sliding_block = sliding_block_size(shape.block_sizes, block_size, SLIDING_BLOCK_FROM_KERNEL.holds(memory.vllm_version),
                                       SLIDING_BLOCK_WITHIN_PRIMARY_PAGE.holds(memory.vllm_version),
                                       SLIDING_BLOCK_DIVIDES_PRIMARY.holds(memory.vllm_version)) \
        if shape is not None else block_size
    groups, grouping_refusals = _kv_groups(geometry, settings, block_size, layer_token_bytes, state_bytes,
                                           memory.vllm_version, sliding_block, checkpoint_alignment is not None,
                                           shared_page, shape.block_sizes if shape is not None else ())
    warnings.extend(grouping_refusals)
    bytes_per_block = groups.bytes_per_block
    # The engine's block size is its groups' smallest (vLLM 0.28.0, vllm/v1/engine/core.py:322).
    smallest_group_block = min((groups.specs[g[0]].block_size for g in groups.groups), default=block_size)
    if smallest_group_block < block_size:
        rule = SLIDING_BLOCK_WITHIN_PRIMARY_PAGE if SLIDING_BLOCK_WITHIN_PRIMARY_PAGE.holds(memory.vllm_version) \
            else SLIDING_BLOCK_FROM_KERNEL
        block_size = smallest_group_block
        block_source = f"the sliding-window layers' blocks, unified to the full ones' page ({rule.source})"
    warnings.extend(_shared_layer_warnings(geometry, settings, groups))

    # -- memory for the KV cache, and blocks.
    kv_memory, kv_source, estimated, budget = _kv_memory(device, settings, geometry, memory, model_bytes)
    num_blocks = kv_memory // bytes_per_block
    if settings.num_gpu_blocks_override is not None:
        num_blocks, kv_source = settings.num_gpu_blocks_override, "--num-gpu-blocks-override"
        estimated = False
    # vLLM plans one request against the blocks the null block leaves (get_kv_cache_configs), from
    # 0.29; before, against the whole memory (vllm_releases/kv_layout.py NULL_BLOCK_RESERVED_IN_CHECK).
    null_block = bytes_per_block if NULL_BLOCK_RESERVED_IN_CHECK.holds(memory.vllm_version) else 0
    check_memory = num_blocks * bytes_per_block - null_block \
        if settings.num_gpu_blocks_override is not None else kv_memory - null_block

    demand = request_demand(geometry, settings, device, max_len, release)
    if settings.max_model_len_auto and settings.max_model_len is None:
        fitted = groups.auto_fit_max_model_len(check_memory, demand, derived_len) if check_memory > 0 else 0
        max_len = min(derived_len, fitted) if fitted > 0 else derived_len
        demand = request_demand(geometry, settings, device, max_len, release)
    tokens, concurrency = groups.capacity(num_blocks, demand) if num_blocks else (0, 0.0)
    tokens = reported_kv_tokens(tokens, num_blocks, len(groups.groups), block_size, memory.vllm_version)

    if num_blocks <= 1 or check_memory <= 0:
        warnings.append(_no_memory_warning(device, settings, geometry, memory, model_bytes,
                                           kv_memory, bytes_per_block, estimated, budget))
    elif groups.memory_for(demand, max_len) > check_memory:
        fit = groups.auto_fit_max_model_len(check_memory, demand, max_len)
        needed = groups.blocks_per_request(demand)
        warnings.append(PredictedRefusal(
            KV_CACHE_TOO_SMALL,
            f"max model len {max_len} needs {needed} blocks per request; "
            f"the KV cache holds {num_blocks - 1} usable blocks (max model len {fit} fits)",
            FlagChange({"--max-model-len": fit}) if fit > 0 else NO_CHANGE, certain=not estimated))
    seqs = settings.max_num_seqs or api_defaults(device, settings, release)[1]
    if state_bytes and device.platform == "cuda" and not settings.enforce_eager and 1 < num_blocks < seqs:
        warnings.append(PredictedRefusal(
            MAMBA_CACHE_TOO_SMALL,
            f"max num seqs {seqs} exceeds the {num_blocks} Mamba cache blocks: vLLM refuses to capture "
            f"CUDA graphs (each decoding sequence needs one block)", FlagChange({"--max-num-seqs": num_blocks}),
            certain=not estimated))

    by_cause = groups.padding_bytes(num_blocks, demand)
    padding = {
        "packed_layout": packed_extra * block_size * groups.group_size * num_blocks,
        "page_padding": by_cause["page_padding"],
        "state_padding": by_cause["state_padding"],
        "alignment": 0,
        "layer_padding": by_cause["layer_padding"],
        "remainder": max(0, kv_memory - num_blocks * bytes_per_block)
        if settings.num_gpu_blocks_override is None else 0,
        "null_block": bytes_per_block if num_blocks else 0,
    }
    return Plan(
        model=settings.model, device=device.name, compute_capability=device.sm,
        attention=geometry.attention, backend=backend.name if backend else None,
        block_size=block_size, block_size_source=block_source, kv_cache_dtype=kv_dtype,
        dtype_bytes=dtype_bytes, kv_bytes_per_token_per_layer=per_token_layer,
        kv_bytes_per_token=sum(layer_token_bytes), page_size_bytes=page,
        layers_per_block=groups.group_size, bytes_per_block=bytes_per_block,
        kv_memory_bytes=kv_memory, kv_memory_source=kv_source, num_blocks=num_blocks,
        kv_cache_tokens=tokens, max_model_len=max_len, max_concurrency=concurrency,
        estimated=estimated, padding_bytes=padding, warnings=tuple(warnings),
        backend_reasons=choice.reasons, data_parallel_size=max(1, settings.data_parallel_size),
        pipeline_parallel_size=max(1, settings.pipeline_parallel_size),
        kv_cache_groups=len(groups.groups), padding_layers=groups.padding_layers,
        blocks_per_request=groups.blocks_per_request(demand),
        recurrent_state_bytes=state_bytes, max_model_len_fitted=settings.max_model_len_auto, gpu_budget=budget,
        unknown_layer_types=geometry.layout.unknown_layer_types + architecture_unknowns(geometry, memory.vllm_version),
        indexer_bytes_per_token=geometry.indexer_bytes_per_token if device.platform == "cuda" else 0)


def _attention_block_size(shape: BackendRule | None, device: Device, geometry: ModelGeometry,
                          settings: EngineSettings) -> tuple[int, str]:
    """The block size of the attention layers and where it comes from: the flag, else the backend's
    preference; some platforms override both."""
    # platforms/cpu.py: with AMX tiles MLA runs on the AMX kernel, which forces no block size
    # (the CPU's 128 by default, the flag otherwise); without them the reference kernel forces 16.
    amx_mla = device.platform == "cpu" and device.cpu_amx and geometry.attention == "mla"
    if shape is not None and shape.forced_block_size is not None and not amx_mla:
        return shape.forced_block_size, "platform override"
    if amx_mla and settings.block_size is None:
        return 128, "platform default (AMX MLA kernel)"
    if settings.block_size is not None:
        return settings.block_size, "flag"
    return (shape.preferred_block_size if shape else 16), "backend default"


def _kv_memory(device: Device, settings: EngineSettings, geometry: ModelGeometry, memory: MemoryInputs,
               model_bytes: int) -> tuple[int, str, bool, GpuBudget | None]:
    """The memory given to the KV cache, where it comes from, whether it is estimated, and the GPU
    budget it was estimated from: a flag or the environment fixes it, else the learned non-KV
    memory, else vLLM's own profile estimated."""
    if device.platform == "cpu" and memory.cpu_kv_space_bytes:
        return memory.cpu_kv_space_bytes, "VLLM_CPU_KVCACHE_SPACE", False, None
    if settings.kv_cache_memory_bytes is not None:
        return settings.kv_cache_memory_bytes, "--kv-cache-memory-bytes", False, None
    if device.platform == "cuda" and device.total_memory_bytes and memory.non_kv_bytes is not None:
        return (_estimate_gpu_kv_memory(device, settings, geometry, memory, model_bytes),
                "learned: total x utilization - the non-KV memory of an earlier launch", False, None)
    if device.platform == "cuda" and device.total_memory_bytes:
        budget = _gpu_budget(device, settings, geometry, memory, model_bytes,
                             settings.max_model_len or geometry.default_max_model_len)
        return (budget.kv_cache_bytes, "estimate: total x utilization - weights - activation - non-torch",
                True, budget)
    return 4 * GiB, "estimate: unknown device memory", True, None


def architecture_unknowns(geometry: ModelGeometry, version: VllmVersion | None) -> tuple[str, ...]:
    """What the release's architecture table says kvwatch cannot classify about this model."""
    return unknown_reasons(geometry.architectures, dict.fromkeys(geometry.present_fields, True),
                           MAMBA in geometry.layout.kinds, str(version) if version else None, IN_TRANSFORMERS)


def _no_memory_warning(device: Device, settings: EngineSettings, geometry: ModelGeometry,
                       memory: MemoryInputs, model_bytes: int, kv_memory: int, bytes_per_block: int,
                       estimated: bool, budget: GpuBudget | None) -> PredictedRefusal:
    """No KV block fits, and the flag that frees one: `budget` is the estimated split the KV memory
    came from (None: a flag, the CPU's space or a learned figure set it)."""
    message = f"no memory is left for KV cache blocks ({kv_memory:,} B for {bytes_per_block:,} B per block)"
    if settings.kv_cache_memory_bytes is not None:   # the flag sets the KV memory: no other flag moves it
        return PredictedRefusal(NO_KV_CACHE_MEMORY, message + "; --kv-cache-memory-bytes sets it: raise it",
                                NO_CHANGE, certain=not estimated)
    current = effective_utilization(settings, device.platform, defaults_for(memory.vllm_version or DEFAULT_RELEASE))
    if device.platform == "cuda" and device.total_memory_bytes and current < 0.95:
        higher = replace(settings, gpu_memory_utilization=0.95, gpu_memory_utilization_given=True)
        if _estimate_gpu_kv_memory(device, higher, geometry, memory, model_bytes) >= 2 * bytes_per_block:
            return PredictedRefusal(NO_KV_CACHE_MEMORY, message, FlagChange({"--gpu-memory-utilization": 0.95}),
                            certain=not estimated)
    # The profile's peak grows with its dummy sequences (the sampler's logits; V0 Llama 3.2 Vision's
    # one image each): the most sequences, halving, that leave the KV cache two blocks.
    seqs = budget.max_num_seqs if budget is not None else 1
    while seqs > 1:
        seqs //= 2
        fewer = replace(settings, max_num_seqs=seqs)
        if _estimate_gpu_kv_memory(device, fewer, geometry, memory, model_bytes) >= 2 * bytes_per_block:
            return PredictedRefusal(NO_KV_CACHE_MEMORY, message + "; the memory profile's peak grows with "
                                    "max_num_seqs", FlagChange({"--max-num-seqs": seqs}), certain=not estimated)
    return PredictedRefusal(NO_KV_CACHE_MEMORY, message + "; no flag frees enough: more GPUs "
                    "(--tensor-parallel-size), a quantized checkpoint or a smaller model", NO_CHANGE,
                    certain=not estimated)


def _gdn_checkpoint_alignment(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                              version: VllmVersion | None) -> int | None:
    """The prefill checkpoint alignment of a Qwen gated delta net hybrid's state layers, where the
    release and the device make them export checkpoints (vllm_releases/gdn_checkpoint.py); None else."""
    state = geometry.layout.state
    if state is None or state.family != "gated_delta_net" or geometry.attention == "none":
        return None
    align = prefix_caching_on(geometry, settings, version)   # mamba_cache_mode "align"
    return gdn_checkpoint_alignment(version, device.platform, device.compute_capability, state.state_size, align,
                                    settings.gdn_prefill_backend)


def _recurrent_state_bytes(geometry: ModelGeometry, settings: EngineSettings, model_bytes: int,
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


def _token_bytes(kv_heads: int, head_size: int, settings: EngineSettings, dtype_bytes: int) -> int:
    """One token of one attention layer on one TP rank: K and V of its KV heads (at least one head
    per rank: vLLM replicates KV heads when TP exceeds them)."""
    return max(1, kv_heads // settings.tensor_parallel_size) * 2 * head_size * dtype_bytes


def _layer_token_bytes(geometry: ModelGeometry, settings: EngineSettings, dtype_bytes: int,
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
            _token_bytes(geometry.num_kv_heads, geometry.head_size, settings, model_bytes)
        return [0 if layer_kind == MAMBA else wide if skipped(i, layer_kind) else uniform
                for i, layer_kind in enumerate(layout.kinds)]
    return [0 if layer_kind == MAMBA else
            _token_bytes(heads, size, settings, model_bytes if skipped(i, layer_kind) else dtype_bytes)
            for i, (layer_kind, size, heads) in enumerate(zip(layout.kinds, layout.head_sizes, layout.kv_heads,
                                                              strict=True))]


def _kv_groups(geometry: ModelGeometry, settings: EngineSettings, block_size: int, token_bytes: list[int],
               state_bytes: int, version: VllmVersion | None = None,
               sliding_block: int | None = None, gdn_checkpoint: bool = False, shared_page: int | None = None,
               kernel_sizes: tuple[BlockSizeRule, ...] = ()) -> tuple[KvGroups, list[PredictedRefusal]]:
    """The groups of one worker's layers, and vLLM's refusal of them where it refuses them;
    `token_bytes` per cache layer, `sliding_block` the block a sliding-window layer starts from
    (default: the block size in force), `gdn_checkpoint` whether the gated delta net layers export
    prefill checkpoints (vllm_releases/gdn_checkpoint.py), `shared_page` the skip layers' padded page
    that sliding-window layers pad up to (vllm_releases/skip_layer_pages.py)."""
    kinds = list(geometry.layout.kinds)
    if settings.pipeline_parallel_size > 1:   # the first stage holds the most layers
        per_stage = -(-len(kinds) // settings.pipeline_parallel_size)
        kinds, token_bytes = kinds[:per_stage], token_bytes[:per_stage]
    pages = [block_size * b for b in token_bytes]
    rule = grouping_rule_for(version)
    refusals = []
    if settings.disable_hybrid_kv_cache_manager:
        if promotion_refused(kinds, [p for k, p in zip(kinds, pages, strict=True) if k != MAMBA], rule.uniform_type):
            wording = HYBRID_PROMOTION_REFUSED if HYBRID_PROMOTION_WORDING.holds(version) \
                else HYBRID_PROMOTION_REFUSED_BEFORE
            refusals.append(PredictedRefusal(
                CONFIG_REFUSED, f"ValueError: {wording} (--disable-hybrid-kv-cache-manager keeps state layers "
                f"beside attention layers, which vLLM cannot make one type)",
                FlagChange(remove=("--disable-hybrid-kv-cache-manager",))))
        kinds = promote_local_layers(kinds)
    elif CHUNKED in kinds and not CHUNKED_LOCAL_KEEPS_HYBRID_MANAGER.holds(version):
        kinds = promote_local_layers(kinds)   # the release turns the hybrid manager off by itself
    checkpoints = geometry.layout.state.checkpoint_blocks \
        if geometry.layout.state and MAMBA2_PREFILL_CHECKPOINT.holds(version) else 0
    if gdn_checkpoint:
        checkpoints = GDN_CHECKPOINT_BLOCKS
    specs = layer_specs(kinds, pages, block_size, geometry.layout.window, state_bytes, checkpoints, sliding_block,
                        shared_page, kernel_sizes)
    if pages_refused(specs, KV_PAGE_UNIFICATION.holds(version), rule.uniform_type):
        refusals.append(PredictedRefusal(
            CONFIG_REFUSED, f"NotImplementedError: vLLM {version} groups layers of different types only when their "
            f"pages are the same size ({KV_PAGE_UNIFICATION.before}); page unification came in "
            f"{KV_PAGE_UNIFICATION.source}", NO_CHANGE))
    return kv_groups(specs, rule.near_equal, rule.strided), refusals


def _shared_layer_warnings(geometry: ModelGeometry, settings: EngineSettings, groups: KvGroups) -> list[PredictedRefusal]:
    """vLLM 0.32 sizes the cache, then fails to build the attention backends when a KV-shared layer
    joins a group whose layers differ in page size (Gemma 4 with --disable-hybrid-kv-cache-manager:
    one group of sliding and wide full layers): the group's per-layer specs
    (UniformTypeKVCacheSpecs) do not list the shared layer, and gpu_model_runner.py
    get_attn_backends_for_group raises KeyError on its name (recorded on the CPU engine)."""
    shared = geometry.layout.kv_shared_layers
    mixed = any(len({groups.specs[i].page_bytes for i in group}) > 1 for group in groups.groups)
    if not shared or not mixed:
        return []
    first = geometry.num_layers - shared
    fix = FlagChange(remove=("--disable-hybrid-kv-cache-manager",)) if settings.disable_hybrid_kv_cache_manager \
        else NO_CHANGE
    return [PredictedRefusal(CONFIG_REFUSED,
                     f"KeyError: 'model.layers.{first}.self_attn.attn': vLLM sizes this cache, then fails to set up "
                     f"attention for layer {first}, which reads another layer's cache from a KV cache group whose "
                     f"layers differ in page size", fix)]


