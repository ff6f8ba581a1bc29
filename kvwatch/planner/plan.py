"""The KV cache plan: what vLLM will allocate for this model, these flags and this device (pure).

Follows vLLM's own order: page size per layer (v1/kv_cache_interface.py), bytes per block and
num_blocks = available // bytes_per_block (v1/core/kv_cache_utils.py), one null block. make_plan runs
the steps below in turn; the bytes per token are kv_bytes.py's, the KV memory kv_memory.py's.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner import deepseek_v4
from kvwatch.planner.architecture_kinds import builds_no_cache, unknown_reasons
from kvwatch.planner.architectures import IN_TRANSFORMERS
from kvwatch.planner.architectures import refusals as _architecture_refusals
from kvwatch.planner.backend_legality import backend_refusals
from kvwatch.planner.backends import (
    BackendChoice,
    attention_block_size,
    choose_backend,
    kernel_context,
    with_release_kernel_blocks,
)
from kvwatch.planner.config_refusals import config_refusals
from kvwatch.planner.cpu_mla import AMX_MLA, runs_amx_mla
from kvwatch.planner.cross_attention import CROSS, cross_bytes_per_request, per_token_bytes
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.extensible_kv import extensible_for
from kvwatch.planner.flag_change import NO_CHANGE, FlagChange
from kvwatch.planner.free_memory import start_refusal
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.gpu_budget import GpuBudget, Release, api_defaults, release_for, utilization
from kvwatch.planner.hidden_states import with_draft_caches
from kvwatch.planner.inkling import RING_BLOCK_SOURCE, ring_dtype_refusal, ring_promotion_refusal, ring_specs
from kvwatch.planner.kv_bytes import TokenBytes, token_sizes
from kvwatch.planner.kv_dtype_refusal import mismatched_16bit_kv
from kvwatch.planner.kv_groups import (
    Demand,
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
from kvwatch.planner.kv_memory import NO_MEMORY_INPUTS, MemoryInputs, kv_memory, no_memory_warning
from kvwatch.planner.layers import CHUNKED, FULL, MAMBA
from kvwatch.planner.minimax_sparse import sparse_block_size, with_indexers
from kvwatch.planner.mtp_draft import command_unplanned_draft, draft_warning, with_mtp_draft
from kvwatch.planner.no_kv_cache import NO_KV_CACHE_ATTENTION, NO_KV_CACHE_SOURCE
from kvwatch.planner.own_packing import own_packing, with_packed_draft
from kvwatch.planner.predicted_refusal import (
    CONFIG_REFUSED,
    KV_CACHE_TOO_SMALL,
    MAMBA_CACHE_TOO_SMALL,
    PredictedRefusal,
)
from kvwatch.planner.rules import BackendRule, RuleSet
from kvwatch.planner.scheduler import mamba_cache_mode, prefix_caching_on, request_demand
from kvwatch.planner.scope import within_scope
from kvwatch.planner.static_sink import sink_backend, sink_refusals
from kvwatch.planner.voxtral_encoder import encoder_specs, encoder_unsure
from kvwatch.values.block_sizes import BlockSizeRule
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.gdn_checkpoint import GDN_CHECKPOINT_BLOCKS
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
    grouping_rule_for,
)
from kvwatch.vllm_releases.kv_tokens_report import reported_kv_tokens
from kvwatch.vllm_releases.model_runner_v2 import env_refusals
from kvwatch.vllm_releases.skip_layer_pages import SKIP_LAYER_PAGE_ALIGNMENT

# The planner's entry: make_plan, its inputs and its answer (the inputs' type lives with the KV memory it sizes).
__all__ = ["NO_MEMORY_INPUTS", "MemoryInputs", "Plan", "architecture_refusals", "architecture_unknowns", "make_plan"]


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
    # Why vLLM allocates no KV cache for this model (encoder-only: planner/no_kv_cache.py); "" when it does.
    no_kv_cache: str = ""
    # An encoder-decoder model's cross-attention, reserved per request whatever its length, all its
    # layers on one rank (planner/cross_attention.py); not in kv_bytes_per_token.
    cross_attention_bytes_per_request: int = 0

    @property
    def engine_num_blocks(self) -> int:
        return self.num_blocks * self.data_parallel_size

    @property
    def engine_kv_bytes(self) -> int:
        return self.planned_kv_bytes * self.data_parallel_size

    @property
    def source(self) -> str:
        """How the KV memory is known: "exact" (a flag or the environment fixes it), "learned" (from
        the engine's own profile on an earlier launch) or "estimated" (from config.json and the card);
        "none" where vLLM allocates no KV cache at all."""
        if self.unknown_layer_types:
            return "unknown"
        if self.no_kv_cache:
            return "none"
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


def architecture_refusals(geometry: ModelGeometry, settings: EngineSettings, device: Device,
                          version: VllmVersion | None = None) -> list[PredictedRefusal]:
    """vLLM's refusals of this architecture on this platform (planner/architectures.py)."""
    return [PredictedRefusal(FailureKind(r.kind), r.message, FlagChange(r.fix) if r.fix else NO_CHANGE)
            for r in _architecture_refusals(geometry, settings, device, version)]


def make_plan(geometry: ModelGeometry, settings: EngineSettings, device: Device, rules: RuleSet,
              memory: MemoryInputs = NO_MEMORY_INPUTS, allow_long_max_model_len: bool = False) -> Plan:
    """The planner's one entry point (pure): the KV cache vLLM will build for this model, these
    flags and this device, and what it will refuse, each refusal with the flag change that avoids
    it. The steps, in order: (1) the refusals of the configuration, (2) the backend vLLM will pick,
    (3) the bytes per token of each layer, (4) the block size, (5) the layers of one worker in vLLM's
    KV cache groups, (6) the KV memory and the blocks it holds, (7) the tokens and requests they
    hold, (8) the predicted failures of a cache too small, (9) the padding by cause.
    The watchdog's entry is kvwatch.watchdog.preflight.plan_with_learned, the boundary's
    kvwatch.boundary.plan_loader.plan_command (they read config.json and the environment)."""
    refusals = config_refusals(geometry, settings, allow_long_max_model_len)
    release = release_for(memory.vllm_version, dict(memory.vllm_env))
    settings = _plannable(settings, release)
    release_refused, settings = _release_refusals(geometry, settings, device, memory, release)
    refusals += release_refused
    rules, choice, shape = _backend(geometry, settings, device, rules, memory)
    warnings: list[PredictedRefusal] = list(refusals) + architecture_refusals(geometry, settings, device,
                                                                                  memory.vllm_version)
    if no_cache := builds_no_cache(geometry.architectures, str(memory.vllm_version) if memory.vllm_version else None):
        return _no_kv_cache_plan(settings.model, no_cache, settings, device,
                                settings.max_model_len or geometry.default_max_model_len, warnings)
    # DeepSeek-V4/V4.1, Step5, GLM-5-Next: cache kinds of their own and their packing (planner/own_packing.py)
    if (kv := own_packing(geometry, settings, device, memory.vllm_version)) is not None:
        return _packed_plan(with_packed_draft(geometry, kv), kv, settings, device, memory, release, warnings)
    if geometry.attention != "none":
        warnings.extend(backend_refusals(choice, rules, device, geometry, settings))
    geometry = with_mtp_draft(geometry, settings)   # an MTP draft's layers and weights (planner/mtp_draft.py)
    sizes = token_sizes(geometry, settings, device, memory.vllm_version, dict(memory.vllm_env))
    block_size, block_source, shared_page = _block_size(geometry, settings, device, memory, release, shape, sizes)
    page = block_size * sizes.per_token_layer   # before the groups settle the engine's block size
    groups, block_size, block_source = _layers(geometry, settings, memory.vllm_version, shape, sizes, block_size,
                                               block_source, shared_page, warnings)
    groups, hidden_draft = with_draft_caches(groups, settings, geometry.hidden_size, sizes.model_bytes, memory.vllm_version,
                                             mamba_cache_mode(geometry, settings, memory.vllm_version), geometry.attention == "mla")
    # openPangu's sink layers: their TP split and block size (planner/static_sink.py)
    warnings.extend(sink_refusals(geometry.sink_len, geometry.num_kv_heads, settings.tensor_parallel_size, block_size))
    blocks = _blocks(device, settings, geometry, memory, sizes.model_bytes, groups.bytes_per_block,
                     choice.backend.name if choice.backend else None)
    max_len, demand = _fitted_length(geometry, settings, device, release, groups, blocks)
    tokens, concurrency = groups.capacity(blocks.num_blocks, demand) if blocks.num_blocks else (0, 0.0)
    tokens = reported_kv_tokens(tokens, blocks.num_blocks, len(groups.groups), block_size, memory.vllm_version)
    warnings.extend(_capacity_refusals(geometry, settings, device, memory, release, sizes, groups, blocks,
                                       demand, max_len))
    backend = choice.backend
    draft = command_unplanned_draft(geometry.mtp_draft, settings) if hidden_draft is None else hidden_draft
    unknown = geometry.layout.unknown_layer_types + architecture_unknowns(geometry, memory.vllm_version) + \
        tuple(u for u in (draft, encoder_unsure(geometry.layout.causal_encoder, settings)) if u)   # voxtral_encoder
    return Plan(
        model=settings.model, device=device.name, compute_capability=device.sm,
        attention=geometry.attention, backend=backend.name if backend else None,
        block_size=block_size, block_size_source=block_source, kv_cache_dtype=settings.kv_cache_dtype,
        dtype_bytes=sizes.dtype_bytes, kv_bytes_per_token_per_layer=sizes.per_token_layer,
        kv_bytes_per_token=per_token_bytes(tuple(with_indexers(geometry.layout.kinds, geometry.sparse_indexer, FULL)),
                                           sizes.layer_token_bytes), page_size_bytes=page,
        layers_per_block=groups.group_size, bytes_per_block=groups.bytes_per_block,
        kv_memory_bytes=blocks.kv_memory, kv_memory_source=blocks.source, num_blocks=blocks.num_blocks,
        kv_cache_tokens=tokens, max_model_len=max_len, max_concurrency=concurrency,
        estimated=blocks.estimated, padding_bytes=_padding(settings, sizes, groups, blocks, demand, block_size),
        warnings=(*within_scope(warnings, unknown), *draft_warning(draft)), backend_reasons=choice.reasons,
        data_parallel_size=max(1, settings.data_parallel_size),
        pipeline_parallel_size=max(1, settings.pipeline_parallel_size),
        kv_cache_groups=len(groups.groups), padding_layers=groups.padding_layers,
        blocks_per_request=groups.blocks_per_request(demand),
        recurrent_state_bytes=sizes.state_bytes, max_model_len_fitted=settings.max_model_len_auto,
        gpu_budget=blocks.budget,
        unknown_layer_types=unknown,
        indexer_bytes_per_token=geometry.indexer_bytes_per_token if device.platform == "cuda" else 0,
        cross_attention_bytes_per_request=cross_bytes_per_request(groups.specs, demand.encoder_tokens))


def _plannable(settings: EngineSettings, release: Release) -> EngineSettings:
    """Step 1's sequel: the settings planned as vLLM would once the refused values are fixed (no
    division by a zero block, the release's utilization for one out of range)."""
    if settings.block_size is not None and settings.block_size <= 0:
        settings = replace(settings, block_size=None)
    if not 0 < settings.gpu_memory_utilization <= 1:
        settings = replace(settings, gpu_memory_utilization=release.default_utilization,
                           gpu_memory_utilization_given=False)
    return settings


def _release_refusals(geometry: ModelGeometry, settings: EngineSettings, device: Device, memory: MemoryInputs,
                      release: Release) -> tuple[list[PredictedRefusal], EngineSettings]:
    """Step 1, the release's own refusals of the flags and the environment, in vLLM's words: the
    runner and removed variables (0.34), a 16-bit KV dtype other than the model's (0.33), the
    extensible KV cache asked for where it cannot be (0.34), a budget above the stated free memory
    (V1 from 0.9); and the settings planned once fixed."""
    out = [PredictedRefusal(CONFIG_REFUSED, f"ValueError: {message}", NO_CHANGE)
           for message in env_refusals((memory.vllm_version or DEFAULT_RELEASE).parts, dict(memory.vllm_env))]
    mismatched = mismatched_16bit_kv(settings, geometry.config_dtype, memory.vllm_version)
    if mismatched is not None:
        out.append(mismatched)
    if (ring_dtype := ring_dtype_refusal(geometry.layout, settings.dtype, geometry.config_dtype)) is not None:
        out.append(ring_dtype)   # Inkling's conv rings run in bfloat16 only (planner/inkling.py)
    refused = extensible_for(settings, device.platform, release.defaults).refusal
    if refused is not None:   # vLLM 0.34.0, vllm/config/vllm.py:3263
        out.append(PredictedRefusal(CONFIG_REFUSED, f"vLLM refuses it: {refused}",
                                    FlagChange(remove=("--enable-extensible-kv-cache",))))
        settings = replace(settings, enable_extensible_kv_cache=None)
    extensible = extensible_for(settings, device.platform, release.defaults)
    busy = start_refusal(device, release.engine, memory.vllm_version, utilization(settings, release, extensible),
                         extensible.sizing is not None)   # a start short of free memory (planner/free_memory.py)
    return out + ([busy] if busy is not None else []), settings


def _backend(geometry: ModelGeometry, settings: EngineSettings, device: Device, rules: RuleSet,
             memory: MemoryInputs) -> tuple[RuleSet, BackendChoice, BackendRule | None]:
    """Step 2: the rules in force, the backend vLLM picks, and the backend whose block sizes shape the
    cache. With no valid backend, the first in vLLM's order stands in: vLLM sizes the cache with it
    before a kernel refuses (seen: CPU fp8 without AVX-512 sizes 128-token blocks, then fails)."""
    if device.platform == "cuda":   # the release's kernel block sizes for this model and card
        rules = with_release_kernel_blocks(rules, memory.vllm_version, kernel_context(geometry, device, settings))
    # A pure state-space model has no attention layer, so no attention backend to choose.
    requested = sink_backend(geometry.sink_len, device.platform) or settings.attention_backend
    if geometry.attention == "mla" and runs_amx_mla(device, memory.vllm_version, requested):
        requested = AMX_MLA   # the host's AMX tiles pick it (planner/cpu_mla.py)
    choice = BackendChoice(None, (), {}) if geometry.attention == "none" else choose_backend(
        rules, device, geometry, settings.kv_cache_dtype, settings.block_size, requested)
    shape = choice.backend or next((b for b in map(rules.backend, choice.candidates) if b is not None), None)
    return rules, choice, shape


def _block_size(geometry: ModelGeometry, settings: EngineSettings, device: Device, memory: MemoryInputs,
                release: Release, shape: BackendRule | None, sizes: TokenBytes) -> tuple[int, str, int | None]:
    """Step 4: the block size, where it comes from, and the skip layers' shared page (None: none).
    The flag, else the backend's preference (some platforms override both); raised so a hybrid's page
    holds the recurrent state, and so a quantized page covers the skip layers' page."""
    version, attention_free = memory.vllm_version, geometry.attention == "none"
    default_block = release.defaults.block_size   # vLLM's default --block-size (vllm_releases/defaults.py)
    block_size, block_source = attention_block_size(shape, settings, default_block)
    if shape is not None and settings.block_size is None and device.platform == "cuda" and \
            (common := sparse_block_size(geometry.sparse_indexer, geometry.num_layers, shape.block_sizes, default_block)):
        block_size, block_source = common   # MiniMax-M3: its sparse and indexer backends join the dense one
    state_bytes, mla = sizes.state_bytes, geometry.attention == "mla"
    if state_bytes and shape is not None and not attention_free:   # a hybrid: attention pages hold a state
        aligned = hybrid_block_size(hybrid_alignment_for(release.defaults.release), shape, block_size,
                                    sizes.per_token_layer, state_bytes, mla, sizes.checkpoint_alignment)
        if aligned > block_size:
            block_size, block_source = aligned, "raised so a page holds the recurrent state"
    shared_page = None
    if sizes.skip_layers and shape is not None and SKIP_LAYER_PAGE_ALIGNMENT.holds(version):
        hybrid_page = block_size * sizes.per_token_layer if state_bytes and not attention_free else None
        # the platform's pages per token: a FullAttentionSpec's, MLA's too (skip_layer_pages.py)
        primary_token, platform_skip_token = platform_skip_pages(1, geometry.head_size, sizes.dtype_bytes,
                                                                 sizes.model_bytes) \
            if mla else (sizes.per_token_layer, sizes.skip_token)
        grown, shared_page, _ = skip_layer_block_size(
            shape, block_size, primary_token, platform_skip_token, hybrid_page if hybrid_page != state_bytes else None)
        if mla:
            shared_page = None   # no MLA spec pads to it
        if grown > block_size:
            block_size, block_source = grown, "raised so the quantized page covers the skip layers' page " \
                                              f"({SKIP_LAYER_PAGE_ALIGNMENT.source})"
    if attention_free and not prefix_caching_on(geometry, settings):
        # model_executor/models/config.py MambaModelConfig: without prefix caching a state block
        # covers max_model_len, and the engine's block size is its groups' smallest
        block_size, block_source = settings.max_model_len or geometry.default_max_model_len, \
            "the max model len: one state block per request"
    elif attention_free:
        # MambaModelConfig copies the block size in force when it runs, before any platform sets its
        # own default; with no attention layer nothing aligns it again (recorded on the CPU engine)
        block_size = settings.block_size or default_block
        block_source = "flag" if settings.block_size else "vLLM's CacheConfig default (no attention backend)"
    return block_size, block_source, shared_page


def _layers(geometry: ModelGeometry, settings: EngineSettings, version: VllmVersion | None,
            shape: BackendRule | None, sizes: TokenBytes, block_size: int, block_source: str,
            shared_page: int | None, warnings: list[PredictedRefusal]) -> tuple[KvGroups, int, str]:
    """Step 5: the layers of one worker (the fullest pipeline stage), grouped as vLLM groups them,
    and the block size once the groups have theirs; vLLM's refusals of the grouping join `warnings`.
    Sliding-window layers start from a kernel block of their own in some releases (kv_layout.py)."""
    sliding_block = sliding_block_size(shape.block_sizes, block_size, SLIDING_BLOCK_FROM_KERNEL.holds(version),
                                       SLIDING_BLOCK_WITHIN_PRIMARY_PAGE.holds(version),
                                       SLIDING_BLOCK_DIVIDES_PRIMARY.holds(version)) \
        if shape is not None and not geometry.layout.conv_rings else block_size   # Inkling: its own specs
    groups, grouping_refusals = _kv_groups(geometry, settings, block_size, sizes.layer_token_bytes, sizes.state_bytes,
                                           version, sliding_block, sizes.checkpoint_alignment is not None,
                                           shared_page, shape.block_sizes if shape is not None else ())
    warnings.extend(grouping_refusals)
    # The engine's block size is its groups' smallest (vLLM 0.28.0, vllm/v1/engine/core.py:322).
    smallest_group_block = min((groups.specs[g[0]].block_size for g in groups.groups), default=block_size)
    if smallest_group_block < block_size:
        rule = SLIDING_BLOCK_WITHIN_PRIMARY_PAGE if SLIDING_BLOCK_WITHIN_PRIMARY_PAGE.holds(version) \
            else SLIDING_BLOCK_FROM_KERNEL
        block_size = smallest_group_block
        block_source = f"the sliding-window layers' blocks, unified to the full ones' page ({rule.source})"
        if geometry.layout.conv_rings:
            block_source = RING_BLOCK_SOURCE
    warnings.extend(_shared_layer_warnings(geometry, settings, groups))
    return groups, block_size, block_source


@dataclass(frozen=True)
class _Blocks:
    """Step 6's answer: the KV memory, where it comes from, and the blocks it holds."""

    kv_memory: int
    source: str
    estimated: bool
    budget: GpuBudget | None   # the GPU split it was estimated from
    num_blocks: int
    bytes_per_block: int
    check_memory: int          # what vLLM checks one request against
    backend: str | None = None  # the attention backend the budget was estimated for


def _blocks(device: Device, settings: EngineSettings, geometry: ModelGeometry, memory: MemoryInputs,
            model_bytes: int, bytes_per_block: int, backend: str | None = None) -> _Blocks:
    """Step 6: the KV memory (a flag or the environment fixes it, else the learned non-KV memory,
    else vLLM's own profile estimated) and the blocks it holds."""
    memory_bytes, source, estimated, budget = kv_memory(device, settings, geometry, memory, model_bytes, backend)
    num_blocks = memory_bytes // bytes_per_block
    if settings.num_gpu_blocks_override is not None:
        num_blocks, source = settings.num_gpu_blocks_override, "--num-gpu-blocks-override"
        estimated = False
    # vLLM plans one request against the blocks the null block leaves (get_kv_cache_configs), from
    # 0.29; before, against the whole memory (vllm_releases/kv_layout.py NULL_BLOCK_RESERVED_IN_CHECK).
    null_block = bytes_per_block if NULL_BLOCK_RESERVED_IN_CHECK.holds(memory.vllm_version) else 0
    check_memory = num_blocks * bytes_per_block - null_block \
        if settings.num_gpu_blocks_override is not None else memory_bytes - null_block
    return _Blocks(memory_bytes, source, estimated, budget, num_blocks, bytes_per_block, check_memory, backend)


def _fitted_length(geometry: ModelGeometry, settings: EngineSettings, device: Device, release: Release,
                   groups: KvGroups, blocks: _Blocks) -> tuple[int, Demand]:
    """Step 7: the max model len (`--max-model-len auto`: the longest the blocks hold) and what one
    request of it asks of the cache."""
    derived_len = geometry.default_max_model_len
    max_len = settings.max_model_len or derived_len
    demand = request_demand(geometry, settings, device, max_len, release)
    if settings.max_model_len_auto and settings.max_model_len is None:
        check = blocks.check_memory
        fitted = groups.auto_fit_max_model_len(check, demand, derived_len) if check > 0 else 0
        max_len = min(derived_len, fitted) if fitted > 0 else derived_len
        demand = request_demand(geometry, settings, device, max_len, release)
    return max_len, demand


def _capacity_refusals(geometry: ModelGeometry, settings: EngineSettings, device: Device, memory: MemoryInputs,
                       release: Release, sizes: TokenBytes, groups: KvGroups, blocks: _Blocks, demand: Demand,
                       max_len: int) -> list[PredictedRefusal]:
    """Step 8: no block fits; a request of max model len does not; more sequences than Mamba blocks."""
    num_blocks, certain = blocks.num_blocks, not blocks.estimated
    found = []
    if num_blocks <= 1 or blocks.check_memory <= 0:
        found.append(no_memory_warning(device, settings, geometry, memory, sizes.model_bytes, blocks.kv_memory,
                                       blocks.bytes_per_block, blocks.estimated, blocks.budget, blocks.backend))
    elif groups.memory_for(demand, max_len) > blocks.check_memory:
        fit = groups.auto_fit_max_model_len(blocks.check_memory, demand, max_len)
        needed = groups.blocks_per_request(demand)
        found.append(PredictedRefusal(
            KV_CACHE_TOO_SMALL,
            f"max model len {max_len} needs {needed} blocks per request; "
            f"the KV cache holds {num_blocks - 1} usable blocks (max model len {fit} fits)",
            FlagChange({"--max-model-len": fit}) if fit > 0 else NO_CHANGE, certain=certain))
    seqs = settings.max_num_seqs or api_defaults(device, settings, release)[1]
    if sizes.state_bytes and device.platform == "cuda" and not settings.enforce_eager and 1 < num_blocks < seqs:
        found.append(PredictedRefusal(
            MAMBA_CACHE_TOO_SMALL,
            f"max num seqs {seqs} exceeds the {num_blocks} Mamba cache blocks: vLLM refuses to capture "
            f"CUDA graphs (each decoding sequence needs one block)", FlagChange({"--max-num-seqs": num_blocks}),
            certain=certain))
    return found


def _padding(settings: EngineSettings, sizes: TokenBytes, groups: KvGroups, blocks: _Blocks, demand: Demand,
             block_size: int) -> dict[str, int]:
    """Step 9: the bytes of the cache that hold no token, by cause."""
    by_cause = groups.padding_bytes(blocks.num_blocks, demand)
    return {
        "packed_layout": sizes.packed_extra * block_size * groups.group_size * blocks.num_blocks,
        "page_padding": by_cause["page_padding"], "state_padding": by_cause["state_padding"],
        "alignment": 0, "layer_padding": by_cause["layer_padding"],
        "remainder": max(0, blocks.kv_memory - blocks.num_blocks * blocks.bytes_per_block)
        if settings.num_gpu_blocks_override is None else 0,
        "null_block": blocks.bytes_per_block if blocks.num_blocks else 0,
    }


def architecture_unknowns(geometry: ModelGeometry, version: VllmVersion | None) -> tuple[str, ...]:
    """What the release's architecture table says kvwatch cannot classify about this model."""
    return unknown_reasons(geometry.architectures, dict.fromkeys(geometry.present_fields, True),
                           MAMBA in geometry.layout.kinds, str(version) if version else None, IN_TRANSFORMERS)


def _kv_groups(geometry: ModelGeometry, settings: EngineSettings, block_size: int, token_bytes: Sequence[int],
               state_bytes: int, version: VllmVersion | None = None,
               sliding_block: int | None = None, gdn_checkpoint: bool = False, shared_page: int | None = None,
               kernel_sizes: tuple[BlockSizeRule, ...] = ()) -> tuple[KvGroups, list[PredictedRefusal]]:
    """The groups of one worker's layers, and vLLM's refusal of them where it refuses them;
    `token_bytes` per cache layer, `sliding_block` the block a sliding-window layer starts from
    (default: the block size in force), `gdn_checkpoint` whether the gated delta net layers export
    prefill checkpoints (vllm_releases/gdn_checkpoint.py), `shared_page` the skip layers' padded page
    that sliding-window layers pad up to (vllm_releases/skip_layer_pages.py)."""
    kinds = with_indexers(geometry.layout.kinds, geometry.sparse_indexer, FULL)   # MiniMax-M3's indexer caches
    if settings.pipeline_parallel_size > 1:   # the first stage holds the most layers
        per_stage = -(-len(geometry.layout.kinds) // settings.pipeline_parallel_size)
        per_stage = len(with_indexers(geometry.layout.kinds[:per_stage], geometry.sparse_indexer, FULL))
        kinds, token_bytes = kinds[:per_stage], token_bytes[:per_stage]
    pages = [block_size * b for b in token_bytes]
    rule = grouping_rule_for(version)
    refusals = []
    if settings.disable_hybrid_kv_cache_manager:
        if (ring_refused := ring_promotion_refusal(geometry.layout, kinds)) is not None:
            refusals.append(ring_refused)   # Inkling's rings (planner/inkling.py)
        if promotion_refused(kinds, [p for k, p in zip(kinds, pages, strict=True) if k != MAMBA], rule.uniform_type):
            wording = HYBRID_PROMOTION_REFUSED if HYBRID_PROMOTION_WORDING.holds(version) \
                else HYBRID_PROMOTION_REFUSED_BEFORE
            refusals.append(PredictedRefusal(
                CONFIG_REFUSED, f"ValueError: {wording} (--disable-hybrid-kv-cache-manager keeps "
                f"{'cross-attention' if CROSS in kinds else 'state'} layers beside attention layers, which vLLM "
                f"cannot make one type)", FlagChange(remove=("--disable-hybrid-kv-cache-manager",))))
        kinds = promote_local_layers(kinds)
    elif CHUNKED in kinds and not CHUNKED_LOCAL_KEEPS_HYBRID_MANAGER.holds(version):
        kinds = promote_local_layers(kinds)   # the release turns the hybrid manager off by itself
    checkpoints = geometry.layout.state.checkpoint_blocks \
        if geometry.layout.state and MAMBA2_PREFILL_CHECKPOINT.holds(version) else 0
    if gdn_checkpoint:
        checkpoints = GDN_CHECKPOINT_BLOCKS
    specs = layer_specs(kinds, pages, block_size, geometry.layout.window, state_bytes, checkpoints, sliding_block,
                        shared_page, kernel_sizes)
    rings = geometry.layout.conv_rings[:len(kinds)]   # Inkling: one per decoder layer of this stage
    promoted = block_size if settings.disable_hybrid_kv_cache_manager and FULL in kinds else None
    specs += ring_specs(rings, max(1, settings.tensor_parallel_size), promoted)
    specs += encoder_specs(geometry.layout.causal_encoder, settings, geometry.config_dtype, block_size)   # Voxtral's
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


def _packed_plan(geometry: ModelGeometry, kv: deepseek_v4.Packing, settings: EngineSettings,
                 device: Device, memory: MemoryInputs, release: Release, warnings: list[PredictedRefusal]) -> Plan:
    """DeepSeek-V4, Step5, GLM-5-Next: their cache kinds packed into groups that share one block pool. Their own
    backends are not ones kvwatch's backend rules know, so none of their refusals applies."""
    sizes = token_sizes(geometry, settings, device, memory.vllm_version, dict(memory.vllm_env))
    blocks = _blocks(device, settings, geometry, memory, sizes.model_bytes, kv.bytes_per_block, kv.backend)
    max_len = settings.max_model_len or geometry.default_max_model_len
    in_flight = request_demand(geometry, settings, device, max_len, release).max_in_flight_tokens
    tokens, concurrency = deepseek_v4.capacity(kv.groups, blocks.num_blocks, max_len, in_flight, kv.extra_retained) \
        if blocks.num_blocks else (0, 0.0)
    if blocks.num_blocks <= 1 or blocks.check_memory <= 0:   # as step 8 says it of any other model
        warnings = [*warnings, no_memory_warning(device, settings, geometry, memory, sizes.model_bytes,
                    blocks.kv_memory, kv.bytes_per_block, blocks.estimated, blocks.budget, kv.backend)]
    return Plan(
        model=settings.model, device=device.name, compute_capability=device.sm, attention=kv.attention,
        backend=kv.backend, block_size=kv.block_size, block_size_source=kv.source,
        kv_cache_dtype=settings.kv_cache_dtype, dtype_bytes=kv.dtype_bytes, kv_bytes_per_token_per_layer=0,
        kv_bytes_per_token=kv.kv_bytes_per_token, page_size_bytes=kv.bytes_per_block,
        layers_per_block=max(len(g.pages) for g in kv.groups), bytes_per_block=kv.bytes_per_block,
        kv_memory_bytes=blocks.kv_memory, kv_memory_source=blocks.source, num_blocks=blocks.num_blocks,
        kv_cache_tokens=tokens, max_model_len=max_len, max_concurrency=concurrency, estimated=blocks.estimated,
        padding_bytes={"remainder": max(0, blocks.kv_memory - blocks.num_blocks * kv.bytes_per_block),
                       "null_block": kv.bytes_per_block if blocks.num_blocks else 0},
        warnings=within_scope(warnings, kv.unsure), data_parallel_size=max(1, settings.data_parallel_size),
        pipeline_parallel_size=max(1, settings.pipeline_parallel_size), kv_cache_groups=len(kv.groups),
        blocks_per_request=sum(g.blocks_per_request(max_len, in_flight, kv.extra_retained) for g in kv.groups),
        gpu_budget=blocks.budget, unknown_layer_types=kv.unsure)


def _no_kv_cache_plan(model: str, reason: str, settings: EngineSettings, device: Device,
                     max_model_len: int | None, warnings: Sequence[PredictedRefusal]) -> Plan:
    """The plan of a model vLLM gives no KV cache: 0 blocks, 0 bytes, exact (no estimate is involved)."""
    return Plan(
        model=model, device=device.name, compute_capability=device.sm, attention=NO_KV_CACHE_ATTENTION,
        backend=None, block_size=settings.block_size or 0, block_size_source="no KV cache: no block is sized",
        kv_cache_dtype=settings.kv_cache_dtype, dtype_bytes=0, kv_bytes_per_token_per_layer=0, kv_bytes_per_token=0,
        page_size_bytes=0, layers_per_block=0, bytes_per_block=0, kv_memory_bytes=0,
        kv_memory_source=f"none: {reason} ({NO_KV_CACHE_SOURCE})", num_blocks=0, kv_cache_tokens=0,
        max_model_len=max_model_len, max_concurrency=None, estimated=False,
        padding_bytes={}, warnings=tuple(warnings), data_parallel_size=max(1, settings.data_parallel_size),
        pipeline_parallel_size=max(1, settings.pipeline_parallel_size), kv_cache_groups=0, no_kv_cache=reason)
