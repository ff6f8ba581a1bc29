"""Qwen4-Exp's caches and vLLM 0.34's block size and packing of them, on one scope only (pure).

The scope: vLLM 0.34 or 0.33 (whose code gives the same answers: the caches from common/qsa_cache.py:
811-874, nvidia/qsa.py:385-400, :552-560) on CUDA SM 9.0 (where FlashInfer runs the GDN prefill: vLLM picks it there with
no further check, model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:187-348), a bf16 model with a bf16 KV cache (`--kv-cache-dtype auto`), the QSA indexer on (`indexer_n_heads`
set) with its bf16 compressed key (vLLM's default `indexer_kv_dtype`), no `--block-size`, no
speculative decoding but with the checkpoint's MTP draft (below), no pipeline parallelism, no `--attention-backend`, prefix caching and the
hybrid KV cache manager on, default Mamba cache settings, and a model of both GDN and QSA layers.
kvwatch reads neither `--language-model-only` (the VL wrapper is planned without it: its ring then
keeps the M-RoPE positions) nor `--additional-config` (a `gdn_prefill_backend` there is planned as
none). Anything else is unsure (`out_of_scope`), not planned. Each rule cites vLLM
0.34.0:

- a layer is GDN where `layer_types[i]` is "linear_attention", QSA where it is "indexed_attention"
  (or "qwen_sparse_attention") and `indexer_n_heads` is set (models/qwen4_exp/nvidia/model.py:93,
  :232-265); transformers' Qwen4ExpTextConfig makes every `full_attention_interval`-th (4th) layer
  QSA when the list is unset and renames "full_attention" to "indexed_attention";
- on a layer listed (1-based) in `ple_layer_ids` a PLE short-conv state is built first (model.py:
  216-231): `hidden_size x hc_count` channels, `(ple_conv_kernel_size - 1) x ngram_size` rows, bf16,
  replicated over TP (nvidia/ple_layer.py:178-203); in align mode it keeps one prefill checkpoint
  (ple_layer.py:205-220), as a GDN layer does with FlashInfer's prefill (model_executor/layers/mamba/
  gdn/qwen_gdn_linear_attn.py:846-857, :901-912): 3 blocks a request (v1/kv_cache_interface.py:1168-1174);
- a GDN state: conv `(2 x key_heads x key_dim + value_heads x value_dim) / TP` channels x
  (kernel - 1) bf16, recurrent `value_heads / TP x value_dim x key_dim` in `mamba_ssm_dtype` (the
  conv dtype when unset: model_executor/models/config.py:1293-1318, mamba_utils.py:106-118, :280-301);
- a QSA layer registers its indexer's raw-key ring (CircularBufferSpec of `indexer_compress_ratio`
  rows of `indexer_head_dim` bf16, `round_up(indexer_head_dim, 4) + 12` with M-RoPE positions), its
  compressed key (one `indexer_head_dim` bf16 row per `indexer_compress_ratio` tokens) and then its
  K/V (FullAttentionSpec, `max(1, num_key_value_heads // TP)` heads of `head_dim`)
  (common/qsa_indexer.py:817-880, nvidia/qsa_indexer.py:165-181, nvidia/qsa.py:330-345, :492-500);
  the indexer's caches need the construction-time block 64 to be a multiple of the ratio (:783);
- the block: the default 64 (both QSA backends take it), then _align_hybrid_block_size
  (platforms/interface.py:950-1150): the fewest 64-token steps (the prefill checkpoint grid) whose
  K/V page holds the larger of the GDN and PLE state pages, whether or not a layer has PLE
  (:1061-1066, nvidia/model.py:907-927); both state pages are padded to the K/V page;
- only the QSA indexer backend lists layouts (BLNHC first), so the layout is block-outermost, and
  _get_packed_kv_cache_groups packs the caches as for DeepSeek-V4 (planner/deepseek_v4.py
  `packed_groups`; the K/V and compressed key share a bucket, the GDN states, the PLE states and
  the rings are state buckets: v1/core/kv_cache_planning.py:958-1085); every alignment is 1, so a
  block is the largest group's pages (:620-648);
- the MTP draft (`--speculative-config` method "mtp" or "qwen4_exp_mtp", k speculative tokens > 0):
  vLLM maps a config.json of model_type "qwen4_exp" or "qwen4_exp_text" to Qwen4ExpMTP
  (config/speculative.py:1032-1053; 0.33.0 :915-936), which builds `mtp_num_hidden_layers` (1 when
  unset: transformers' Qwen4ExpTextConfig has no such field) QSA decoder layers at
  `layers.{num_hidden_layers + i}`, past `ple_layer_ids`, so with no PLE state (nvidia/mtp.py:198-249,
  model.py:216-265): each the target QSA layer's three caches, joining their groups. The k tokens widen
  every GDN conv state and every PLE state by k rows (mamba_utils.py:257-301, ple_layer.py:108, :194-200,
  qwen_gdn_linear_attn.py:684-694; the block's from model.py:817-867), which may raise the block, give
  every GDN and PLE group k state blocks a request (model_executor/layers/mamba/abstract.py:94-98,
  v1/kv_cache_interface.py:1168-1174), and make every raw-key ring `round_up(ratio + k, ratio)` rows,
  which vLLM asserts divide the block (common/qsa_indexer.py:848-859). Qwen4-Exp has no sliding window,
  so a multi-module draft's lookahead retains nothing more (v1/core/kv_cache_planning.py:1742-1748).
"""
from __future__ import annotations

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

ARCHITECTURES = frozenset({"Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration"})
VL_ARCHITECTURE = "Qwen4ExpForConditionalGeneration"
MODEL_TYPES = frozenset({"qwen4_exp", "qwen4_exp_text"})
SOURCE = "vLLM 0.34.0, vllm/models/qwen4_exp/nvidia/model.py:216-265, :807-927, " \
         "vllm/models/qwen4_exp/common/qsa_indexer.py:817-880, vllm/platforms/interface.py:950-1150, " \
         "vllm/v1/core/kv_cache_planning.py:620-648, :958-1085"
BACKEND = "QWEN4_EXP_QSA_TRITON"   # nvidia/qsa.py:146-148
DEFAULT_BLOCK = 64        # CacheConfig.DEFAULT_BLOCK_SIZE (config/cache.py:185)
CHECKPOINT_GRID = 64      # FLASHINFER_GDN_CHECKPOINT_ALIGNMENT (v1/attention/backends/gdn_attn.py:35)
QSA_LAYER_TYPES = ("qwen_sparse_attention", "indexed_attention")   # nvidia/model.py:93
ROPE_POSITION_COLUMNS = 12   # three int64 M-RoPE positions as bf16 (common/qsa_indexer.py:820-836)
KV_BYTES = 2              # bf16
CHECKED_MINORS = frozenset({(0, 33), (0, 34)})   # the releases whose code the oracle ran (tests/qwen4_exp_oracle.py)
_SSM_BYTES = {None: KV_BYTES, "bfloat16": 2, "float16": 2, "float32": 4}
# transformers' Qwen4ExpTextConfig defaults (models/qwen4_exp/configuration_qwen4_exp.py), which vLLM
# loads the config with
DEFAULTS: dict[str, int] = {
    "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "hidden_size": 2048, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "hc_count": 4, "ple_conv_kernel_size": 4,
    "ngram_size": 3, "full_attention_interval": 4}
_INDEXER = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")


@dataclass(frozen=True)
class Qwen4ExpShape:
    """What vLLM's Qwen4-Exp layers read from config.json to build their caches (heads before TP)."""

    qsa: tuple[bool, ...]     # per decoder layer: QSA (True) or GDN
    ple: tuple[bool, ...]     # per decoder layer: a PLE short-conv state
    heads: int
    kv_heads: int
    head_dim: int
    key_heads: int            # GDN
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    ssm_bytes: int
    ple_channels: int         # hidden_size x hc_count
    ple_rows: int             # (ple_conv_kernel_size - 1) x ngram_size
    index_head_dim: int
    compress_ratio: int
    mrope: bool               # the ring keeps M-RoPE positions (the VL wrapper with an mrope_section)
    config_reasons: str       # the config's own ways out of the scope ("" when inside)
    mtp_layers: int = 0       # mtp_num_hidden_layers: the MTP draft's QSA layers
    mtp_reasons: str = ""     # why its MTP draft is not planned ("" when it is)


def _int(cfg: Mapping[str, Any], key: str) -> int:
    return positive_field(cfg, key, DEFAULTS.get(key), "Qwen4-Exp")


def _layer_types(cfg: Mapping[str, Any], layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:   # Qwen4ExpTextConfig.__post_init__
        interval = _int(cfg, "full_attention_interval")
        return ["linear_attention" if (i + 1) % interval else "indexed_attention" for i in range(layers)]
    if not isinstance(types, list) or len(types) < layers:
        raise ConfigError("config.json: Qwen4-Exp's layer_types must list every layer")
    return ["indexed_attention" if t == "full_attention" else str(t) for t in types[:layers]]


def qwen4_exp_shape(cfg: Mapping[str, Any], architectures: Sequence[str]) -> Qwen4ExpShape | None:
    """The shape of a Qwen4-Exp (text) config.json; None for any other model."""
    model_type = cfg.get("model_type")
    if not (ARCHITECTURES & set(architectures) or (isinstance(model_type, str) and model_type in MODEL_TYPES)):
        return None
    layers = _int(cfg, "num_hidden_layers")
    types = _layer_types(cfg, layers)
    ple_ids = cfg.get("ple_layer_ids") or []
    if not isinstance(ple_ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ple_ids):
        raise ConfigError("config.json: Qwen4-Exp's ple_layer_ids must be a list of layer numbers")
    indexer = {k: cfg.get(k) for k in _INDEXER}
    on = indexer["indexer_n_heads"] is not None
    ratio = _int(cfg, "indexer_compress_ratio") if on else 1
    rope = cfg.get("rope_parameters")
    mrope = VL_ARCHITECTURE in architectures and isinstance(rope, Mapping) and "mrope_section" in rope
    ssm = cfg.get("mamba_ssm_dtype")
    ssm_bytes = _SSM_BYTES.get(ssm, 0) if ssm is None or isinstance(ssm, str) else 0
    shape = Qwen4ExpShape(
        tuple(t in QSA_LAYER_TYPES for t in types), tuple(i + 1 in ple_ids for i in range(layers)),
        _int(cfg, "num_attention_heads"), _int(cfg, "num_key_value_heads"),
        int(cfg.get("head_dim") or _int(cfg, "hidden_size") // _int(cfg, "num_attention_heads")),
        _int(cfg, "linear_num_key_heads"), _int(cfg, "linear_num_value_heads"), _int(cfg, "linear_key_head_dim"),
        _int(cfg, "linear_value_head_dim"), _int(cfg, "linear_conv_kernel_dim"), ssm_bytes,
        _int(cfg, "hidden_size") * _int(cfg, "hc_count"),
        (_int(cfg, "ple_conv_kernel_size") - 1) * _int(cfg, "ngram_size"),
        _int(cfg, "indexer_head_dim") if on else 0, ratio, mrope, "")
    bad_types = sorted({t for t in types if t != "linear_attention" and t not in QSA_LAYER_TYPES})
    reasons = [why for hit, why in (
        (not on, "no QSA indexer (indexer_n_heads unset: Qwen3-Next attention layers)"),
        (on and any(v is None for v in indexer.values()), "a QSA field unset (transformers refuses the config)"),
        (on and indexer["indexer_kv_heads"] != 1, "indexer_kv_heads other than 1 (transformers refuses it)"),
        (bool(bad_types), f"layer types {', '.join(bad_types)} (transformers refuses them)"),
        (on and DEFAULT_BLOCK % ratio != 0, f"indexer_compress_ratio {ratio} not dividing 64 (vLLM refuses it)"),
        (not any(shape.qsa) or all(shape.qsa), "not a GDN and QSA hybrid"),
        (any(i < 1 or i > layers or shape.qsa[i - 1] for i in ple_ids),
         "ple_layer_ids off the linear_attention layers (transformers refuses them)"),
        (_int(cfg, "hc_count") <= 1, "hc_count 1 (vLLM refuses it)"),
        (shape.ssm_bytes == 0, f"mamba_ssm_dtype {str(ssm)[:20]} (only float32, bfloat16 and float16 are checked)"),
    ) if hit]
    return replace(shape, config_reasons="; ".join(reasons), **_mtp(cfg, model_type))


def _mtp(cfg: Mapping[str, Any], model_type: object) -> dict[str, Any]:
    """The MTP draft's layer count and why vLLM would not build it ("" when it does)."""
    if model_type not in MODEL_TYPES:
        return {"mtp_layers": 0, "mtp_reasons": f"a config.json of model_type {model_type!r}, which vLLM does not map "
                                                f"to its MTP head (only qwen4_exp and qwen4_exp_text: "
                                                f"config/speculative.py:1032)"}
    count = cfg.get("mtp_num_hidden_layers", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= 64:
        return {"mtp_layers": 0, "mtp_reasons": f"mtp_num_hidden_layers {count!r}: an MTP draft of 1 to 64 layers is "
                                                f"planned"}
    return {"mtp_layers": count, "mtp_reasons": ""}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kv_token_bytes(shape: Qwen4ExpShape, tp: int) -> int:
    """One QSA layer's K/V for one token on one of `tp` ranks."""
    return 2 * max(1, shape.kv_heads // tp) * shape.head_dim * KV_BYTES


def gdn_state_bytes(shape: Qwen4ExpShape, tp: int, spec: int = 0) -> int:
    """One GDN layer's conv (bf16, k = `spec` more rows) and recurrent state on one of `tp` ranks."""
    conv = (2 * shape.key_heads * shape.key_dim + shape.value_heads * shape.value_dim) // tp
    return conv * (shape.conv_kernel - 1 + spec) * KV_BYTES + shape.value_heads // tp * shape.value_dim * shape.key_dim \
        * shape.ssm_bytes


def ple_state_bytes(shape: Qwen4ExpShape, spec: int = 0) -> int:
    """One PLE layer's short-conv state (bf16, k = `spec` more rows), the same on every rank."""
    return shape.ple_channels * (shape.ple_rows + spec) * KV_BYTES


def ring_rows(shape: Qwen4ExpShape, spec: int = 0) -> int:
    """A raw-key ring's rows: round_up(ratio + k, ratio) (common/qsa_indexer.py:854-855)."""
    return -(-(shape.compress_ratio + spec) // shape.compress_ratio) * shape.compress_ratio


def block_size(shape: Qwen4ExpShape, tp: int, spec: int = 0) -> int:
    """The block vLLM settles on: the fewest 64-token steps whose K/V page holds the larger state page."""
    state = max(gdn_state_bytes(shape, tp, spec), ple_state_bytes(shape, spec))
    return CHECKPOINT_GRID * max(1, _cdiv(state, CHECKPOINT_GRID * kv_token_bytes(shape, tp)))


def layer_specs(shape: Qwen4ExpShape, tp: int, spec: int = 0, mtp: bool = False) -> list[CacheSpec]:
    """Each cache's spec, in vLLM's registration order (alignment 1 each), at k = `spec` speculative tokens
    (with `mtp`, the MTP draft's QSA layers after the target's)."""
    block = block_size(shape, tp, spec)
    page = block * kv_token_bytes(shape, tp)
    padded = page != max(gdn_state_bytes(shape, tp, spec), ple_state_bytes(shape, spec))
    width = (-(-shape.index_head_dim // 4) * 4 + ROPE_POSITION_COLUMNS) if shape.mrope else shape.index_head_dim
    ratio, ring = shape.compress_ratio, ring_rows(shape, spec)
    draft = [(True, False)] * (shape.mtp_layers if mtp else 0)
    specs: list[CacheSpec] = []
    for qsa, ple in (*zip(shape.qsa, shape.ple, strict=True), *draft):
        if ple:
            specs.append(CacheSpec("ple", "replicated_mamba", block, 0,
                                   page if padded else ple_state_bytes(shape, spec), "bfloat16"))
        if not qsa:
            specs.append(CacheSpec("linear_attn", "mamba", block, 0,
                                   page if padded else gdn_state_bytes(shape, tp, spec), "bfloat16"))
            continue
        if shape.index_head_dim:   # no indexer: out of the scope, its K/V alone keeps the figures defined
            specs.append(CacheSpec("indexer.raw_key_cache", "ring", ring, 0, ring * width * KV_BYTES, "bfloat16"))
            specs.append(CacheSpec("indexer.compressed_key_cache", "full", block, 0,
                                   block // ratio * shape.index_head_dim * KV_BYTES, "bfloat16"))
        specs.append(CacheSpec("attn", "full", block, 0, page, "bfloat16"))
    return specs


@dataclass(frozen=True)
class Qwen4ExpPacking:
    block_size: int
    groups: tuple[Group, ...]
    bytes_per_block: int


def packing(shape: Qwen4ExpShape, tp: int, spec: int = 0, mtp: bool = False) -> Qwen4ExpPacking:
    """vLLM 0.34's (and 0.33's) block, groups and BLNHC bytes per block on one of `tp` ranks (the scope's), at
    k = `spec` speculative tokens (with `mtp`, the MTP draft's layers too)."""
    groups = [replace(g, speculative_blocks=spec) if g.kind in ("mamba", "replicated_mamba") else g
              for g in packed_groups(layer_specs(shape, tp, spec, mtp))]
    return Qwen4ExpPacking(block_size(shape, tp, spec), tuple(groups), max(g.page_bytes for g in groups))


def divides(shape: Qwen4ExpShape, tp: int) -> bool:
    """Whether vLLM takes this TP: it divides the attention heads and the GDN heads, and the KV heads
    divide by it or it by them (nvidia/qsa.py:330-344, mamba_utils.py:290-300)."""
    kv = shape.kv_heads % tp == 0 if shape.kv_heads >= tp else tp % shape.kv_heads == 0
    return kv and all(n % tp == 0 for n in (shape.heads, shape.key_heads, shape.value_heads))


def draft_reasons(shape: Qwen4ExpShape, settings: EngineSettings) -> str:
    """Why this command's draft is not planned with the target ("" where it drafts with the checkpoint's
    MTP head, or drafts not at all)."""
    reason = mtp_draft_reason(settings, "Qwen4-Exp", shape.mtp_reasons)
    if reason is not None:
        return reason
    k, tp = settings.num_speculative_tokens, max(1, settings.tensor_parallel_size)
    block, ring = block_size(shape, tp if divides(shape, tp) else 1, k), ring_rows(shape, k)
    return f"a QSA ring of {ring} rows not dividing the block of {block} (vLLM asserts it: " \
           f"common/qsa_indexer.py:856-859)" if block % ring else ""


def out_of_scope(shape: Qwen4ExpShape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> str:
    """Why this command lies outside the one scope planned here; "" when it lies inside."""
    tp = max(1, settings.tensor_parallel_size)
    bf16 = settings.kv_cache_dtype in ("auto", "bfloat16") and bf16_model(settings, config_dtype)
    return outside(settings, device, version, checked=CHECKED_MINORS, config_reasons=shape.config_reasons,
                   dtype=(not bf16, "a model or KV cache other than bf16"), draft=draft_reasons(shape, settings),
                   backend=BACKEND, own=[
                       (bool(settings.kv_cache_dtype_skip_layers), "--kv-cache-dtype-skip-layers set"),
                       *mamba_defaults(settings), (not divides(shape, tp), f"TP {tp} not dividing the heads (vLLM refuses it)")])


def plan_packing(shape: Qwen4ExpShape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> Packing:
    """The packing make_plan reports for this command: unsure, with its reason, outside the scope."""
    scope = out_of_scope(shape, settings, device, version, config_dtype)
    tp = max(1, settings.tensor_parallel_size)
    mtp = drafts_with_mtp(settings.speculative_method, settings.num_speculative_tokens) and not shape.mtp_reasons
    kv = packing(shape, tp if divides(shape, tp) else 1, settings.num_speculative_tokens if mtp else 0, mtp)
    unsure = (f"Qwen4-Exp outside the one scope kvwatch checked against vLLM's own code "
              f"(CUDA SM 9.0, bf16, defaults): {scope}",) if scope else ()
    return Packing(kv.groups, kv.bytes_per_block, BACKEND if device.platform == "cuda" else None, unsure,
                   attention="qwen4_exp", block_size=kv.block_size, source=SOURCE, dtype_bytes=KV_BYTES, drafted=mtp)


# The layer classes whose caches this module plans (architecture_kinds).
QWEN4_EXP_KINDS: dict[str, str] = {
    "Qwen4ExpQSAAttention": "Qwen4-Exp QSA K/V, raw-key ring and compressed key (planner/qwen4_exp.py)"}
QWEN4_EXP_SPEC_CLASSES = frozenset({"Qwen4ExpPLELayer"})   # its SHORT_CONV state's prefill checkpoint
