"""Inkling's cache layers, as vLLM's own Inkling classes build them from config.json (pure).

Facts, vLLM 0.33.0 (0.32.0 and 0.34.0 have the same files), vllm/models/inkling/:

- configs.py:70-101 InklingModelConfig (vLLM's own class for model types inkling_model and
  inkling_mm_model, transformers_utils/config.py:174-175): head_dim defaults to hidden_size /
  num_attention_heads; the sliding layers' swa_num_key_value_heads and swa_head_dim to the global
  ones; sconv_kernel_size to the HF name conv_kernel_size, else 4; local_layer_ids to none;
  sliding_window_size 512 (configs.py:34).
- nvidia/model.py:140-170 InklingDecoderLayer: every decoder layer builds one InklingConvState and
  one InklingAttention, a layer in local_layer_ids with the swa_ heads and head size and
  `local_extent` sliding_window_size, the others with the global ones.
- nvidia/attention.py:183-199 InklingAttention.get_kv_cache_spec: a SlidingWindowSpec (window
  local_extent) for a local layer, else a FullAttentionSpec, at cache_config.block_size (the block
  size in force: not Attention.get_kv_cache_spec's kernel block), num_kv_heads max(1, heads / TP)
  (attention.py:103), the --kv-cache-dtype (attention.py:162-167).
- nvidia/sconv_swa_attn.py:121-193 InklingConvState: planner/inkling_ring.py. The ring's page does
  not follow --block-size; vLLM's page unification then scales the smaller pages' block sizes
  (v1/core/kv_cache_planning.py:346 unify_kv_cache_spec_page_size).

kvwatch plans the attention layers as its full and sliding layers (per-layer heads, as Gemma 4's)
and each ring as one more sliding-window layer of its own fixed block (kv_groups.LayerSpec).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import positive_field
from kvwatch.planner.flag_change import FlagChange
from kvwatch.planner.inkling_ring import RING_SOURCE, ConvRing, ring_head_size
from kvwatch.planner.kv_dtype_refusal import model_dtype
from kvwatch.planner.kv_groups import LayerSpec
from kvwatch.planner.layers import FULL, SLIDING, LayerLayout
from kvwatch.planner.predicted_refusal import CONFIG_REFUSED, PredictedRefusal

INKLING_MODEL_TYPES = frozenset({"inkling_model", "inkling_mm_model"})
# The cache kinds vLLM's Inkling classes build, for the architecture table (architecture_kinds.py).
INKLING_KINDS: dict[str, str] = {
    "InklingAttention": "Inkling attention (full, or sliding on local_layer_ids)",
    "InklingConvState": "Inkling short-convolution ring (a sliding window of sconv_kernel_size)",
}
_DEFAULT_WINDOW = 512   # configs.py:34 sliding_window_size
_DEFAULT_KERNEL = 4     # configs.py:99
# The engine's block size is its smallest prefix-cacheable group's: the rings' (vLLM 0.33.0,
# vllm/v1/engine/core.py:337-351; a SlidingWindowSpec is prefix cacheable).
RING_BLOCK_SOURCE = "the short-convolution rings' block (sconv_kernel_size, after page unification), the " \
                    "smallest KV cache group's (vLLM 0.33.0, vllm/v1/engine/core.py:337-351)"


@dataclass(frozen=True)
class InklingLayers:
    """Per decoder layer: sliding or not, its attention's KV heads and head size, its ring."""

    local: tuple[bool, ...]
    kv_heads: tuple[int, ...]
    head_sizes: tuple[int, ...]
    window: int
    rings: tuple[ConvRing, ...]


def is_inkling(model_type: str) -> bool:
    return model_type in INKLING_MODEL_TYPES


def _positive(cfg: Mapping[str, Any], key: str, default: int | None) -> int:
    return positive_field(cfg, key, default)


def inkling_layers(cfg: Mapping[str, Any], num_layers: int) -> InklingLayers:
    """The text config's layers as vLLM's InklingModelConfig and InklingDecoderLayer read them."""
    hidden = _positive(cfg, "hidden_size", None)
    heads = _positive(cfg, "num_attention_heads", None)
    kv_heads = _positive(cfg, "num_key_value_heads", None)
    head_dim = _positive(cfg, "head_dim", hidden // heads)
    swa_kv_heads = _positive(cfg, "swa_num_key_value_heads", kv_heads)
    swa_head_dim = _positive(cfg, "swa_head_dim", head_dim)
    kernel = _positive(cfg, "sconv_kernel_size", _positive(cfg, "conv_kernel_size", _DEFAULT_KERNEL))
    window = _positive(cfg, "sliding_window_size", _DEFAULT_WINDOW)
    listed = cfg.get("local_layer_ids") or []
    if not isinstance(listed, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
        raise ConfigError(f"config.json: field 'local_layer_ids' must be a list of layer numbers, "
                          f"got {str(listed)[:40]!r}")
    local = tuple(i in set(listed) for i in range(num_layers))
    layer_kv = tuple(swa_kv_heads if is_local else kv_heads for is_local in local)
    layer_dim = tuple(swa_head_dim if is_local else head_dim for is_local in local)
    rings = tuple(ConvRing(h, ring_head_size(d, hidden, h), kernel) for h, d in zip(layer_kv, layer_dim, strict=True))
    return InklingLayers(local, layer_kv, layer_dim, window, rings)


def inkling_layout(cfg: Mapping[str, Any], num_layers: int) -> LayerLayout:
    """The cache layers kvwatch plans: each decoder layer's attention (full or sliding, its own heads)
    and, beside them, each layer's ring."""
    layers = inkling_layers(cfg, num_layers)
    kinds = tuple(SLIDING if is_local else FULL for is_local in layers.local)
    return LayerLayout(kinds, layers.window if any(layers.local) else None, head_sizes=layers.head_sizes,
                       kv_heads=layers.kv_heads, conv_rings=layers.rings)


def ring_specs(rings: tuple[ConvRing, ...], tp: int, promoted_block: int | None = None) -> list[LayerSpec]:
    """Each ring's spec as kv_groups plans it: a sliding-window layer of window and block
    sconv_kernel_size, its page fixed by the ring (page unification may scale its block later).
    `promoted_block`: --disable-hybrid-kv-cache-manager beside full attention layers, where vLLM keeps
    each ring as a FullAttentionSpec at the full layers' block (_promote_local_kv_cache_specs,
    v1/core/kv_cache_planning.py:744-818): a page of that many tokens, held for the whole request."""
    if promoted_block is not None:
        pages = [ring.page_bytes(tp) // ring.kernel * promoted_block for ring in rings]
        return [LayerSpec(FULL, promoted_block, page, page) for page in pages]
    return [LayerSpec(SLIDING, ring.kernel, ring.page_bytes(tp), ring.page_bytes(tp), ring.kernel) for ring in rings]


def ring_promotion_refusal(layout: LayerLayout, kinds: list[str]) -> PredictedRefusal | None:
    """--disable-hybrid-kv-cache-manager on an Inkling with full and sliding attention layers: the
    promoted specs keep their windows, the rings' sconv_kernel_size and the sliding layers', and
    FullAttentionSpec.merge refuses two (vLLM 0.33.0, v1/kv_cache_interface.py:651-660, from
    kv_cache_planning.py:811; recorded from vLLM's own code by scripts/oracle_own_specs.py)."""
    if not layout.conv_rings or FULL not in kinds or SLIDING not in kinds:
        return None
    return PredictedRefusal(CONFIG_REFUSED, "ValueError: All attention layers in the same KV cache group must have "
                                            "the same window size. (--disable-hybrid-kv-cache-manager keeps the "
                                            "short-convolution rings' window beside the sliding layers')",
                            FlagChange(remove=("--disable-hybrid-kv-cache-manager",)))


def ring_dtype_refusal(layout: LayerLayout, dtype_flag: str, config_dtype: str | None) -> PredictedRefusal | None:
    """InklingConvState asserts the model runs in bfloat16 (sconv_swa_attn.py:170-172), in its words;
    `--dtype bfloat16` avoids it."""
    model = model_dtype(dtype_flag, config_dtype)
    if not layout.conv_rings or model == "bfloat16":
        return None
    return PredictedRefusal(CONFIG_REFUSED, f"AssertionError: sconv SWA cache supports bfloat16 only, got "
                                            f"torch.{model} ({RING_SOURCE}:170-172)",
                            FlagChange({"--dtype": "bfloat16"}))
