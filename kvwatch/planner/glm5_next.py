"""GLM-5-Next's caches and vLLM 0.34's block size and packing of them, on one scope only (pure).

The scope: vLLM 0.34 on CUDA SM 9.0, a bf16 model with a bf16 KV cache (`--kv-cache-dtype auto`),
FlashInfer >= 0.6.18 installed (kvwatch cannot see it: it is assumed), no `--block-size`, no
speculative decoding but with the checkpoint's MTP draft (below), no pipeline parallelism, no
`--attention-backend`, prefix caching and the
hybrid KV cache manager on, default Mamba cache settings, a sparse config (`index_topk` set) of
`kv_lora_rank + qk_rope_head_dim` 512, `index_head_dim` 128, KDA `linear_head_dim` 128 and a bounded
gate (`linear_lower_bound` set). Anything else is unsure (`out_of_scope`), not planned. Each rule
cites vLLM 0.34.0:

- a layer is KDA where `layer_types[i]` is "linear_attention", else MLA
  (models/glm5next/common/model.py:147-153); transformers' Glm5NextTextConfig makes every fourth
  layer MLA when the list is unset;
- an MLA layer registers, in this order, its indexer's keys (Glm5NextIndexerCache: an
  MLAAttentionSpec of `index_head_dim + index_head_dim // 128 * 4` uint8 bytes per state, one state
  per `index_kpool` tokens), the indexer's tail ring (Glm5NextTailCache: a CircularBufferSpec of
  `index_kpool` rows of 2 x `index_head_dim` bf16) and the MLA latent (`kv_lora_rank +
  qk_rope_head_dim` bf16 a token) (common/attention.py:79-175, :260-275, :536-574);
- on SM 9.0 with head size 512 vLLM's first sparse MLA backend is FLASHINFER_MLA_SPARSE_SM90
  (platforms/cuda.py:136-152), kernel blocks a multiple of 64, its block stride whole 1-token rows
  (flashinfer_mla_sparse_sm90.py:156-161); the indexer's kernel blocks are `index_kpool` x 32 or 64
  states (v1/attention/backends/mla/indexer.py:249-260, utils/deep_gemm.py:40-43), which
  customize_attention_spec makes its block-stride alignment (v1/worker/utils.py:469-479); the tail
  ring's backend takes any block (indexer.py:262-283) and lists BLHNC only, a block-outermost layout;
- the block: the smallest size every backend takes (platforms/interface.py:709-757), then
  _align_hybrid_block_size (:950-1150): at least the indexer's smallest kernel block and 128 (MLA),
  enough tokens of 1,024-B latent rows to hold one KDA state, a multiple of every backend's smallest
  kernel block; the KDA page is padded to the latent page;
- a KDA layer: conv state 3 x heads x head_dim / TP channels x (kernel - 1) bf16, recurrent state
  heads / TP x head_dim^2 float32 (model_executor/layers/mamba/mamba_utils.py:304-327), with FlashKDA
  one prefill checkpoint block (common/kda.py:141-164, :202-210), prefix caching making the Mamba
  cache mode "align" (model_executor/models/config.py:1094-1110): 3 blocks a request
  (v1/kv_cache_interface.py:1168-1174);
- _get_packed_kv_cache_groups packs them as for DeepSeek-V4 (planner/deepseek_v4.py `packed_groups`,
  the KDA bucket a state bucket: v1/core/kv_cache_planning.py:1037-1042), and a BLHNC block is the
  largest group's pages rounded up to the least common multiple of every layer's block-stride
  alignment (:620-648);
- the MTP draft (`--speculative-config` method "mtp" or "glm5_next_mtp", k speculative tokens > 0):
  vLLM maps a target of model_type "glm5_next" (the config.json's own, not its text config's) to
  Glm5NextMTPModel with n_predict = `num_nextn_predict_layers` (config/speculative.py:1281-1293,
  which reads the field), whose layers at
  `model.layers.{num_hidden_layers + i}` are MLA decoder layers whatever `layer_types` says
  (models/glm5next/common/mtp.py:112-128, :70-81; model.py:472), with the target MLA layer's three
  caches; the k tokens widen every KDA conv state by k columns (model_executor/layers/mamba/gdn/base.py:43-47,
  common/kda.py:224-236, mamba_utils.py:304-326; the block's from model.py:1224-1236), which may raise
  the block, add k state blocks
  a request (model_executor/layers/mamba/abstract.py:94-98, v1/kv_cache_interface.py:1168-1174), and
  make each tail ring `index_kpool x next_power_of_2(cdiv(index_kpool + k, index_kpool))` rows, which
  must divide the block (common/attention.py:162-170).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import positive_field
from kvwatch.planner.deepseek_v4 import CacheSpec, Group, Packing, drafts_with_mtp, packed_groups
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.one_scope import bf16_model, mamba_defaults, mtp_draft_reason, outside
from kvwatch.values.versions import VllmVersion

ARCHITECTURES = frozenset({"Glm5NextForCausalLM", "Glm5NextForConditionalGeneration"})
MODEL_TYPES = frozenset({"glm5_next", "glm5_next_text"})
SOURCE = "vLLM 0.34.0, vllm/models/glm5next/common/attention.py:79-175, common/kda.py:141-210, " \
         "vllm/platforms/interface.py:709-1150, vllm/v1/core/kv_cache_planning.py:620-648, :958-1085"
BACKEND = "FLASHINFER_MLA_SPARSE_SM90"   # platforms/cuda.py:136-152 (head size 512 on SM 9.0)
DEFAULT_BLOCK = 64        # CacheConfig.DEFAULT_BLOCK_SIZE (config/cache.py:185)
MLA_KERNEL = 64           # MultipleOf(64) (flashinfer_mla_sparse_sm90.py:156-157)
MLA_FLOOR = 128           # hybrid MLA blocks (platforms/interface.py:1095-1100)
PAGED_MQA_PAGES = (32, 64)   # utils/deep_gemm.py:43 off SM 12.x
QUANT_BLOCK = 128         # the indexer's FP8 scale block (common/attention.py:253)
KV_BYTES = 2              # bf16
CHECKED_MINOR = (0, 34)   # the release whose code the oracle ran (tests/glm5_next_oracle.py)
# transformers' Glm5NextTextConfig defaults, which vLLM loads the config with
DEFAULTS: dict[str, Any] = {"num_hidden_layers": 45, "kv_lora_rank": 512, "qk_rope_head_dim": 0,
                            "index_topk": 2048, "index_head_dim": 128, "index_kpool": 16, "linear_head_dim": 128,
                            "linear_num_heads": 64, "linear_conv_kernel_dim": 4, "linear_lower_bound": -5.0}


@dataclass(frozen=True)
class Glm5NextShape:
    """What vLLM's GLM-5-Next layers read from config.json to build their caches."""

    kda: tuple[bool, ...]     # per decoder layer: KDA (True) or MLA
    latent: int               # kv_lora_rank + qk_rope_head_dim
    index_head_dim: int
    index_kpool: int
    linear_heads: int
    linear_head_dim: int
    conv_kernel: int
    config_reasons: str       # the config's own ways out of the scope ("" when inside)
    mtp_layers: int = 0       # num_nextn_predict_layers: the MTP draft's MLA layers
    mtp_reasons: str = ""     # why its MTP draft is not planned ("" when it is)


def _int(cfg: Mapping[str, Any], key: str) -> int:
    """A size of config.json (Glm5NextTextConfig's default where unset): positive, at most MAX_FIELD; only
    the rope dimension may be 0 (a latent without rope)."""
    if key == "qk_rope_head_dim" and cfg.get(key, DEFAULTS[key]) == 0:
        return 0
    return positive_field(cfg, key, DEFAULTS[key], "GLM-5-Next")


def glm5_next_shape(cfg: Mapping[str, Any], architectures: Sequence[str],
                    top_model_type: object = "glm5_next") -> Glm5NextShape | None:
    """The shape of a GLM-5-Next (text) config.json; None for any other model. `top_model_type`: the
    config.json's own model_type (its text config's otherwise), which decides whether vLLM finds the MTP head."""
    model_type = cfg.get("model_type")
    if not (ARCHITECTURES & set(architectures) or (isinstance(model_type, str) and model_type in MODEL_TYPES)):
        return None
    layers = _int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if types is None:   # Glm5NextTextConfig.__post_init__: every fourth layer MLA
        types = ["linear_attention" if i % 4 != 3 else "indexed_attention" for i in range(layers)]
    if not isinstance(types, list):
        raise ConfigError("config.json: GLM-5-Next's layer_types must be a list")
    kda = tuple(i < len(types) and types[i] == "linear_attention" for i in range(layers))
    shape = Glm5NextShape(kda, _int(cfg, "kv_lora_rank") + _int(cfg, "qk_rope_head_dim"), _int(cfg, "index_head_dim"),
                          _int(cfg, "index_kpool"), _int(cfg, "linear_num_heads"), _int(cfg, "linear_head_dim"),
                          _int(cfg, "linear_conv_kernel_dim"), "")
    reasons = [why for hit, why in (
        (cfg.get("index_topk", DEFAULTS["index_topk"]) is None, "no index_topk (full MLA, no indexer)"),
        (not any(kda) or all(kda), "not a KDA and MLA hybrid"),
        (shape.latent != 512, f"an MLA latent of {shape.latent} (only 512 is checked)"),
        (shape.index_head_dim != QUANT_BLOCK, f"index_head_dim {shape.index_head_dim} (vLLM asserts 128)"),
        (shape.index_kpool < 2, f"index_kpool {shape.index_kpool} (vLLM asserts > 1)"),
        (shape.linear_head_dim != 128 or cfg.get("linear_lower_bound", -5.0) is None,
         "KDA without FlashKDA (its head_dim 128 and a bounded gate, common/kda.py:141-164)"),
    ) if hit]
    mtp = cfg.get("num_nextn_predict_layers")
    layers = mtp if isinstance(mtp, int) and not isinstance(mtp, bool) and 0 < mtp <= 64 else 0
    mtp_reasons = f"a config.json of model_type {top_model_type!r}, which vLLM does not map to its MTP head (only " \
        f"glm5_next: config/speculative.py:1281)" if top_model_type != "glm5_next" else \
        "no num_nextn_predict_layers (vLLM's MTP mapping reads it: config/speculative.py:1281-1293)" if mtp is None \
        else "" if layers else f"num_nextn_predict_layers {mtp!r}: an MTP draft of 1 to 64 layers is planned"
    return replace(shape, config_reasons="; ".join(reasons), mtp_layers=layers, mtp_reasons=mtp_reasons)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kda_state_bytes(shape: Glm5NextShape, tp: int, spec: int = 0) -> int:
    """One KDA layer's conv (bf16, k = `spec` more columns) and recurrent (float32) state on one of `tp` ranks."""
    heads = shape.linear_heads // tp
    return 3 * heads * shape.linear_head_dim * (shape.conv_kernel - 1 + spec) * KV_BYTES \
        + heads * shape.linear_head_dim ** 2 * 4


def tail_rows(shape: Glm5NextShape, spec: int = 0) -> int:
    """A tail ring's rows: kpool x next_power_of_2(cdiv(kpool + k, kpool)) (common/attention.py:162-163)."""
    pools = _cdiv(shape.index_kpool + spec, shape.index_kpool)
    return shape.index_kpool * (1 << (pools - 1).bit_length())


def block_size(shape: Glm5NextShape, tp: int, spec: int = 0) -> int:
    """The cache block vLLM settles on (platforms/interface.py:709-757, :950-1120) at k = `spec`."""
    index_sizes = [shape.index_kpool * n for n in PAGED_MQA_PAGES]
    # Phase 1: the default 64 unless a backend refuses it; then the least LCM every backend takes
    preferred = DEFAULT_BLOCK if all(DEFAULT_BLOCK % s == 0 for s in index_sizes[:1]) \
        else math.lcm(min(index_sizes), MLA_KERNEL)
    kernel = max(min(index_sizes), preferred, MLA_FLOOR)
    backends = math.lcm(min(index_sizes), 1, MLA_KERNEL)
    block = kernel * _cdiv(kda_state_bytes(shape, tp, spec), kernel * shape.latent * KV_BYTES)
    return max(preferred, backends * _cdiv(block, backends))


def layer_specs(shape: Glm5NextShape, tp: int, spec: int = 0, mtp: bool = False) -> list[tuple[CacheSpec, int]]:
    """Each cache's spec and its block-stride alignment in bytes, in vLLM's registration order, at k = `spec`
    speculative tokens (with `mtp`, the MTP draft's MLA layers after the target's)."""
    block = block_size(shape, tp, spec)
    latent_page = block * shape.latent * KV_BYTES
    key = shape.index_head_dim + shape.index_head_dim // QUANT_BLOCK * 4
    kernel = math.gcd(shape.index_kpool * max(PAGED_MQA_PAGES), block)   # MultipleOf(max) (kv_cache_interface.py:213-223)
    index_align = 1 if kernel == block else kernel // shape.index_kpool * key
    specs: list[tuple[CacheSpec, int]] = []
    for kda in (*shape.kda, *[False] * (shape.mtp_layers if mtp else 0)):
        if kda:   # padded to the latent page (platforms/interface.py:1129-1150)
            specs.append((CacheSpec("kda", "mamba", block, 0, latent_page, "float32"), 1))
            continue
        specs.append((CacheSpec("indexer.k_cache", "mla", block, 0, block // shape.index_kpool * key, "uint8"),
                      index_align))
        ring = tail_rows(shape, spec)
        specs.append((CacheSpec("indexer.tail_cache", "ring", ring, 0, ring * 2 * shape.index_head_dim * KV_BYTES,
                                "bfloat16"), 1))
        specs.append((CacheSpec("mla_attn", "mla", block, 0, latent_page, "bfloat16"), shape.latent * KV_BYTES))
    return specs


@dataclass(frozen=True)
class Glm5NextPacking:
    block_size: int
    groups: tuple[Group, ...]
    bytes_per_block: int


def packing(shape: Glm5NextShape, tp: int, spec: int = 0, mtp: bool = False) -> Glm5NextPacking:
    """vLLM 0.34's block, groups and BLHNC bytes per block on one of `tp` ranks (the scope's), at k = `spec`
    speculative tokens (with `mtp`, the MTP draft's layers too)."""
    specs = layer_specs(shape, tp, spec, mtp)
    groups = [replace(g, speculative_blocks=spec) if g.kind == "mamba" else g
              for g in packed_groups([s for s, _ in specs])]
    widest = max(g.page_bytes for g in groups)
    alignment = math.lcm(*(align for _, align in specs))
    return Glm5NextPacking(block_size(shape, tp, spec), tuple(groups), _cdiv(widest, alignment) * alignment)


def draft_reasons(shape: Glm5NextShape, settings: EngineSettings) -> str:
    """Why this command's draft is not planned with the target ("" where it drafts with the checkpoint's
    MTP head kvwatch plans, or drafts not at all)."""
    reason = mtp_draft_reason(settings, "GLM-5-Next", shape.mtp_reasons)
    if reason is not None:
        return reason
    k, tp = settings.num_speculative_tokens, max(1, settings.tensor_parallel_size)
    block, ring = block_size(shape, tp if shape.linear_heads % tp == 0 else 1, k), tail_rows(shape, k)
    return f"a tail ring of {ring} rows not dividing the block of {block} (vLLM asserts it: " \
           f"common/attention.py:165-169)" if block % ring else ""


def out_of_scope(shape: Glm5NextShape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> str:
    """Why this command lies outside the one scope planned here; "" when it lies inside."""
    tp = max(1, settings.tensor_parallel_size)
    bf16 = settings.kv_cache_dtype in ("auto", "bfloat16") and bf16_model(settings, config_dtype)
    return outside(settings, device, version, checked=(CHECKED_MINOR,), config_reasons=shape.config_reasons,
                   dtype=(not bf16, "a model or KV cache other than bf16"), draft=draft_reasons(shape, settings),
                   backend=BACKEND, own=[*mamba_defaults(settings), (
                       shape.linear_heads % tp != 0, f"TP {tp} not dividing the KDA heads (vLLM asserts it: common/kda.py:255)")])


def plan_packing(shape: Glm5NextShape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> Packing:
    """The packing make_plan reports for this command: unsure, with its reason, outside the scope."""
    scope = out_of_scope(shape, settings, device, version, config_dtype)
    tp = max(1, settings.tensor_parallel_size)
    mtp = drafts_with_mtp(settings.speculative_method, settings.num_speculative_tokens) and not shape.mtp_reasons
    kv = packing(shape, tp if shape.linear_heads % tp == 0 else 1, settings.num_speculative_tokens if mtp else 0, mtp)
    unsure = (f"GLM-5-Next outside the one scope kvwatch checked against vLLM's own code "
              f"(CUDA SM 9.0, FlashInfer >= 0.6.18 assumed, bf16, defaults): {scope}",) if scope else ()
    return Packing(kv.groups, kv.bytes_per_block, BACKEND if device.platform == "cuda" else None, unsure,
                   attention="glm5_next", block_size=kv.block_size, source=SOURCE, dtype_bytes=KV_BYTES, drafted=mtp)


# The layer classes whose caches this module plans (architecture_kinds).
GLM5_NEXT_KINDS: dict[str, str] = {
    "Glm5NextIndexerCache": "GLM-5-Next kpool indexer keys (planner/glm5_next.py)",
    "Glm5NextTailCache": "GLM-5-Next indexer tail ring (planner/glm5_next.py)"}
GLM5_NEXT_SPEC_CLASSES = frozenset({"Glm5NextLinearAttention"})
