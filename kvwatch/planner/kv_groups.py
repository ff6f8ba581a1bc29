"""vLLM's KV cache groups, blocks and capacity for any mix of layer kinds (pure).

Follows vLLM 0.32's v1/core/kv_cache_utils.py: `get_kv_cache_groups` (one group when every
layer has the same spec or the same type; otherwise pages unified, layers bucketed by spec and
split into groups of one size, the last group of a bucket padded), `_get_kv_cache_bytes_per_block`
(the fullest group's pages), `get_kv_cache_config_from_groups` (num_blocks = memory // that),
`get_max_concurrency_for_kv_cache_config` and `get_kv_cache_capacity` (tokens = concurrency x
max_model_len, where a request needs per group what its spec's `max_memory_usage_bytes` says:
v1/kv_cache_interface.py), and `_estimate_max_model_len_from_groups` (`--max-model-len auto`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvwatch.planner.cross_attention import CROSS, cross_blocks_per_request
from kvwatch.planner.layers import CHUNKED, FULL, MAMBA, SLIDING
from kvwatch.planner.rules import BackendRule
from kvwatch.values.block_sizes import BlockSizeRule, MultipleOf
from kvwatch.vllm_releases.hybrid_alignment import HybridAlignment


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerSpec:
    layer_kind: str           # full | sliding | chunked | mamba
    block_size: int           # tokens per block (mamba: the attention block size it is aligned to)
    page_bytes: int           # one block of this layer, padding included
    real_page_bytes: int      # without padding
    window: int | None = None  # sliding window / attention chunk size
    checkpoint_blocks: int = 0    # mamba: prefill checkpoint states kept in align mode (MambaMixer2: 1)
    speculative_blocks: int = 0   # mamba: num_speculative_tokens states more (planner/mtp_draft.py)


@dataclass(frozen=True)
class Demand:
    """What one request needs: vLLM's scheduler limits."""

    max_model_len: int
    max_in_flight_tokens: int     # max_concurrent_batches x max_num_batched_tokens from 0.26, one batch before (kv_layout.IN_FLIGHT_TOKENS)
    mamba_align: bool = False     # mamba_cache_mode "align" (prefix caching on a hybrid, vLLM's default)
    mamba_all: bool = False       # mamba_cache_mode "all": a state per block of tokens (0.15-0.31)
    encoder_tokens: int = 0       # a cross-attention layer's reservation (planner/cross_attention.py)


def blocks_per_request(spec: LayerSpec, demand: Demand, max_model_len: int | None = None) -> int:
    """cdiv(spec.max_memory_usage_bytes, page) for one layer's spec."""
    length = demand.max_model_len if max_model_len is None else max_model_len
    if spec.layer_kind == SLIDING:
        assert spec.window is not None
        return cdiv(min(spec.window - 1 + demand.max_in_flight_tokens, length), spec.block_size) + 1
    if spec.layer_kind == CHUNKED:
        assert spec.window is not None
        return cdiv(min(spec.window + demand.max_in_flight_tokens, length), spec.block_size)
    if spec.layer_kind == MAMBA:   # MambaSpec.max_memory_usage_bytes: 2 (+ checkpoints) in align mode, else 1
        if demand.mamba_all:
            return cdiv(length, spec.block_size) + spec.speculative_blocks
        return (2 + spec.checkpoint_blocks if demand.mamba_align else 1) + spec.speculative_blocks
    if spec.layer_kind == CROSS:
        return cross_blocks_per_request(demand.encoder_tokens, spec.block_size)
    return cdiv(length, spec.block_size)


@dataclass(frozen=True)
class KvGroups:
    specs: tuple[LayerSpec, ...]          # one per cache layer, after page unification
    groups: tuple[tuple[int, ...], ...]   # layer indices of each group
    group_size: int                       # layers per group (the fullest group)
    padding_layers: int                   # empty slots in groups short of group_size

    @property
    def bytes_per_block(self) -> int:
        return max(sum(self.specs[i].page_bytes for i in group) for group in self.groups)

    def blocks_per_request(self, demand: Demand, max_model_len: int | None = None) -> int:
        return sum(blocks_per_request(self.specs[group[0]], demand, max_model_len) for group in self.groups)

    def memory_for(self, demand: Demand, max_model_len: int) -> int:
        """_max_memory_usage_bytes_from_groups: one request of max_model_len, in bytes."""
        return self.bytes_per_block * self.blocks_per_request(demand, max_model_len)

    def capacity(self, num_blocks: int, demand: Demand) -> tuple[int, float]:
        """(KV cache size in tokens, maximum concurrency) as vLLM logs them."""
        concurrency = num_blocks / self.blocks_per_request(demand)
        return int(concurrency * demand.max_model_len), concurrency

    def auto_fit_max_model_len(self, available_bytes: int, demand: Demand, derived_max: int) -> int:
        """_estimate_max_model_len_from_groups: the longest length one request fits in (0: none)."""
        def fits(length: int) -> bool:
            return self.memory_for(demand, length) <= available_bytes
        if not fits(1):
            return 0
        left, right, best = 1, derived_max, 1
        while left <= right:
            mid = (left + right) // 2
            if fits(mid):
                best, left = mid, mid + 1
            else:
                right = mid - 1
        return best

    def padding_bytes(self, num_blocks: int, demand: Demand) -> dict[str, int]:
        """Bytes of the pool that hold no KV, by cause. Every group's tensors alias one pool of
        bytes_per_block x num_blocks, and a block belongs to one group at a time; a group with
        fewer layers than the fullest (vLLM's "padding layers") leaves the rest of its blocks
        unused, and a padded page (a Mamba state padded up to the attention page) wastes its tail.
        Blocks are counted as one request of max_model_len spreads them over the groups."""
        if not self.groups or not num_blocks:
            return {"layer_padding": 0, "state_padding": 0, "page_padding": 0}
        weights = [blocks_per_request(self.specs[g[0]], demand) for g in self.groups]
        total = sum(weights)
        per_block = {"layer_padding": 0.0, "state_padding": 0.0, "page_padding": 0.0}
        for group, weight in zip(self.groups, weights, strict=True):
            share = weight / total
            per_block["layer_padding"] += share * (self.bytes_per_block - sum(self.specs[i].page_bytes for i in group))
            for i in group:
                cause = "state_padding" if self.specs[i].layer_kind == MAMBA else "page_padding"
                per_block[cause] += share * (self.specs[i].page_bytes - self.specs[i].real_page_bytes)
        return {cause: int(value * num_blocks) for cause, value in per_block.items()}


def _unify_pages(specs: list[LayerSpec]) -> list[LayerSpec]:
    """unify_kv_cache_spec_page_size: smaller attention pages take a larger block, or are padded."""
    largest = max(s.page_bytes for s in specs)
    out = []
    for s in specs:
        if s.page_bytes == largest:
            out.append(s)
        elif s.layer_kind == MAMBA:
            out.append(replace(s, page_bytes=largest))
        elif largest % s.page_bytes == 0:
            ratio = largest // s.page_bytes
            out.append(replace(s, block_size=s.block_size * ratio, page_bytes=largest,
                               real_page_bytes=s.real_page_bytes * ratio))
        else:
            out.append(replace(s, page_bytes=largest))
    return out


def layer_specs(kinds: list[str], pages: list[int], block_size: int, window: int | None, state_bytes: int,
                checkpoint_blocks: int = 0, sliding_block: int | None = None, shared_page: int | None = None,
                kernel_sizes: tuple[BlockSizeRule, ...] = ()) -> list[LayerSpec]:
    """The spec of each cache layer, as the model's layers give vLLM theirs: attention pages as they
    are (one window per model), a sliding-window layer's at `sliding_block` tokens where the release
    starts it from a block of its own (sliding_block_size), a recurrent state padded up to the
    largest attention page at the block size in force (the hybrid alignment made that page hold one
    state) or, with no attention layer, its own size; `pages` are at the block size in force.
    `shared_page`: the skip layers' padded page (skip_layer_block_size), which every sliding-window
    layer pads up to, at the largest of `kernel_sizes` whose page fits it."""
    attention_pages = [page for layer_kind, page in zip(kinds, pages, strict=True) if layer_kind != MAMBA]
    state_page = max(attention_pages) if attention_pages else state_bytes
    sliding = block_size if sliding_block is None else sliding_block

    def attention(layer_kind: str, page: int) -> LayerSpec:
        if layer_kind == SLIDING and shared_page and block_size:
            token = page // block_size
            block = largest_kernel_block_within(kernel_sizes, token, shared_page, block_size)
            return LayerSpec(SLIDING, block, shared_page, block * token, window)
        block = sliding if layer_kind == SLIDING else block_size
        size = page // block_size * block if block_size else page
        return LayerSpec(layer_kind, block, size, size, window if layer_kind in (SLIDING, CHUNKED) else None)

    return [LayerSpec(MAMBA, block_size, state_page, state_bytes, checkpoint_blocks=checkpoint_blocks)
            if layer_kind == MAMBA else attention(layer_kind, page)
            for layer_kind, page in zip(kinds, pages, strict=True)]


def kv_groups(specs: list[LayerSpec], near_equal: float | None = 1.5, strided: bool = True) -> KvGroups:
    """get_kv_cache_groups for the layers of one worker (specs already promoted when the hybrid
    manager is off). `near_equal` and `strided` are the release's (vllm_releases/kv_layout.py
    GroupingRule; the defaults are the newest release's)."""
    if not specs:
        return KvGroups((), (), 0, 0)
    everything = tuple(range(len(specs)))
    same_type = len({(s.layer_kind, s.window, s.block_size) for s in specs}) == 1
    if same_type:   # is_kv_cache_spec_uniform or UniformTypeKVCacheSpecs: one group of every layer
        return KvGroups(tuple(specs), (everything,), len(specs), 0)
    unified = _unify_pages(specs)
    buckets: dict[LayerSpec, list[int]] = {}
    for i, s in enumerate(unified):
        buckets.setdefault(s, []).append(i)
    counts = [len(layers) for layers in buckets.values()]
    group_size = min(counts)
    if near_equal is not None and max(counts) < min(counts) * near_equal:
        group_size = max(counts)
    groups: list[tuple[int, ...]] = []
    padding = 0
    for layers in buckets.values():
        num_groups = cdiv(len(layers), group_size)
        padding += num_groups * group_size - len(layers)
        if strided:
            groups.extend(tuple(layers[i::num_groups]) for i in range(num_groups))
        else:
            groups.extend(tuple(layers[i:i + group_size]) for i in range(0, len(layers), group_size))
    return KvGroups(tuple(unified), tuple(groups), group_size, padding)


def promotion_refused(kinds: list[str], pages: list[int] | None = None, uniform_type: bool = True) -> bool:
    """unify_hybrid_kv_cache_specs with the hybrid manager off: the layers, local ones promoted to
    full attention, must be of one type; a state layer beside attention is not (vLLM: ValueError).
    Before layers of one type made one group whatever their pages (`uniform_type` False: 0.10), the
    attention pages must be equal too."""
    if len(set(promote_local_layers(kinds))) > 1:
        return True
    return not uniform_type and pages is not None and len(set(pages)) > 1


def pages_refused(specs: list[LayerSpec], unify_pages: bool, uniform_type: bool = True) -> bool:
    """get_kv_cache_groups of a release that does not unify pages (vllm_releases/kv_layout.py
    KV_PAGE_UNIFICATION): layers of more than one type whose pages differ, or (0.10, no
    `uniform_type`) of one type (vLLM: NotImplementedError)."""
    same_type = len({(s.layer_kind, s.window, s.block_size) for s in specs}) <= 1
    return not unify_pages and (not same_type or not uniform_type) and len({s.page_bytes for s in specs}) > 1


def promote_local_layers(kinds: list[str]) -> list[str]:
    """--disable-hybrid-kv-cache-manager: with full attention present, sliding and chunked layers
    are kept as full attention (`_promote_local_kv_cache_specs`)."""
    if FULL in kinds and (SLIDING in kinds or CHUNKED in kinds):
        return [FULL if k in (SLIDING, CHUNKED) else k for k in kinds]
    return kinds


def hybrid_block_size(alignment: HybridAlignment, backend: BackendRule, block_size: int, attn_page_1_token: int,
                      state_bytes: int, mla: bool, checkpoint_alignment: int | None = None) -> int:
    """The block size after vLLM aligns a hybrid's attention pages to its recurrent state, as the
    release's rules say (vllm_releases/hybrid_alignment.py): the smallest multiple of the alignment
    whose page holds one state, never below the block size in force. `checkpoint_alignment`: the
    state layers' prefill checkpoint alignment in align mode (vllm_releases/gdn_checkpoint.py), which
    releases with a checkpoint_alignment_source fold into the alignment."""
    smallest = min(r.base if isinstance(r, MultipleOf) else r for r in backend.block_sizes)
    if alignment.kernel_alignment:
        align = max(smallest, block_size)
        if mla and alignment.mla_at_least:
            align = max(align, alignment.mla_at_least)
        if checkpoint_alignment and alignment.checkpoint_alignment_source:
            align = math.lcm(align, checkpoint_alignment)
    else:
        align = alignment.fixed_mla_alignment if mla else alignment.fixed_alignment
    size = align * cdiv(state_bytes, align * attn_page_1_token)
    if alignment.backend_lcm_source:
        size = smallest * cdiv(size, smallest)
    return max(block_size, size)


def sliding_block_size(kernel_sizes: tuple[BlockSizeRule, ...], block_size: int, from_kernel: bool,
                       within_primary_page: bool, divides_primary: bool = False) -> int:
    """The block size a sliding-window layer's spec starts from (`Attention.get_kv_cache_spec` with
    no padded page, `_largest_kernel_block_within`), as the release's rules say
    (vllm_releases/kv_layout.py SLIDING_BLOCK_*): the block size in force; or the backend's smallest
    kernel block; or its largest kernel block whose page fits the block size's (a MultipleOf
    taken at the largest multiple not above it; from 0.34 preferring one that divides the block size).
    Page unification then scales it up."""
    if not from_kernel:
        return block_size
    fixed = [s for s in kernel_sizes if not isinstance(s, MultipleOf)]
    if not within_primary_page:
        candidates = fixed or [s.base for s in kernel_sizes if isinstance(s, MultipleOf)]
        return min(candidates) if candidates else block_size
    return largest_kernel_block_within(kernel_sizes, 1, block_size, block_size,
                                       divisor_of=block_size if divides_primary else None)


def largest_kernel_block_within(kernel_sizes: tuple[BlockSizeRule, ...], token_bytes: int, page_budget: int,
                                fallback: int, divisor_of: int | None = None) -> int:
    """`_largest_kernel_block_within`: the largest kernel block whose page of `token_bytes` a token
    fits `page_budget` (a MultipleOf taken at its largest multiple that fits), else the smallest; with
    `divisor_of` (0.34+, kv_layout.SLIDING_BLOCK_DIVIDES_PRIMARY) the largest fitting one that divides
    it, where one does."""
    most = page_budget // token_bytes
    candidates = [s for s in kernel_sizes if not isinstance(s, MultipleOf)] + \
        [max(s.base, most // s.base * s.base) for s in kernel_sizes if isinstance(s, MultipleOf)]
    if not candidates:
        return fallback
    fitting = [b for b in candidates if b * token_bytes <= page_budget]
    if divisor_of is not None:
        dividing = [b for b in fitting if divisor_of % b == 0] + [
            b for s in kernel_sizes if isinstance(s, MultipleOf)
            if (b := _largest_dividing_multiple(s.base, most, divisor_of))]
        if dividing:
            return max(dividing)
    return max(fitting) if fitting else min(candidates)


def _largest_dividing_multiple(base: int, most: int, n: int) -> int:
    """The largest multiple of `base` not above `most` that divides `n` (0: none). By the divisors of
    n / base, not by stepping through the multiples: a malformed config's block size runs to billions."""
    if base <= 0 or n % base:
        return 0
    whole, limit, best = n // base, most // base, 0
    k = 1
    while k * k <= whole:
        if whole % k == 0:
            for d in (k, whole // k):
                if d <= limit:
                    best = max(best, d)
        k += 1
    return best * base


def platform_skip_pages(kv_heads: int, head_size: int, dtype_bytes: int, model_dtype_bytes: int) -> tuple[int, int]:
    """The pages per token that _align_heterogeneous_kv_block_size compares, the quantized primary's
    and the skip layers': a FullAttentionSpec's, K and V of `kv_heads` heads of `head_size` (for MLA
    one head of the latent, so twice the latent's page: vllm_releases/skip_layer_pages.py)."""
    return 2 * kv_heads * head_size * dtype_bytes, 2 * kv_heads * head_size * model_dtype_bytes


def skip_layer_block_size(backend: BackendRule, block_size: int, primary_page_1_token: int,
                          skip_page_1_token: int, mamba_page_padded: int | None = None
                          ) -> tuple[int, int | None, int | None]:
    """The platform's alignment of a quantized primary beside unquantized skip layers
    (vllm_releases/skip_layer_pages.py, 0.25+): (the block size, the shared page the skip layers pad
    up to or None when the pages per token already match, the Mamba page padded to it or None)."""
    if skip_page_1_token == primary_page_1_token:
        return block_size, None, mamba_page_padded
    smallest = min(r.base if isinstance(r, MultipleOf) else r for r in backend.block_sizes)
    align = max(smallest, block_size)
    required = max(skip_page_1_token * smallest, mamba_page_padded or 0)
    block = max(block_size, align * cdiv(required, align * primary_page_1_token))
    shared = block * primary_page_1_token
    return block, shared, shared if mamba_page_padded is not None else None

