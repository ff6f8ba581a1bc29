"""The bytes of a model's weights from its config.json, when the weight files are not on disk (pure).

Counts the tensors a decoder checkpoint holds, with the real attention shapes: q and o are
hidden x heads x head_dim, k and v hidden x kv_heads x head_dim (GQA), or the MLA projections;
the MLP (gate, up, down; up and down for the families vLLM builds without a gate,
vllm_releases/mlp_shapes.py) per dense layer and per expert (routed and shared) of MoE layers; the
embeddings once when `tie_word_embeddings`, twice otherwise; norms are noise and left out.
Bytes per parameter follow `quantization_config`: AWQ, GPTQ, FP8, MXFP8, ModelOpt and compressed-tensors
as vLLM allocates them, part by part with the modules they leave unquantized (planner/quant_layout.py);
other 8-bit methods 1 byte for the linear layers, other 4-bit ones (bitsandbytes 4-bit, mxfp4, nvfp4)
half a byte plus their group scales; embeddings and norms stay in the model dtype. A quantization
the engine applies itself (`--quantization fp8` or `bitsandbytes` on an unquantized checkpoint)
counts the same way; a GGUF file stores every tensor, embeddings included, in its file type.
A multimodal checkpoint's vision tower (`vision_config`) and projector count in the model dtype.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.planner import quant_layout
from kvwatch.planner.config_defaults import HEAD_DIM_DEFAULTS, V_HEAD_DIM_FROM_HIDDEN
from kvwatch.planner.deepseek_v4 import MXFP4_BYTES_PER_PARAM
from kvwatch.planner.encoder_cache import EncoderShape, encoder_shape
from kvwatch.planner.encoder_forward import vision_mlp_width
from kvwatch.planner.gemma4_weights import gemma4_params
from kvwatch.planner.longcat_flash_weights import flash_blocks
from kvwatch.planner.mamba_mixer_weights import (
    GRANITE_HYBRID,
    falcon_h1_mixers,
    granite_hybrid_mixers,
    jamba_layers,
    lfm2_mixers,
    lfm2_mlp_width,
    pure_mamba_mixers,
)
from kvwatch.planner.nemotron_h_weights import NemotronHParams, nemotron_h_params
from kvwatch.planner.step3_text_weights import step3_attention, step3_moe_layers, step3_shared_width
from kvwatch.values.config_values import positive_int as _int
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.mllama_profile import MllamaVision, mllama_vision
from kvwatch.vllm_releases.mlp_shapes import non_gated_mlp
from kvwatch.vllm_releases.moe_kernels import MARLIN_TILES, mxfp4_expert_tiles
from kvwatch.vllm_releases.rope_cache import MROPE_MODEL_TYPES, deepstack_levels, rope_cache_elements


def _model_type(cfg: Mapping[str, Any]) -> str | None:
    """config.json's model_type where it is a string (a hostile config may hold anything there)."""
    value = cfg.get("model_type")
    return value if isinstance(value, str) else None



@dataclass(frozen=True)
class WeightCount:
    linear_params: int      # attention and MLP projections (what quantization shrinks)
    embedding_params: int   # token embeddings and the LM head
    attention_params: int = 0   # the attention part of linear_params (some schemes leave it unquantized)
    # The shapes vLLM's profile run allocates activations by (planner/gpu_budget.py).
    vocab_size: int = 0
    hidden_size: int = 0
    mlp_width_per_token: int = 0   # MLP width one token passes through (MoE: the experts it is routed to)
    vision_params: int = 0         # a multimodal checkpoint's vision tower and projector (kept unquantized)
    expert_matrices: int = 0       # MoE: routed experts over all MoE layers (each gate, up and down)
    moe_width: int = 0             # MoE: one expert's intermediate size
    experts_per_token: int = 0     # MoE: routed experts per token (top-k)
    encoder: EncoderShape | None = None   # a multimodal checkpoint's encoder outputs (planner/encoder_cache.py)
    mlp_matrices: int = 3   # 3 for a gated MLP (gate, up, down), 2 without a gate (vllm_releases/mlp_shapes.py)
    num_layers: int = 0
    # A dense decoder layer's parameters in the order vLLM's module holds them (qkv, o, gate-up or up,
    # down; norms left out); empty for MoE and MLA layers. --cpu-offload-gb moves them whole, in order.
    layer_params: tuple[int, ...] = ()
    # MLA: (q input width, heads, rope, kv_lora_rank, nope, v head) for the absorbed copies of V0 0.7.x
    mla_shape: tuple[int, int, int, int, int, int] | None = None
    # Loaded with the weights, outside the checkpoint (vllm_releases/rope_cache.py): the rotary cos/sin
    # cache's values (whole on every rank), and Qwen3-VL's deepstack buffers (levels x batched tokens x hidden).
    rope_cache_elements: int = 0
    deepstack_levels: int = 0
    # MoE: the routers (hidden x experts per MoE layer, part of linear_params). vLLM builds each as a
    # ReplicatedLinear without quantization: whole on every tensor-parallel rank, in the model dtype
    # (vLLM 0.7.3 models/deepseek_v2.py:118-122, 0.8.5.post1 qwen3_moe.py:122-126, 0.19.1 mixtral.py:120-126;
    # GPTQ/AWQ ignored for it: 0.10.2 qwen3_moe.py:153-158 _maybe_ignore_quant_config).
    router_params: int = 0
    # MLA: the projections vLLM builds as ReplicatedLinear, whole on every rank and quantized as the other
    # linear layers: q_a_proj (hidden x q_lora_rank) and kv_a_proj_with_mqa (hidden x (kv_lora_rank + rope))
    # (vLLM 0.7.3, vllm/model_executor/models/deepseek_v2.py:374-402; 0.19.1 deepseek_v2.py:457-488).
    replicated_linear_params: int = 0
    # Llama 3.2 Vision: the vision tower's shapes its V0 memory profile peaks by (vllm_releases/mllama_profile.py)
    mllama_vision: MllamaVision | None = None
    # MoE: each routed expert's matrices (3 gated: gate, up, down; 2 without a gate, Nemotron-H's relu2) and
    # the width they run at (0: hidden_size; Nemotron-H's latent MoE runs them at moe_latent_size)
    matrices_per_expert: int = 3
    expert_hidden: int = 0

    @property
    def params(self) -> int:
        return self.linear_params + self.embedding_params + self.vision_params

    @property
    def routed_expert_params(self) -> int:
        """The routed experts' parameters over all MoE layers (part of linear_params)."""
        return self.expert_matrices * self.matrices_per_expert * (self.expert_hidden or self.hidden_size) * self.moe_width


def count_weights(cfg: Mapping[str, Any]) -> WeightCount | None:
    """Parameters of a decoder from its (text) config; None when the config lacks the shapes."""
    hybrid = nemotron_h_params(cfg)   # one block per layer (planner/nemotron_h_weights.py)
    if hybrid is not None:
        return _nemotron_h_count(cfg, hybrid)
    hidden, layers = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    mamba_only = pure_mamba_mixers(cfg, hidden, layers)   # no attention heads at all
    if mamba_only is not None:
        return WeightCount(linear_params=mamba_only, embedding_params=_embedding_params(cfg, hidden),
                           attention_params=mamba_only, vocab_size=_int(cfg, "vocab_size"), hidden_size=hidden,
                           num_layers=layers)
    heads = _int(cfg, "num_attention_heads")
    if not hidden or not layers or not heads:
        return None
    # a class that fixes head_dim fills it when the file has none, as vLLM reads it (planner/config_defaults.py)
    head_dim = _int(cfg, "head_dim") or HEAD_DIM_DEFAULTS.get(_model_type(cfg) or "", 0) or hidden // heads
    kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads") or heads
    mla_shape: tuple[int, int, int, int, int, int] | None = None
    replicated_linear = 0
    if cfg.get("kv_lora_rank"):   # MLA (DeepSeek-V2/V3, Kimi-K2)
        rank, rope = _int(cfg, "kv_lora_rank"), _int(cfg, "qk_rope_head_dim")
        nope, v_dim = _int(cfg, "qk_nope_head_dim"), _int(cfg, "v_head_dim")
        if not v_dim and _model_type(cfg) in V_HEAD_DIM_FROM_HIDDEN:   # the class derives it (planner/config_defaults.py)
            v_dim = hidden // heads
        q_rank = _int(cfg, "q_lora_rank")
        q_dim = heads * (nope + rope)
        q = hidden * q_rank + q_rank * q_dim if q_rank else hidden * q_dim
        attention = q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
        mla_shape = (q_rank or hidden, heads, rope, rank, nope, v_dim)
        replicated_linear = layers * (hidden * q_rank + hidden * (rank + rope))
    elif (step3 := step3_attention(cfg, hidden, heads, head_dim)) is not None:
        attention = step3.per_layer   # a low-rank query and one KV head (planner/step3_text_weights.py)
        replicated_linear = layers * step3.replicated
    else:
        attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
        if _model_type(cfg) == "afmoe":   # a gating projection beside q, k, v, o (vLLM 0.32.0 models/afmoe.py:215-222)
            attention += hidden * heads * head_dim
    gemma4 = gemma4_params(cfg, hidden, heads, head_dim, kv_heads, layers)   # per-layer shapes (planner/gemma4_weights.py)
    if gemma4 is not None:
        attention = gemma4.attention // layers
    jamba = jamba_layers(cfg, attention, hidden, layers)   # Mamba1 layers and MoE every other layer
    mixers = gated_delta_net_attention_params(cfg, hidden, heads, head_dim, kv_heads, layers) \
        or granite_hybrid_mixers(cfg, attention, hidden, layers) or (jamba[0] if jamba else None) \
        or falcon_h1_mixers(cfg, attention, hidden, layers) or lfm2_mixers(cfg, attention, hidden, layers)
    attention_total = gemma4.attention if gemma4 is not None else mixers if mixers is not None else layers * attention
    experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    one_layer: tuple[int, ...] = ()
    # shared experts of the experts' width: DeepSeek's n_shared_experts, ERNIE 4.5's moe_num_shared_experts
    # (vLLM 0.32.0 models/ernie45_moe.py:133, :170-171), AFMoE's num_shared_experts (afmoe.py:77, :109-110)
    shared = _int(cfg, "n_shared_experts", "moe_num_shared_experts", "num_shared_experts")
    shared_width = _int(cfg, "shared_expert_intermediate_size", "shared_intermediate_size") \
        or step3_shared_width(cfg)   # Granite 4.0's name; Step3's share_expert_dim
    dense_width = lfm2_mlp_width(cfg) or _int(cfg, "intermediate_size") or 4 * hidden
    moe_width = _int(cfg, "moe_intermediate_size") or dense_width
    if _model_type(cfg) == "hunyuan_v1_moe":
        # Hunyuan's per-layer lists (moe_intermediate_size, moe_topk) and the shared MLP of intermediate_size that
        # every MoE block holds (vLLM 0.32.0 builds it through the Transformers backend: transformers 5.19.0
        # models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py:283-289, :70-73)
        moe_width = _first_of_list(cfg, "moe_intermediate_size") or moe_width
        shared_width = shared_width or dense_width
    if _model_type(cfg) == "llama4_text":
        # Llama 4: every MoE layer adds one shared expert of the experts' width, and a dense layer's MLP is
        # intermediate_size_mlp wide (vLLM 0.32.0, vllm/model_executor/models/llama4.py:100-113, :344-356)
        shared_width = shared_width or moe_width
        dense_width = _int(cfg, "intermediate_size_mlp") or dense_width
    if experts:
        step3_moe = step3_moe_layers(cfg, layers)   # the layers moe_layers_enum names (planner/step3_text_weights.py)
        moe_layers = jamba[1] if jamba else len(step3_moe) if step3_moe is not None else len(moe_layer_indices(cfg, layers))
        dense_layers = layers - moe_layers
        routes = experts   # the router's outputs
        if (flash := flash_blocks(cfg)) is not None:
            # LongCat-Flash: two dense MLPs beside each block's MoE, whose router also scores the zero
            # experts (planner/longcat_flash_weights.py)
            moe_layers, dense_layers, routes = flash.blocks, flash.sublayers, flash.router_outputs
        per_moe = experts * 3 * hidden * moe_width + hidden * routes   # experts + router
        per_moe += shared * 3 * hidden * moe_width + (3 * hidden * shared_width if shared_width else 0)
        mlp = dense_layers * 3 * hidden * dense_width + moe_layers * per_moe
        router = moe_layers * hidden * routes
        routed = _int(cfg, "num_experts_per_tok", "moe_topk", "experts_per_token") or _first_of_list(cfg, "moe_topk") or 1
        width = max(dense_width if dense_layers else 0,
                    routed * moe_width + shared * moe_width + shared_width)
    else:
        if _model_type(cfg) == GRANITE_HYBRID and shared_width:
            dense_width = shared_width   # no experts: the shared MLP is the layer's MLP (granitemoehybrid.py:92-106)
        two_matrix = non_gated_mlp(cfg.get("model_type"))
        if two_matrix is not None:
            dense_width = (_int(cfg, two_matrix.width_key) if two_matrix.width_key else 0) \
                or two_matrix.hidden_multiple * hidden or dense_width
        matrices = 2 if two_matrix is not None else 3
        mlp = layers * matrices * hidden * dense_width
        width = dense_width
        if gemma4 is not None:
            mlp, width = gemma4.mlp + gemma4.per_layer_linear, gemma4.widest_mlp
        if not cfg.get("kv_lora_rank"):
            out = hidden * heads * head_dim
            one_layer = (attention - out, out, (matrices - 1) * hidden * dense_width, hidden * dense_width)
    vocab = _int(cfg, "vocab_size")
    embeddings = _embedding_params(cfg, hidden) + (gemma4.per_layer_embedding if gemma4 else 0)
    return WeightCount(linear_params=attention_total + mlp, embedding_params=embeddings,
                       attention_params=attention_total,
                       vocab_size=vocab, hidden_size=hidden, mlp_width_per_token=width,
                       expert_matrices=moe_layers * experts if experts else 0, moe_width=moe_width if experts else 0,
                       experts_per_token=routed if experts else 0,
                       mlp_matrices=3 if experts else matrices, num_layers=layers, layer_params=one_layer,
                       mla_shape=mla_shape, rope_cache_elements=rope_cache_elements(cfg),
                       router_params=router if experts else 0, replicated_linear_params=replicated_linear)


def _embedding_params(cfg: Mapping[str, Any], hidden: int) -> int:
    """The token embedding and the LM head: once when tie_word_embeddings, twice otherwise."""
    return _int(cfg, "vocab_size") * hidden * (1 if cfg.get("tie_word_embeddings") else 2)


def _first_of_list(cfg: Mapping[str, Any], key: str) -> int:
    """A per-layer list's first value where the field is a list of positive integers (Hunyuan's), else 0."""
    value = cfg.get(key)
    first = value[0] if isinstance(value, list) and value else None
    return first if isinstance(first, int) and not isinstance(first, bool) and first > 0 else 0


def moe_layer_indices(cfg: Mapping[str, Any], layers: int) -> list[int]:
    """The layers vLLM builds with experts: after a dense prefix (DeepSeek's first_k_dense_replace, AFMoE's
    num_dense_layers: vLLM 0.32.0 models/afmoe.py:310), inside ERNIE 4.5's moe_layer_start_index to
    moe_layer_end_index (ernie45_moe.py:337-348), every decoder_sparse_step / interleave_moe_layer_step /
    moe_layer_interval-th layer."""
    first = max(_int(cfg, "first_k_dense_replace", "num_dense_layers"), _int(cfg, "moe_layer_start_index"))
    last = _int(cfg, "moe_layer_end_index") or layers - 1
    step = _int(cfg, "decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_interval") or 1
    return [i for i in range(first, min(last, layers - 1) + 1) if (i + 1) % step == 0]


def _nemotron_h_count(cfg: Mapping[str, Any], hybrid: NemotronHParams) -> WeightCount:
    hidden, vocab = _int(cfg, "hidden_size"), _int(cfg, "vocab_size")
    return WeightCount(linear_params=hybrid.linear, attention_params=hybrid.attention,
                       embedding_params=_embedding_params(cfg, hidden),
                       vocab_size=vocab, hidden_size=hidden, mlp_width_per_token=hybrid.mlp_width,
                       expert_matrices=hybrid.expert_units, moe_width=hybrid.moe_width,
                       experts_per_token=hybrid.routed, mlp_matrices=2, num_layers=hybrid.layers,
                       rope_cache_elements=rope_cache_elements(cfg), router_params=hybrid.routers,
                       matrices_per_expert=2, expert_hidden=hybrid.expert_hidden)


# Gated-delta-net hybrids: every full_attention_interval-th layer attends, the others are gated delta
# nets (planner/layers.py's rule). Qwen3.5 builds Qwen3-Next's attention (vLLM 0.33.0,
# vllm/model_executor/models/qwen3_5.py:81-82, :158).
GATED_DELTA_NET_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})


def gated_delta_net_attention_params(cfg: Mapping[str, Any], hidden: int, heads: int, head_dim: int,
                                     kv_heads: int, layers: int) -> int:
    """The token mixers' parameters of a gated-delta-net hybrid (0 for any other model), as vLLM
    0.10.2 builds them (vllm/model_executor/models/qwen3_next.py):
    - a gated delta net layer (Qwen3NextGatedDeltaNet, :225-305): in_proj, hidden x (2 key_dim +
      2 value_dim + 2 value heads) (:254-262); conv1d, (2 key_dim + value_dim) x kernel (:244-252);
      out_proj, value_dim x hidden (:304); dt_bias and A_log, one per value head;
    - an attention layer (Qwen3NextAttention, :655-672): q doubled by the output gate
      (`total_num_heads * (1 + attn_output_gate)`, the gate on unless the config says not), k, v, o."""
    if _model_type(cfg) not in GATED_DELTA_NET_MODEL_TYPES:
        return 0
    k_heads, v_heads = _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads")
    key_dim, value_dim = k_heads * _int(cfg, "linear_key_head_dim"), v_heads * _int(cfg, "linear_value_head_dim")
    if not key_dim or not value_dim:
        return 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        full = sum(1 for t in types if t == "full_attention")
    else:
        interval = _int(cfg, "full_attention_interval") or 4
        full = sum((i + 1) % interval == 0 for i in range(layers))
    gate = 0 if cfg.get("attn_output_gate") is False else 1
    attention = hidden * heads * head_dim * (1 + gate) + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    kernel = _int(cfg, "linear_conv_kernel_dim") or 4
    delta_net = (hidden * (2 * key_dim + 2 * value_dim + 2 * v_heads) + (2 * key_dim + value_dim) * kernel
                 + value_dim * hidden + 2 * v_heads)
    return full * attention + (layers - full) * delta_net


def vision_tower_params(config: Mapping[str, Any]) -> int:
    """Parameters of a multimodal checkpoint's vision encoder and projector from `vision_config`
    (0 without one): each layer's attention (4 x width^2) and MLP (2 matrices, 3 when gated), for
    `depth`/`num_hidden_layers` (+ Mllama's `num_global_layers`), then the projector into the
    language model: Qwen-VL's patch merger(s) (width x merge^2, two matrices each) or a two-layer MLP."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    width = _int(vision, "embed_dim", "hidden_size", "width")
    layers = _int(vision, "depth", "num_hidden_layers", "num_layers") + _int(vision, "num_global_layers")
    if not width or not layers:
        return 0
    mlp = vision_mlp_width(vision, width)
    gated = str(vision.get("hidden_act", "")).lower() in ("silu", "swiglu")
    per_layer = 4 * width * width + (3 if gated else 2) * width * mlp
    text_config = config.get("text_config")
    text = text_config if isinstance(text_config, Mapping) else config
    text_hidden = _int(text, "hidden_size") or width
    out = _int(vision, "out_hidden_size") or text_hidden
    merge = _int(vision, "spatial_merge_size") or _int(config, "spatial_merge_size")
    if merge and ("embed_dim" in vision or "out_hidden_size" in vision):
        # Qwen2-VL/2.5-VL/3-VL: a merger MLP over merge x merge patches, and Qwen3-VL one more for
        # each deepstack layer (vLLM 0.13 models/qwen3_vl.py: deepstack_merger_list)
        merged = width * merge * merge
        deepstack = vision.get("deepstack_visual_indexes")
        mergers = 1 + (len(deepstack) if isinstance(deepstack, (list, tuple)) else 0)
        projector = mergers * (merged * merged + merged * out)
    else:
        projector = (_int(vision, "vision_output_dim") or width) * text_hidden + text_hidden * text_hidden
    return layers * per_layer + projector


def count_model_weights(config: Mapping[str, Any], text: Mapping[str, Any]) -> WeightCount | None:
    """The checkpoint's parameters: the language model from its (text) config, plus the vision
    tower of a multimodal config."""
    count = count_weights(text)
    if count is None:
        return None
    if _model_type(config) in MROPE_MODEL_TYPES:
        count = replace(count, rope_cache_elements=rope_cache_elements(text, multimodal_rope=True),
                        deepstack_levels=deepstack_levels(config))
    vision = vision_tower_params(config)
    if not vision:
        return count
    return replace(count, vision_params=vision, encoder=encoder_shape(config), mllama_vision=mllama_vision(config))


# GGUF block sizes (ggml's type table: bytes per block / values per block) by the file type in the
# file name; a K-quant mix (_S/_M/_L) is counted at its base type.
_GGUF_BITS = {"F32": 32.0, "F16": 16.0, "BF16": 16.0, "Q8_0": 34 * 8 / 32, "Q6_K": 210 * 8 / 256,
              "Q5_K": 176 * 8 / 256, "Q5_1": 24 * 8 / 32, "Q5_0": 22 * 8 / 32, "Q4_K": 144 * 8 / 256,
              "Q4_1": 20 * 8 / 32, "Q4_0": 18 * 8 / 32, "Q3_K": 110 * 8 / 256, "Q2_K": 84 * 8 / 256}


def gguf_bytes_per_param(model: str) -> float | None:
    """Bytes per parameter of a GGUF file from the type its name carries (`...-Q4_K_M.gguf`)."""
    name = model.replace("\\", "/").rsplit("/", 1)[-1].upper()
    for kind, bits in _GGUF_BITS.items():
        if kind in name.replace("-", "_"):
            return bits / 8
    return None


# What `--quantization` asks the engine to do to an unquantized checkpoint, as a quantization_config.
_ONLINE = {"fp8": {"quant_method": "fp8"}, "mxfp8": {"quant_method": "mxfp8"}, "ptpc_fp8": {"quant_method": "fp8"}, "fbgemm_fp8": {"quant_method": "fp8"},
           "bitsandbytes": {"quant_method": "bitsandbytes"}, "experts_int8": {"quant_method": "experts_int8"}}


_EIGHT_BIT = ("fp8", "int8", "w8a8", "fbgemm_fp8", "modelopt", "experts_int8")
_FOUR_BIT = ("awq", "gptq", "bitsandbytes", "mxfp4", "nvfp4", "marlin", "int4", "w4a16", "modelopt_fp4")


def linear_bytes_per_param(quantization: Mapping[str, Any] | None, dtype_bytes: int) -> float:
    """Bytes per parameter of the linear layers under `quantization_config` (model dtype without one):
    the schemes planner/quant_layout.py reads from vLLM's own tensors, else bits and group scales."""
    if not quantization:
        return float(dtype_bytes)
    if quant_layout.handled(quantization):
        return quant_layout.scheme_rate(quantization, dtype_bytes)
    method = str(quantization.get("quant_method", "")).lower()
    bits = quantization.get("bits") or quantization.get("w_bit")
    # compressed-tensors and ModelOpt are quant_layout's (handled above): what is left is bits and group scales
    group = quantization.get("group_size") or quantization.get("q_group_size") or 128
    if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 16:
        scale = dtype_bytes / group if isinstance(group, int) and not isinstance(group, bool) and group > 0 else 0.0
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
    embeddings, MoE routers (and attention the scheme skips) in the model dtype."""
    if quantization and quant_layout.handled(quantization):
        return _bytes_by_part(count, quantization, dtype_bytes)
    per_param = linear_bytes_per_param(quantization, dtype_bytes)
    plain = (count.attention_params if attention_unquantized(quantization) else 0) + count.router_params
    return int((count.linear_params - plain) * per_param) + (count.embedding_params + plain) * dtype_bytes


def _bytes_by_part(count: WeightCount, quantization: Mapping[str, Any], dtype_bytes: int) -> int:
    """Each part of the linear layers (attention, dense MLPs and shared experts, routed experts) at the rate
    the checkpoint's scheme gives its modules (planner/quant_layout.py); routers and embeddings in the dtype."""
    experts = count.routed_expert_params
    mlp = count.linear_params - count.attention_params - count.router_params - experts
    layers = count.num_layers
    quantized = (count.attention_params * quant_layout.part_rate(quantization, "attention", layers, dtype_bytes)
                 + mlp * quant_layout.part_rate(quantization, "mlp", layers, dtype_bytes)
                 + experts * quant_layout.part_rate(quantization, "experts", layers, dtype_bytes))
    return int(quantized) + (count.embedding_params + count.router_params) * dtype_bytes


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def mxfp4_expert_padding(count: WeightCount, tensor_parallel: int, capability: tuple[int, int] | None,
                         moe_backend: str | None = None, version: tuple[int, int, int] | None = None) -> int:
    """Parameters (all ranks) MXFP4 MoE layers add by padding each rank's experts to the kernel's tiles
    (vllm_releases/moe_kernels.py mxfp4_expert_tiles; `version`: the release's parts, None for kvwatch's
    default release)."""
    tiles = mxfp4_expert_tiles(capability, version or DEFAULT_RELEASE.parts, moe_backend)
    if not count.expert_matrices or tiles is None:
        return 0
    return _padding_params(count, tensor_parallel, tiles)


def mxfp4_padding_bytes(count: WeightCount, quantization: Mapping[str, Any] | None, dtype_bytes: int,
                        tensor_parallel: int, capability: tuple[int, int] | None, moe_backend: str | None = None,
                        version: tuple[int, int, int] | None = None) -> int:
    """Bytes (all ranks) an MXFP4 checkpoint's experts gain as their kernel allocates them (0 for another
    scheme): what the checkpoint's own count, or its files, lack."""
    if not quantization or str(quantization.get("quant_method", "")).lower() != "mxfp4":
        return 0
    padding = mxfp4_expert_padding(count, tensor_parallel, capability, moe_backend, version)
    return int(padding * linear_bytes_per_param(quantization, dtype_bytes))


def _padding_params(count: WeightCount, tensor_parallel: int, tiles: tuple[int, int] = MARLIN_TILES) -> int:
    tp = max(1, tensor_parallel)
    width = _round_up(-(-count.moe_width // tp), tiles[0]) * tp
    hidden = _round_up(count.hidden_size, tiles[1])
    return count.expert_matrices * 3 * (hidden * width - count.hidden_size * count.moe_width)


# vLLM's Triton MXFP4 MoE backend is the default on Hopper once the release ships triton_kernels itself (vLLM
# 0.12.0, vllm/third_party/triton_kernels; 0.14.1 model_executor/layers/quantization/mxfp4.py:153-172 picks it
# on SM90 without the FlashInfer opt-in; 0.19.1 model_executor/layers/fused_moe/oracle/mxfp4.py:174-183 lists
# it first there). It keeps the checkpoint-layout block scales beside the swizzled copy it hands the kernel
# (0.19.1 quantization/mxfp4.py:297-307 replaces only the weights) until 0.25 deletes them (0.25.1
# fused_moe/oracle/mxfp4.py:1155; 0.24.0 still keeps them).
MXFP4_TRITON_SINCE = (0, 12, 0)
MXFP4_SCALE_COPY_FREED_SINCE = (0, 25, 0)
_MXFP4_BLOCK = 32          # values per 8-bit scale (quantization/mxfp4.py: mxfp4_block)
# HopperMXScaleLayout: 2 x num_warps (8) x 2 x 8 rows (vLLM 0.19.1,
# vllm/third_party/triton_kernels/tensor_details/layout_details/hopper_scale.py:30-32)
_SCALE_SWIZZLE_ROWS = 256
_MXFP4_BYTES_PER_PARAM = 0.5 + 1 / _MXFP4_BLOCK   # a 4-bit value and its share of an 8-bit scale


def mxfp4_triton_hopper_bytes(count: WeightCount, tensor_parallel: int, capability: tuple[int, int] | None,
                              version: tuple[int, int, int]) -> int:
    """Bytes (all ranks together) the Triton MXFP4 MoE backend holds on a Hopper card beyond the
    checkpoint's expert weights and scales, per rank and MoE layer (E experts, H hidden, I the rank's
    expert width rounded up to 64: vLLM 0.14.1, quantization/mxfp4.py:328-330):
    - the width padding of the uint8 weights (H x 3I / 2) and scales (H x 3I / 32);
    - the swizzled scales (`_swizzle_mxfp4`, quantization/utils/mxfp4_utils.py): rows padded to 256,
      columns to 2 (gate/up: 2I x H/32; down: H x I/32), beside the checkpoint-layout scales until
      0.25 (MXFP4_SCALE_COPY_FREED_SINCE), in their place after;
    - the biases cast to float32 (`w13_bias.to(torch.float32)`: 2I + H per expert; the count has none).
    The swizzled weights replace the checkpoint's (`del layer.w13_weight`); Hopper's value layout pads
    rows to 16 and byte columns to 32 (0.19.1 triton_kernels layout_details/hopper_value.py:154-156)."""
    if not count.expert_matrices or capability is None or capability[0] != 9:
        return 0
    if version < MXFP4_TRITON_SINCE:
        # no triton_kernels in the release: Hopper falls back to Marlin and its padding (vLLM 0.10.2,
        # vllm/model_executor/layers/quantization/mxfp4.py:88-94 and :184-195; 0.11.0 the same)
        return int(_padding_params(count, tensor_parallel) * _MXFP4_BYTES_PER_PARAM)
    tp = max(1, tensor_parallel)
    hidden, width = count.hidden_size, -(-count.moe_width // tp)
    padded = _round_up(width, 64)
    values = (_round_up(2 * padded, 16) * _round_up(hidden // 2, 32) + _round_up(hidden, 16) * _round_up(padded // 2, 32))
    scales = 2 * padded * (hidden // _MXFP4_BLOCK) + hidden * (padded // _MXFP4_BLOCK)
    swizzled = (_round_up(2 * padded, _SCALE_SWIZZLE_ROWS) * _round_up(hidden // _MXFP4_BLOCK, 2)
                + _round_up(hidden, _SCALE_SWIZZLE_ROWS) * _round_up(padded // _MXFP4_BLOCK, 2))
    checkpoint = 3 * hidden * width // 2 + 3 * hidden * width // _MXFP4_BLOCK
    kept = scales if version < MXFP4_SCALE_COPY_FREED_SINCE else 0
    biases = (2 * padded + hidden) * 4
    per_matrix_set = values + kept + swizzled + biases - checkpoint
    return max(0, per_matrix_set) * count.expert_matrices * tp


def mla_absorbed_bytes(count: WeightCount, tensor_parallel: int, model_dtype_bytes: int, fp8_weights: bool,
                       version: tuple[int, int, int]) -> int:
    """What V0's MLA backend of 0.7.1-0.7.3 adds per rank once the weights are loaded: it absorbs
    W_UK into the q projection and W_UV into o_proj for decode and keeps the raw weights for prefill
    (VLLM_MLA_PERFORM_MATRIX_ABSORPTION, on by default; vLLM 0.7.3,
    vllm/attention/backends/mla/utils.py:232-393): W_QR (q input x heads x rope, model dtype), W_Q_UK
    (q input x heads x kv_lora_rank) and W_UV_O (heads x kv_lora_rank x hidden), both requantized to
    FP8 for an FP8 checkpoint (:329-384), else in the model dtype; an FP8 checkpoint's kv_b_proj is
    dequantized and its W_UK/W_UV views keep that copy (:297, :346). The loader runs this before it
    reports the weights (model_loader/loader.py). 0.8 has no absorption flag (vLLM 0.8.0, vllm/envs.py)."""
    if count.mla_shape is None or not (0, 7, 1) <= version < (0, 8, 0):
        return 0
    q_in, heads, rope, rank, nope, v_dim = count.mla_shape
    local = -(-heads // max(1, tensor_parallel))
    absorbed = 1 if fp8_weights else model_dtype_bytes
    per_layer = q_in * local * rope * model_dtype_bytes
    per_layer += (q_in * local * rank + local * rank * count.hidden_size) * absorbed
    if fp8_weights:
        per_layer += rank * local * (nope + v_dim) * model_dtype_bytes
    return per_layer * count.num_layers


def gpu_weights_bytes(count: WeightCount, quantization: Mapping[str, Any] | None, dtype_bytes: int,
                      engine_quantization: str | None = None, model: str = "", tensor_parallel: int = 1,
                      capability: tuple[int, int] | None = None, moe_backend: str | None = None,
                      version: tuple[int, int, int] | None = None) -> int:
    """The weights' bytes on the GPUs (all ranks together) as the engine loads them: the
    checkpoint's quantization_config, else what `--quantization` asks of the engine (online FP8,
    bitsandbytes; a GGUF file in its type), else the model dtype; MXFP4 experts with the padding
    their kernel needs on this card, or the Marlin kernel's where `--moe-backend marlin` asks for it.
    The vision tower stays in the model dtype."""
    method = (engine_quantization or "").strip().lower()
    if quantization and str(quantization.get("quant_method", "")).lower() == "mxfp4":
        return bytes_of(count, quantization, dtype_bytes) + count.vision_params * dtype_bytes + mxfp4_padding_bytes(
            count, quantization, dtype_bytes, tensor_parallel, capability, moe_backend, version)
    vision = count.vision_params * dtype_bytes
    if quantization and quantization.get("expert_dtype") == "fp4":   # DeepSeek-V4's MXFP4 experts (planner/deepseek_v4.py)
        experts = count.routed_expert_params
        fp8 = linear_bytes_per_param(quantization, dtype_bytes)
        return bytes_of(count, quantization, dtype_bytes) - int(experts * (fp8 - MXFP4_BYTES_PER_PARAM)) + vision
    if method == "gguf":
        per_param = gguf_bytes_per_param(model)
        if per_param is not None:
            return int((count.linear_params + count.embedding_params) * per_param) + vision
    if not quantization and method in _ONLINE:
        quantization = _ONLINE[method]
    return bytes_of(count, quantization, dtype_bytes) + vision


def replicated_linear_bytes(count: WeightCount, quantization: Mapping[str, Any] | None, dtype_bytes: int,
                            engine_quantization: str | None = None) -> int:
    """The bytes (all layers) of the linear layers vLLM keeps whole on every tensor-parallel rank
    (WeightCount.replicated_linear_params), quantized as the checkpoint or `--quantization` says."""
    method = (engine_quantization or "").strip().lower()
    if not quantization and method in _ONLINE:
        quantization = _ONLINE[method]
    return int(count.replicated_linear_params * linear_bytes_per_param(quantization, dtype_bytes))


def weights_bytes(cfg: Mapping[str, Any], dtype_bytes: int) -> int | None:
    """The weights' bytes on the GPU (all ranks together), or None when the config lacks shapes."""
    count = count_weights(cfg)
    if count is None:
        return None
    quantization = cfg.get("quantization_config")
    return bytes_of(count, quantization if isinstance(quantization, Mapping) else None, dtype_bytes)
