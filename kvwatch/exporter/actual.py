"""What the engine actually allocated for its KV cache, from its own figures (pure).

"Actual" is the engine's ``num_gpu_blocks`` times the bytes per block that the planner
computes for the block size and KV dtype the ENGINE REPORTS (``vllm:cache_config_info``),
on the model's geometry. It is cross-checked against the engine's other figures: the
KV tokens of its startup log (``KV cache size: N tokens``, or the ``kv_cache_size_tokens``
label) must be blocks x block size, and the blocks must be what its KV memory
(``kv_cache_memory_bytes`` label, else ``Available KV cache memory`` of the log) holds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from kvwatch.boundary.engine_http import CacheConfig, RankMetrics
from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand, EngineSettings
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.geometry import ModelGeometry
from kvwatch.planner.plan import NO_MEMORY_INPUTS, MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import RuleSet

LOG_GIB_ROUNDING = 2**30 // 200  # the log prints GiB rounded to 0.01: +-0.005 GiB


@dataclass(frozen=True)
class KvContext:
    """What the planner needs besides the engine's figures: the model and the engine's flags."""

    geometry: ModelGeometry
    settings: EngineSettings
    device: Device
    rules: RuleSet
    command: EngineCommand | None = None   # the flags as given: what a recommended change is applied to


@dataclass(frozen=True)
class ActualKv:
    blocks: int                        # num_gpu_blocks the engine reports
    block_size: int                    # the block size it reports
    kv_cache_dtype: str                # the cache dtype it reports
    bytes_per_block: int               # the planner's, for that block size and dtype
    kv_bytes: int                      # blocks x bytes_per_block
    kv_memory_bytes: int | None        # memory the engine gave the KV cache, when it says
    kv_memory_source: str | None       # "kv_cache_memory_bytes" (exact) or "log" (0.01 GiB)
    padding_bytes: dict[str, int]      # same causes as Plan.padding_bytes
    problems: tuple[str, ...] = ()     # cross-checks that disagree (empty: consistent)

    @property
    def padding_ratio(self) -> float:
        return sum(self.padding_bytes.values()) / self.kv_bytes if self.kv_bytes else 0.0

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size


def _reported_settings(ctx: KvContext, cache: CacheConfig) -> EngineSettings:
    return replace(ctx.settings,
                   block_size=cache.block_size or ctx.settings.block_size,
                   kv_cache_dtype=cache.cache_dtype or ctx.settings.kv_cache_dtype)


def actual_kv(ctx: KvContext, cache: CacheConfig | None, log_kv_tokens: int | None = None,
              log_available_kv_bytes: int | None = None) -> ActualKv | None:
    """The engine's KV cache in bytes, or None while it does not report blocks and block size."""
    if cache is None or cache.num_gpu_blocks is None or not cache.block_size:
        return None
    blocks, block_size = cache.num_gpu_blocks, cache.block_size
    shaped = make_plan(ctx.geometry, replace(_reported_settings(ctx, cache), num_gpu_blocks_override=blocks,
                                             kv_cache_memory_bytes=None),
                       ctx.device, ctx.rules)
    bytes_per_block = shaped.bytes_per_block
    padding = dict(shaped.padding_bytes)
    if shaped.block_size != block_size:  # the planner forced another size: the page is linear in it
        bytes_per_block = bytes_per_block * block_size // shaped.block_size
        padding = {k: v * block_size // shaped.block_size for k, v in padding.items()}
    kv_bytes = blocks * bytes_per_block
    padding["null_block"] = bytes_per_block if blocks else 0
    problems: list[str] = []

    memory = cache.kv_cache_memory_bytes
    source: str | None = "kv_cache_memory_bytes"
    if memory is None and log_available_kv_bytes is not None:
        memory, source = log_available_kv_bytes, "log"
    slack = LOG_GIB_ROUNDING if source == "log" else 0
    padding["remainder"] = 0
    if memory is not None:
        # the remainder is below one block (a log figure is only good to 0.005 GiB); with
        # --num-gpu-blocks-override the memory left over is not padding (as in the plan)
        if ctx.settings.num_gpu_blocks_override is None:
            padding["remainder"] = min(max(0, memory - kv_bytes), bytes_per_block - 1)
        if ctx.settings.num_gpu_blocks_override is None and not (
                memory - slack - bytes_per_block < kv_bytes <= memory + slack):
            problems.append(f"{blocks} blocks x {bytes_per_block} B = {kv_bytes} B, but the engine "
                            f"gave the KV cache {memory} B ({source})")
    else:
        source = None
    # vLLM reports tokens as concurrency x max_model_len over its KV cache groups (a sliding
    # window needs only its window per request), so the planner's arithmetic, not blocks x block size.
    for tokens, where in ((log_kv_tokens, "log"), (cache.kv_cache_size_tokens, "kv_cache_size_tokens")):
        if tokens is not None and shaped.block_size == block_size and tokens != shaped.kv_cache_tokens:
            problems.append(f"{where} says {tokens} KV tokens; {blocks} blocks of {block_size} tokens "
                            f"hold {shaped.kv_cache_tokens} for max model len {shaped.max_model_len}")
    return ActualKv(blocks=blocks, block_size=block_size,
                    kv_cache_dtype=shaped.kv_cache_dtype, bytes_per_block=bytes_per_block,
                    kv_bytes=kv_bytes, kv_memory_bytes=memory, kv_memory_source=source,
                    padding_bytes=padding, problems=tuple(problems))


def rank_blocks(cache: CacheConfig, ranks: int, geometry: ModelGeometry) -> tuple[int | None, list[str]]:
    """One data-parallel rank's blocks from what its ``vllm:cache_config_info`` says.

    vLLM 0.32's API server sums ``num_gpu_blocks`` over its DP engine cores
    (v1/engine/core_client.py, "Sum num_gpu_blocks from all engines in DP case") into the one
    CacheConfig that every rank's series shows, while ``kv_cache_size_tokens`` and
    ``kv_cache_memory_bytes`` are each core's own. So with several ranks a rank's blocks are its
    KV tokens over the block size (uniform models), and num_gpu_blocks must be their sum; where
    the two disagree, the tokens win and the disagreement is reported.
    """
    total = cache.num_gpu_blocks
    if total is None or not cache.block_size:
        return None, []
    if ranks <= 1:
        return total, []
    tokens = cache.kv_cache_size_tokens
    if tokens is not None and not geometry.is_hybrid and tokens % cache.block_size == 0:
        own = tokens // cache.block_size
        if own * ranks == total:
            return own, []
        return own, [f"num_gpu_blocks {total} is not {ranks} ranks x {own} blocks (kv_cache_size_tokens "
                     f"{tokens} / block size {cache.block_size})"]
    if total % ranks:
        return total // ranks, [f"num_gpu_blocks {total} does not split evenly over {ranks} ranks"]
    return total // ranks, []


def actual_per_rank(ctx: KvContext, ranks: tuple[RankMetrics, ...], log_kv_tokens: int | None = None,
                    log_available_kv_bytes: int | None = None) -> dict[str, ActualKv]:
    """Each data-parallel rank's actual KV cache, keyed by vLLM's ``engine`` label."""
    out: dict[str, ActualKv] = {}
    reporting = [r for r in ranks if r.cache is not None]
    for rank in reporting:
        assert rank.cache is not None
        blocks, problems = rank_blocks(rank.cache, len(reporting), ctx.geometry)
        if blocks is None:
            continue
        actual = actual_kv(ctx, replace(rank.cache, num_gpu_blocks=blocks), log_kv_tokens, log_available_kv_bytes)
        if actual is not None:
            out[rank.rank] = replace(actual, problems=tuple(problems) + actual.problems)
    return out


def reported_settings(ctx: KvContext, cache: CacheConfig | None) -> EngineSettings:
    """The engine's flags as far as they are known (``ctx.settings``), with the block size, KV dtype,
    memory utilization and KV memory the engine reports in place of the flags'."""
    settings = ctx.settings
    if cache is not None:
        settings = replace(_reported_settings(ctx, cache),
                           gpu_memory_utilization=cache.gpu_memory_utilization or settings.gpu_memory_utilization,
                           kv_cache_memory_bytes=cache.kv_cache_memory_bytes or settings.kv_cache_memory_bytes)
    return settings


def plan_for_reported(ctx: KvContext, cache: CacheConfig | None,
                      memory: MemoryInputs = NO_MEMORY_INPUTS) -> Plan:
    """The plan for an engine kvwatch did not start: its reported settings (`reported_settings`).
    Blocks are predicted, never copied."""
    return make_plan(ctx.geometry, reported_settings(ctx, cache), ctx.device, ctx.rules, memory)


def replan_reported(ctx: KvContext, cache: CacheConfig | None, change: FlagChange) -> Plan | None:
    """The plan that engine would have with `change` (a KV-pressure recommendation): the figures it
    reports, then the change's flags over them. None without its command."""
    if ctx.command is None:
        return None
    reported = reported_settings(ctx, cache)
    flags = {"--block-size": reported.block_size, "--kv-cache-dtype": reported.kv_cache_dtype,
             "--gpu-memory-utilization": reported.gpu_memory_utilization,
             "--kv-cache-memory-bytes": reported.kv_cache_memory_bytes}
    command = change.apply(ctx.command.apply({k: v for k, v in flags.items() if v is not None}))
    try:
        settings = command.settings()
    except KvwatchError:
        return None
    return make_plan(ctx.geometry, settings, ctx.device, ctx.rules)
