"""MiniMax-M3's sparse attention and its key-only indexer cache, as vLLM 0.33 and 0.34 build them (pure).

MiniMax-M3 (MiniMaxM3SparseForCausalLM, and its multimodal wrapper's text model) mixes two kinds of
decoder layer. Each holds a main K/V cache, a FullAttentionSpec of the rank's KV heads
(`max(1, num_key_value_heads // tp)`) in the KV cache dtype, whichever kind it is (vLLM 0.33.0,
vllm/models/minimax_m3/nvidia/model.py:429 and :562-571; 0.34.0, the same file :887 and :1040-1049):

- a dense layer (MiniMaxM3Attention) serves it with the ordinary attention backend;
- a sparse layer (MiniMaxM3SparseAttention) serves it with MiniMax's sparse backend, and adds a
  lightning indexer whose cache keeps one index key per token: an MLAAttentionSpec of one head of
  `index_head_dim`, TP-replicated, in the indexer's own dtype, bf16 unless `--attention-config`'s
  `indexer_kv_dtype` says otherwise (MiniMaxM3IndexerCache.get_kv_cache_spec: vLLM 0.33.0,
  vllm/models/minimax_m3/common/indexer.py:145-153; 0.34.0, the same file :155-163, which adds an
  nvfp4 layout of `head // 2 + head // 16` bytes, indexer.py:124-126).

Both sparse backends take 128-token kernel blocks only (MiniMaxM3SparseBackend and
MiniMaxM3IndexerBackend.get_supported_kernel_block_sizes: vLLM 0.33.0,
vllm/models/minimax_m3/common/sparse_attention.py:165-167 and indexer.py:94-95; 0.34.0,
sparse_attention.py:174-176 and indexer.py:94-95). Without --block-size vLLM then takes the smallest
size every backend of the model accepts (Platform._preferred_block_size_for_backends: vLLM 0.33.0,
vllm/platforms/interface.py:700-745; 0.34.0, :710-755): the default where all accept it, else the
smallest lcm of one kernel size per backend that all accept, so 128.

Every cache is a full-attention spec of that one block size, so vLLM keeps all layers, indexers
included, in one group (UniformTypeKVCacheSpecs), a block holding every layer's page: the
planner's one group of full-attention pages (kv_groups.kv_groups).

Which layers are sparse: vLLM 0.33 reads `sparse_attention_config.sparse_attention_freq` (a non-zero
entry per sparse layer) and `sparse_index_dim` (vLLM 0.33.0, vllm/models/minimax_m3/nvidia/model.py:
99-107 and :441); vLLM 0.34 reads `layer_types` ("minimax_m3_sparse") and `index_head_dim`
(vLLM 0.34.0, vllm/models/minimax_m3/nvidia/model.py:191-193 and :898), which transformers'
MiniMaxM3VLTextConfig fills from those same legacy fields when config.json has only them. Where
config.json has neither, 0.33's own config class gives the MiniMax-M3-preview checkpoint's (3 dense
layers, then 57 sparse, keys of 128: vLLM 0.33.0, vllm/transformers_utils/configs/minimax_m3.py:88-102)
and 0.34's transformers class makes every layer dense.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.values.block_sizes import BlockSizeRule, MultipleOf
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases.kv_layout import Boundary

ARCHITECTURES = frozenset({"MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration", "MiniMaxM3MTP"})
SPARSE_LAYER_TYPE = "minimax_m3_sparse"
# The sparse attention backend's and the indexer backend's kernel block sizes (see above).
SPARSE_KERNEL_BLOCKS: tuple[BlockSizeRule, ...] = (128,)
# From 0.34 the model reads layer_types and index_head_dim, no longer sparse_attention_config.
LAYER_TYPES_SCHEMA = Boundary((0, 34, 0), "vLLM 0.34.0, vllm/models/minimax_m3/nvidia/model.py:191-193",
                              "vLLM 0.33.0, vllm/models/minimax_m3/nvidia/model.py:99-107")
BLOCK_SIZE_SOURCE = "vLLM 0.34.0, vllm/platforms/interface.py:710-755 (0.33.0: :700-745)"
# indexer_kv_dtype -> bytes of one index key of `head` elements (MiniMaxM3IndexerCache.__init__)
# vLLM 0.33's MiniMaxM3TextConfig default sparse_attention_config (the fields this module reads).
PREVIEW_DEFAULT: Mapping[str, Any] = {"sparse_index_dim": 128, "sparse_attention_freq": [0] * 3 + [1] * 57}
_INDEXER_BYTES: dict[str, Callable[[int], int]] = {"bf16": lambda head: 2 * head, "fp8": lambda head: head, "fp8_e4m3": lambda head: head,
                  "nvfp4": lambda head: head // 2 + head // 16}


@dataclass(frozen=True)
class SparseIndexer:
    """The sparse layers of a MiniMax-M3 model and their indexer's key width."""

    layers: frozenset[int]   # decoder layers with sparse attention, each holding an indexer cache
    head_dim: int            # elements of one index key

    def token_bytes(self, indexer_kv_dtype: str = "bf16") -> int:
        """One token of one indexer cache (the same on every TP rank)."""
        return _INDEXER_BYTES[indexer_kv_dtype](self.head_dim)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def sparse_indexer(cfg: Mapping[str, Any], architectures: Sequence[str], num_layers: int,
                   version: VllmVersion | None) -> SparseIndexer | None:
    """The sparse layers and index key width vLLM `version` reads from this (text) config.json; None
    for a model that is not MiniMax-M3 or has no sparse layer."""
    if not ARCHITECTURES & set(architectures) and not str(cfg.get("model_type", "")).startswith("minimax_m3"):
        return None
    legacy = cfg.get("sparse_attention_config")
    legacy = legacy if isinstance(legacy, Mapping) else {} if LAYER_TYPES_SCHEMA.holds(version) else PREVIEW_DEFAULT
    freq = legacy.get("sparse_attention_freq")
    from_freq = frozenset(i for i, f in enumerate(freq) if f) if isinstance(freq, list) else frozenset()
    if LAYER_TYPES_SCHEMA.holds(version):
        types = cfg.get("layer_types")
        layers = frozenset(i for i, t in enumerate(types) if t == SPARSE_LAYER_TYPE) \
            if isinstance(types, list) else from_freq
        head = _int(cfg.get("index_head_dim")) or _int(legacy.get("sparse_index_dim")) or 128
    else:
        layers = from_freq
        head = _int(legacy.get("sparse_index_dim")) or 128
    layers = frozenset(i for i in layers if i < num_layers)
    return SparseIndexer(layers, head) if layers else None


def with_indexers(values: Sequence[Any], indexer: SparseIndexer | None, value: Any) -> list[Any]:
    """Per cache layer, in vLLM's order: each decoder layer's entry, a sparse one's followed by
    `value` for its indexer cache (`{prefix}.attn` then `{prefix}.attn.indexer`)."""
    if indexer is None:
        return list(values)
    out: list[Any] = []
    for i, v in enumerate(values):
        out.append(v)
        if i in indexer.layers:
            out.append(value)
    return out


def _accepts(rules: Sequence[BlockSizeRule], size: int) -> bool:
    """AttentionBackend.supports_block_size (vLLM 0.34.0, vllm/v1/attention/backend.py:122-141): a
    multiple of any kernel size, fixed sizes included (a kernel block divides the cache block)."""
    return not rules or any(size % (r.base if isinstance(r, MultipleOf) else r) == 0 for r in rules)


def common_block_size(per_backend: Sequence[Sequence[BlockSizeRule]], default: int) -> int | None:
    """Platform._preferred_block_size_for_backends for several backends: the default where every
    backend accepts it, else the smallest lcm of one kernel size per backend that all accept (None:
    they share none, which vLLM refuses)."""
    if all(_accepts(rules, default) for rules in per_backend):
        return default
    bases = [[r.base if isinstance(r, MultipleOf) else r for r in rules] or [1] for rules in per_backend]
    for candidate in sorted({math.lcm(*sizes) for sizes in itertools.product(*bases)}):
        if all(_accepts(rules, candidate) for rules in per_backend):
            return candidate
    return None


def sparse_block_size(indexer: SparseIndexer | None, num_layers: int, dense: Sequence[BlockSizeRule],
                      default: int) -> tuple[int, str] | None:
    """The block size a model with sparse layers gets where the user set none (GPU), and why: the one
    its dense, sparse and indexer backends all accept; None for a model without them, or none shared."""
    if indexer is None:
        return None
    dense_rules = [dense] if len(indexer.layers) < num_layers else []
    common = common_block_size(dense_rules + [SPARSE_KERNEL_BLOCKS, SPARSE_KERNEL_BLOCKS], default)
    return (common, f"the block every attention backend accepts ({BLOCK_SIZE_SOURCE})") if common else None
