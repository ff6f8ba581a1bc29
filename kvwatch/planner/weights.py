"""The bytes of a model's weights from its config.json, when the weight files are not on disk (pure).

Counts the tensors a decoder checkpoint holds, with the real attention shapes: q and o are
hidden x heads x head_dim, k and v hidden x kv_heads x head_dim (GQA), or the MLA projections;
the MLP (gate, up, down) per dense layer and per expert (routed and shared) of MoE layers; the
embeddings once when `tie_word_embeddings`, twice otherwise; norms are noise and left out.
Bytes per parameter follow `quantization_config`: 8-bit methods (fp8, int8, compressed-tensors
8-bit) 1 byte for the linear layers, 4-bit methods (awq, gptq, bitsandbytes 4-bit, mxfp4, nvfp4)
half a byte plus their group scales; embeddings and norms stay in the model dtype.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(cfg: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


@dataclass(frozen=True)
class WeightCount:
    linear_params: int      # attention and MLP projections (what quantization shrinks)
    embedding_params: int   # token embeddings and the LM head
    attention_params: int = 0   # the attention part of linear_params (some schemes leave it unquantized)
    # The shapes vLLM's profile run allocates activations by (planner/gpu_budget.py).
    vocab_size: int = 0
    hidden_size: int = 0
    mlp_width_per_token: int = 0   # MLP width one token passes through (MoE: the experts it is routed to)

    @property
    def params(self) -> int:
        return self.linear_params + self.embedding_params


def count_weights(cfg: Mapping[str, Any]) -> WeightCount | None:
    """Parameters of a decoder from its (text) config; None when the config lacks the shapes."""
    hidden, layers = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    heads = _int(cfg, "num_attention_heads")
    if not hidden or not layers or not heads:
        return None
    head_dim = _int(cfg, "head_dim") or hidden // heads
    kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads") or heads
    if cfg.get("kv_lora_rank"):   # MLA (DeepSeek-V2/V3, Kimi-K2)
        rank, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
        nope, v_dim = _int(cfg, "qk_nope_head_dim"), _int(cfg, "v_head_dim")
        q_rank = _int(cfg, "q_lora_rank")
        q_dim = heads * (nope + rope)
        q = hidden * q_rank + q_rank * q_dim if q_rank else hidden * q_dim
        attention = q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    else:
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    shared = _int(cfg, "n_shared_experts")
    shared_width = _int(cfg, "shared_expert_intermediate_size")
    dense_width = _int(cfg, "intermediate_size") or 4 * hidden
    moe_width = _int(cfg, "moe_intermediate_size") or dense_width
    if experts:
        dense_layers = _int(cfg, "first_k_dense_replace")
        step = _int(cfg, "decoder_sparse_step", "interleave_moe_layer_step") or 1
        moe_layers = len([i for i in range(dense_layers, layers) if (i + 1) % step == 0])
        dense_layers = layers - moe_layers
        per_moe = experts * 3 * hidden * moe_width + hidden * experts   # experts + router
        per_moe += shared * 3 * hidden * moe_width + (3 * hidden * shared_width if shared_width else 0)
        mlp = dense_layers * 3 * hidden * dense_width + moe_layers * per_moe
        routed = _int(cfg, "num_experts_per_tok", "moe_topk", "experts_per_token") or 1
        width = max(dense_width if dense_layers else 0,
                    routed * moe_width + shared * moe_width + shared_width)
    else:
        mlp = layers * 3 * hidden * dense_width
        width = dense_width
    vocab = _int(cfg, "vocab_size")
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return WeightCount(linear_params=layers * attention + mlp, embedding_params=embeddings,
                       attention_params=layers * attention,
                       vocab_size=vocab, hidden_size=hidden, mlp_width_per_token=width)


_EIGHT_BIT = ("fp8", "int8", "w8a8", "fbgemm_fp8", "modelopt", "experts_int8")
_FOUR_BIT = ("awq", "gptq", "bitsandbytes", "mxfp4", "nvfp4", "marlin", "int4", "w4a16", "modelopt_fp4")


def linear_bytes_per_param(quantization: Mapping[str, Any] | None, dtype_bytes: int) -> float:
    """Bytes per parameter of the linear layers under `quantization_config` (model dtype without one)."""
    if not quantization:
        return float(dtype_bytes)
    method = str(quantization.get("quant_method", "")).lower()
    bits = quantization.get("bits") or quantization.get("w_bit")
    if method == "bitsandbytes":
        return 1.0 if quantization.get("load_in_8bit") else 0.5 + 0.5 / 64
    if method == "compressed-tensors":
        groups = quantization.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, Mapping)]
        bits = next((w.get("num_bits") for w in weights if isinstance(w, Mapping) and w.get("num_bits")), bits)
    if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 16:
        group = quantization.get("group_size") or quantization.get("q_group_size") or 128
        scale = dtype_bytes / group if isinstance(group, int) and group > 0 else 0.0
        return bits / 8 + scale
    if method == "mxfp4":
        return 0.5 + 1 / 32          # OCP MX: one 8-bit scale per 32 values
    if method == "nvfp4" or method == "modelopt_fp4":
        return 0.5 + 1 / 16          # one fp8 scale per 16 values
    if any(m in method for m in _FOUR_BIT):
        return 0.5 + dtype_bytes / 128
    if any(m in method for m in _EIGHT_BIT):
        return 1.0
    return float(dtype_bytes)


def attention_unquantized(quantization: Mapping[str, Any] | None) -> bool:
    """The scheme leaves the attention projections in the model dtype (gpt-oss's MXFP4 lists
    `model.layers.*.self_attn` in modules_to_not_convert; compressed-tensors says `ignore`)."""
    if not quantization:
        return False
    skipped = quantization.get("modules_to_not_convert") or quantization.get("ignore") or ()
    return isinstance(skipped, (list, tuple)) and any(isinstance(m, str) and "attn" in m for m in skipped)


def bytes_of(count: WeightCount, quantization: Mapping[str, Any] | None, dtype_bytes: int) -> int:
    """The bytes of these parameters on the GPU: linear layers as `quantization_config` stores them,
    embeddings (and attention the scheme skips) in the model dtype."""
    per_param = linear_bytes_per_param(quantization, dtype_bytes)
    plain = count.attention_params if attention_unquantized(quantization) else 0
    return int((count.linear_params - plain) * per_param) + (count.embedding_params + plain) * dtype_bytes


def weights_bytes(cfg: Mapping[str, Any], dtype_bytes: int) -> int | None:
    """The weights' bytes on the GPU (all ranks together), or None when the config lacks shapes."""
    count = count_weights(cfg)
    if count is None:
        return None
    quantization = cfg.get("quantization_config")
    return bytes_of(count, quantization if isinstance(quantization, Mapping) else None, dtype_bytes)
