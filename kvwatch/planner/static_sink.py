"""openPangu's attention with static sink tokens, as vLLM builds its cache from config.json (pure).

vLLM 0.33.0 and 0.34.0 (the same code in both; citations are 0.34.0's):

- Which layers: an openPangu decoder layer is MLA when config.json has qk_nope_head_dim,
  qk_rope_head_dim, v_head_dim and kv_lora_rank, else sink attention when param_sink_number > 0
  (model_executor/models/openpangu.py:790-798; the MTP head builds the same decoder layer,
  openpangu_mtp.py:69). Every such layer is one.
- Its shape: K heads of qk_rope_dim + qk_nope_dim, V heads of v_channels, total KV heads / TP per
  rank (openpangu.py:569-576, :630-643); vLLM asserts the three fields are set (:573-575).
- Its spec: SinkFullAttentionSpec (layers/attention/static_sink_attention.py:211-225), a
  FullAttentionSpec with sink_len added (v1/kv_cache_interface.py:1266-1267): a page is
  block_size x KV heads x (K head + V head) x the KV dtype's bytes (:596-612, per token, per layer),
  in the KV cache dtype as any attention layer; no window, even where config.json sets
  interleaved_sliding_window (the spec drops the layer's window); memory per request as full
  attention, cdiv(max_model_len, block_size) pages (:654-659): the sink tokens take no block of
  the request's.
- Its grouping: registered with FullAttentionSpec as its uniform type (v1/core/
  single_type_kv_cache_manager.py:2748-2751), so it groups as full attention.
- Its block size: SinkFullAttentionManager asserts that block_size divides sink_len
  (single_type_kv_cache_manager.py:2224-2225) and reserves no block for the sinks in these releases.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.planner.config_keys import positive_field
from kvwatch.planner.flag_change import NO_CHANGE
from kvwatch.planner.predicted_refusal import CONFIG_REFUSED, PredictedRefusal

# The architectures whose decoder layer is openpangu.py's (vLLM 0.33.0/0.34.0 registry).
SINK_ARCHITECTURES = frozenset({"PanguEmbeddedForCausalLM", "PanguProMoEV2ForCausalLM",
                                "PanguUltraMoEForCausalLM", "OpenPanguMTPModel"})
_MLA_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")


@dataclass(frozen=True)
class SinkAttention:
    sink_len: int        # param_sink_number: static sink tokens of every layer
    head_size: int       # K: qk_rope_dim + qk_nope_dim
    head_size_v: int     # V: v_channels


def _positive(cfg: Mapping[str, Any], key: str) -> int:
    return positive_field(cfg, key, needs="openPangu's sink attention: vLLM asserts it is set")


def sink_attention(cfg: Mapping[str, Any], architectures: tuple[str, ...]) -> SinkAttention | None:
    """The sink attention of this (text) config.json's layers, or None where vLLM builds none."""
    if not SINK_ARCHITECTURES & set(architectures):
        return None
    sinks = cfg.get("param_sink_number")
    if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks <= 0:
        return None
    if all(k in cfg for k in _MLA_KEYS):   # hasattr: the MLA layer wins
        return None
    return SinkAttention(sinks, _positive(cfg, "qk_rope_dim") + _positive(cfg, "qk_nope_dim"),
                         _positive(cfg, "v_channels"))


def sink_backend(sink_len: int, platform: str) -> str | None:
    """The backend vLLM's sink layers run on: openpangu.py:641 passes FlashAttentionDiffKVBackend,
    a FlashAttentionBackend (v1/attention/backends/flash_attn_diffkv.py:35) with its block sizes,
    whatever the priorities or --attention-backend say; None where the model has no sink layer or
    the device is not CUDA (kvwatch plans no other platform's sink layers)."""
    return "FLASH_ATTN" if sink_len and platform == "cuda" else None


def sink_refusals(sink_len: int, kv_heads: int, tp: int, block_size: int) -> list[PredictedRefusal]:
    """What vLLM raises for sink layers of these KV heads, TP size and block size (openpangu.py:550-568:
    heads are split, never replicated; single_type_kv_cache_manager.py:2225: the block size divides
    the sinks)."""
    if not sink_len:
        return []
    if kv_heads > tp and kv_heads % tp:
        text = (f"total_num_kv_heads {kv_heads} is not divisible by tp_size {tp}: openPangu's sink attention "
                f"refuses it (ValueError); choose a --tensor-parallel-size that divides {kv_heads}")
    elif kv_heads < tp:
        text = (f"Number of KV heads {kv_heads} is less than TP size {tp}, KV heads replication is not support "
                f"yet: openPangu's sink attention refuses it (ValueError)")
    elif sink_len % block_size:
        text = (f"block size {block_size} does not divide the {sink_len} static sink tokens (param_sink_number): "
                f"vLLM's SinkFullAttentionManager asserts it does (AssertionError)")
    else:
        return []
    return [PredictedRefusal(CONFIG_REFUSED, text, NO_CHANGE)]
