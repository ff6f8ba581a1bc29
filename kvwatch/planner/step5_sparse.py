"""Step5's caches and vLLM 0.34's packing of them into blocks (pure), on one scope only.

The scope: vLLM 0.34 on CUDA SM 9.0 with its default backends, a bf16 KV cache (`--kv-cache-dtype
auto` on a bf16 model), no `--block-size`, no speculative decoding but with the checkpoint's MTP draft
(Step5MTP, below), no pipeline parallelism, no
`--attention-backend`, the hybrid KV cache manager on, every attention layer of head_dim 192 and the
sparse_config fields vLLM validates at their defaults. Anything else is unsure (`out_of_scope`), not
planned. kvwatch reads no context-parallel or KV-connector flag (a connector may turn the hybrid
manager off: config/vllm.py:2144-2210), so a command with one is planned as one without. Each rule
cites vLLM 0.34.0:

- a Step5 checkpoint needs a `sparse_config` section (models/step5/nvidia/model.py:1844-1849); a
  layer's type is `layer_types_with_mtp` or `layer_types` (model.py:226-236), else even
  layers are `sliding_attention` and odd ones `full_attention` (model.py:886-893); a sliding layer
  keeps the config's `sliding_window`, any other layer drops it (:899-904); a layer runs the DSA
  backend when the sparse section is enabled (common/config.py:74-90), its type (`full_attention`
  past the end of the list) is in `apply_to_layer_types` (model.py:450-464, only
  `("full_attention",)` is accepted: common/config.py:127-139) and it has no window (model.py:1008);
- KV heads per rank: `num_attention_groups` (or `attention_other_setting`'s for a layer of its
  `attention_type`, model.py:1858-1872) over TP, at least 1 (:944); head_dim: `head_dim` or
  `hidden_size // heads` (:951), heads being `swa_num_attention_heads` on a windowed layer (:899-902);
- every backend accepts CacheConfig.DEFAULT_BLOCK_SIZE 64 (config/cache.py:185): FLASH_ATTN and
  STEP5_DSA take multiples of 16 (v1/attention/backends/flash_attn.py:357-367), the summary and the
  tail ring any (v1/attention/backend.py:74-77, common/csa_tail_ring.py:144-150 when the ring fits),
  so platforms/interface.py:733-734 keeps 64; a sliding layer takes the same block
  (model_executor/layers/attention/attention.py:655-702);
- STEP5_DSA lists only the BLNHC layout (sparse_attention.py:823-826), so the whole model gets it
  (v1/attention/backends/utils.py:252-270): a block-outermost layout;
- a sliding layer: SlidingWindowSpec, page `block x 2 x heads x head_dim x 2` B; a DSA layer: the
  same page as FullAttentionSpec with a block stride of whole 8-token kernel pages
  (sparse_attention.py:890-893, v1/kv_cache_interface.py:213-223), its summary a FullAttentionSpec
  of one 256-B row per 8 tokens (common/sparse_summary_cache.py:143-154) and its tail ring a
  CircularBufferSpec of the main page, block stride a multiple of 1,024 B
  (common/csa_tail_ring.py:188-212);
- _get_packed_kv_cache_groups (v1/core/kv_cache_planning.py:958) packs them as for DeepSeek-V4
  (planner/deepseek_v4.py `packed_groups`); a BLNHC block is the largest group's pages rounded up
  to the least common multiple of every layer's block-stride alignment (:620-648), and a budget
  holds `budget // block` blocks (:724);
- the MTP draft (`--speculative-config` method "mtp" or "step5_mtp", renamed to "mtp", with
  num_speculative_tokens k > 0): vLLM maps the target to Step5MTP with n_predict =
  `num_nextn_predict_layers` (config/speculative.py:1170-1185), which builds that many
  Step5DecoderLayer at `model.layers.{num_hidden_layers + i}` (models/step5/nvidia/mtp.py:175-201;
  it refuses 0 layers, :185-189, and an MoE draft layer, :304-305: `moe_layers_enum` or
  `moe_layer_list`, else layers 1 .. num_hidden_layers - 1, model.py:256-285). Each is a target
  decoder layer of its index (`layer_types_with_mtp`, whose length Step5Config checks,
  transformers_utils/configs/step5.py:163-185; the parity default without one), so its caches are
  the target's kinds and join the target's groups; its tail ring needs 7 + k rows of one main page
  (common/csa_tail_ring.py:182, :192-197). With more than one module and k > 1 (no
  `index_share_for_mtp_iteration`) vLLM drafts with MultiModuleMTPSpeculator, whose prefill lookahead
  of k tokens makes every sliding window retain k - 1 more (config/speculative.py:1813-1827,
  v1/worker/gpu/spec_decode/multi_module_mtp/config.py:13-18, v1/core/kv_cache_planning.py:1742-1748).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.deepseek_v4 import CacheSpec, Group, Packing, drafts_with_mtp, mtp_retained_tokens, packed_groups
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.values.versions import VllmVersion

ARCHITECTURES = frozenset({"Step5ForCausalLM"})   # Step5ForConditionalGeneration: LANGUAGE_MODELS
SOURCE = "vLLM 0.34.0, vllm/models/step5/nvidia/model.py:886-1008, :1844-1915, " \
         "vllm/models/step5/nvidia/sparse_attention.py:823-901, vllm/v1/core/kv_cache_planning.py:620-724"
BLOCK_SIZE = 64           # CacheConfig.DEFAULT_BLOCK_SIZE (config/cache.py:185)
LAYOUT = "BLNHC"          # sparse_attention.py:823-826
DSA_HEAD_DIM = 192        # sparse_attention.py:829-830
DSA_KERNEL_BLOCK = 8      # customize_spec's MultipleOf(8) (sparse_attention.py:890-893)
SUMMARY_ROW_BYTES = 256   # sparse_summary_cache.py:143-154: one uint8 row per 8 tokens
SUMMARY_TOKENS = 8
RING_ROW_BYTES = 1024     # csa_tail_ring.py:24-26
SM = (9, 0)               # the scope's SM family; STEP5_DSA runs on 9.0, 10.0, 10.3 (sparse_attention.py:896-901)
KV_BYTES = 2              # bf16
CHECKED_MINOR = (0, 34)   # the release whose code the oracle ran (tests/step5_oracle.py)


@dataclass(frozen=True)
class Step5Layer:
    """One decoder layer as vLLM builds it: its kind, per-rank KV heads, head_dim and window."""

    kind: str        # "sliding", "dsa" or "full" (full attention without DSA)
    kv_heads: int
    head_dim: int
    window: int      # 0 but for sliding
    heads: int = 0   # query heads (before TP)


@dataclass(frozen=True)
class Step5Packing:
    """The groups, the block and the reason a case is outside the scope ("" when inside)."""

    groups: tuple[Group, ...]
    bytes_per_block: int
    out_of_scope: str


def _layer_types(cfg: Mapping[str, Any]) -> list[str]:
    total = int(cfg.get("num_hidden_layers") or 0) + int(cfg.get("num_nextn_predict_layers") or 0)
    return list((cfg.get("layer_types_with_mtp") or cfg.get("layer_types") or [])[:total])


def _sparse_enabled(cfg: Mapping[str, Any]) -> bool:
    section = cfg.get("sparse_config")
    return isinstance(section, Mapping) and section.get("enabled") is not False


def step5_layers(cfg: Mapping[str, Any], tp: int, mtp: bool = False) -> list[Step5Layer]:
    """The decoder layers of a Step5 text config.json at tensor-parallel size `tp` (unset fields take
    Step5Config's defaults: 40 heads, 8 KV heads, hidden size 5120, transformers_utils/configs/step5.py:60-64);
    with `mtp`, the MTP draft's layers (indices num_hidden_layers on) instead."""
    types = _layer_types(cfg)
    if types and len(types) < int(cfg["num_hidden_layers"]):
        raise ConfigError("config.json: Step5's layer_types must list every layer (vLLM refuses a shorter list)")
    other = cfg.get("attention_other_setting") or {}
    window = cfg.get("sliding_window")
    layers = []
    first = int(cfg["num_hidden_layers"])
    indices = range(first, first + mtp_layer_count(cfg)) if mtp else range(first)
    for i in indices:
        layer_type = types[i] if types else ("sliding_attention" if i % 2 == 0 else "full_attention")
        own = bool(other) and i < len(types) and types[i] == other.get("attention_type")
        heads = int((other["num_attention_heads"] if own else 0) or cfg.get("num_attention_heads") or 40)
        layer_window = window if window is not None and layer_type == "sliding_attention" else None
        if layer_window is not None and cfg.get("swa_num_attention_heads") is not None:
            heads = int(cfg["swa_num_attention_heads"])
        kv = int((other["num_attention_groups"] if own else 0) or cfg.get("num_attention_groups") or 8)
        head_dim = int((other["head_dim"] if own else 0) or cfg.get("head_dim") or int(cfg.get("hidden_size") or 5120)
                       // heads)
        full = (types[i] if i < len(types) else "full_attention") == "full_attention"
        kind = "sliding" if layer_window is not None else \
            "dsa" if _sparse_enabled(cfg) and full else "full"
        layers.append(Step5Layer(kind, max(1, kv // tp), head_dim, int(layer_window or 0), heads))
    return layers


def mtp_layer_count(cfg: Mapping[str, Any]) -> int:
    """num_nextn_predict_layers: the MTP draft's layers (Step5Config's default 0, configs/step5.py:92)."""
    count = cfg.get("num_nextn_predict_layers") or 0
    if not isinstance(count, int) or count < 0:
        raise ConfigError("config.json: Step5's num_nextn_predict_layers must be a non-negative integer")
    return count


def _moe_layers(cfg: Mapping[str, Any]) -> set[int]:
    """The MoE layer indices (models/step5/nvidia/model.py:256-285): moe_layers_enum or moe_layer_list
    (a comma-separated string or a list), else layers 1 .. num_hidden_layers - 1."""
    for key in ("moe_layers_enum", "moe_layer_list"):
        value = cfg.get(key)
        if value is not None:
            items = value.split(",") if isinstance(value, str) else value
            return {int(item) for item in items if str(item).strip()}
    return set(range(1, int(cfg["num_hidden_layers"])))


def _mtp_reasons(cfg: Mapping[str, Any]) -> str:
    """Why vLLM refuses this config's MTP draft ("" when it builds it)."""
    count, first = mtp_layer_count(cfg), int(cfg["num_hidden_layers"])
    if count == 0:
        return "an MTP draft of num_nextn_predict_layers 0 (vLLM refuses it: models/step5/nvidia/mtp.py:185-189)"
    if _moe_layers(cfg) & set(range(first, first + count)):
        return "an MoE MTP layer (vLLM refuses it: models/step5/nvidia/mtp.py:304-305)"
    return ""


@dataclass(frozen=True)
class Step5Shape:
    """A Step5 text config.json as vLLM builds it: its layers (KV heads before TP) and why the config
    itself lies outside the scope ("" when it does not); its MTP draft's layers and why vLLM refuses
    that draft ("" when it builds it)."""

    layers: tuple[Step5Layer, ...]
    config_reasons: str
    mtp_layers: tuple[Step5Layer, ...] = ()
    mtp_reasons: str = ""
    mtp_modules: int = 0   # num_nextn_predict_layers
    index_share: bool = False   # index_share_for_mtp_iteration


# The sparse_config fields vLLM validates (models/step5/common/config.py:12-29, :74-198): their
# defaults. They shape no cache, but another value may be refused, so it is not planned here.
_SPARSE_DEFAULTS: dict[str, object] = {
    "proxy_dim": 256, "region_block_size": 8, "sparse_indexer_num_k_heads": 1, "sparse_indexer_use_rope": True,
    "sparse_indexer_q_norm_type": "rmsnorm", "sparse_indexer_k_norm_type": "layernorm",
    "sparse_indexer_csa_z_norm_type": "none", "compression_method": "csa_block_compress",
    "attention_impl": "sparse_gqa", "sparse_indexer_ssmax_s_granularity": "q_head", "sparse_indexer_num_heads": 16,
    "index_tp_size": 4, "num_provider_groups": 4, "sparse_indexer_rope_dim": 32,
    "sparse_indexer_softmax_variant": "softmax", "softmax_variant": None}


def _unchecked_sparse_fields(section: Mapping[str, Any]) -> list[str]:
    def same(value: object, default: object) -> bool:
        if isinstance(default, str) and isinstance(value, str):
            return value.strip().lower() == default
        return value == default and type(value) is type(default)
    fields = [k for k, d in _SPARSE_DEFAULTS.items() if section.get(k) not in (None, "") and not same(section[k], d)]
    if not isinstance(section.get("enabled"), (bool, type(None))):
        fields.append("enabled")
    topk = section.get("topk")
    if topk not in (None, "") and not (isinstance(topk, int) and 1 <= topk <= 1024):
        fields.append("topk")
    return fields


def step5_shape(cfg: Mapping[str, Any], architectures: Sequence[str]) -> Step5Shape | None:
    """The shape of a Step5 (text) config.json; None for any other model."""
    if not (ARCHITECTURES | {"Step5ForConditionalGeneration"}) & set(architectures) \
            and cfg.get("model_type") != "step5":
        return None
    try:
        layers = step5_layers(cfg, 1)
        mtp = step5_layers(cfg, 1, mtp=True)
        mtp_reasons = _mtp_reasons(cfg)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        raise ConfigError(f"config.json: Step5 field {error} is not one vLLM builds layers from") from error
    section = cfg.get("sparse_config")
    apply_to = (section if isinstance(section, Mapping) else {}).get("apply_to_layer_types") or ["full_attention"]
    reasons = [
        (not isinstance(section, Mapping), "no sparse_config section (vLLM refuses the model)"),
        (not any(layer.kind == "dsa" for layer in layers), "no DSA layer"),
        ([str(t).strip().lower() for t in apply_to] != ["full_attention"], "apply_to_layer_types other than "
                                                                            "full_attention (vLLM refuses it)"),
        (any(layer.kind == "full" for layer in layers), "a full-attention layer without DSA"),
        (any(layer.head_dim != DSA_HEAD_DIM for layer in layers), f"a head_dim other than {DSA_HEAD_DIM}"),
        (cfg.get("att_impl_type", "GQA") != "GQA", "an att_impl_type other than GQA (vLLM refuses it)"),
        (any(cfg.get(name) is not None for name in ("step5_sparse_config", "step3p5_sparse_config")),
         "a step5_sparse_config or step3p5_sparse_config section (vLLM refuses it: common/config.py:55-62)"),
        (bool(unchecked := _unchecked_sparse_fields(section if isinstance(section, Mapping) else {})),
         f"sparse_config {', '.join(unchecked)} other than vLLM's defaults (which kvwatch checked)"),
    ]
    return Step5Shape(tuple(layers), "; ".join(why for hit, why in reasons if hit), tuple(mtp), mtp_reasons,
                      mtp_layer_count(cfg), cfg.get("index_share_for_mtp_iteration") is True)


def per_rank(shape: Step5Shape, tp: int, mtp: bool = False) -> list[Step5Layer]:
    """The layers on one of `tp` ranks (with `mtp`, the MTP draft's after the target's): KV heads over TP,
    at least 1 (model.py:944)."""
    layers = (*shape.layers, *shape.mtp_layers) if mtp else shape.layers
    return [replace(layer, kv_heads=max(1, layer.kv_heads // tp)) for layer in layers]


def ring_too_small(layers: Sequence[Step5Layer], num_speculative_tokens: int) -> str:
    """Why vLLM refuses the tail rings of these (per-rank) layers at k speculative tokens: a DSA layer's
    main page holds fewer than 7 + k 1,024-B rows (common/csa_tail_ring.py:182, :192-197); "" otherwise."""
    rows = min((BLOCK_SIZE * 2 * layer.kv_heads * layer.head_dim * KV_BYTES // RING_ROW_BYTES
                for layer in layers if layer.kind == "dsa"), default=0)
    need = 7 + num_speculative_tokens
    return f"a CSA tail ring of {rows} rows, short of {need} (vLLM refuses it)" if 0 < rows < need else ""


def draft_retained_tokens(shape: Step5Shape, num_speculative_tokens: int) -> int:
    """The tokens every sliding window retains past its own for the MTP draft (see above)."""
    return mtp_retained_tokens(shape.mtp_modules, num_speculative_tokens, shape.index_share)


def out_of_scope(shape: Step5Shape, *, sm: tuple[int, int], kv_cache_dtype: str, dtype: str,
                 block_size: int | None, num_speculative_tokens: int, platform: str = "cuda",
                 minor: tuple[int, int] | None = CHECKED_MINOR, other: str = "", mtp: bool = False) -> str:
    """Why this case lies outside the one scope planned here; "" when it lies inside. `other`: the
    command's own reasons (parallelism, backend, cache manager); `mtp`: the speculative tokens are the
    checkpoint's MTP draft's, planned with the target."""
    reasons = [
        (bool(shape.config_reasons), shape.config_reasons),
        (minor is not None and minor != CHECKED_MINOR, f"vLLM {minor and '.'.join(map(str, minor))}: only "
                                                       f"{CHECKED_MINOR[0]}.{CHECKED_MINOR[1]} is checked"),
        (platform != "cuda" or sm != SM, f"{platform} SM {sm[0]}.{sm[1]}: only CUDA SM {SM[0]}.{SM[1]} is checked"
                                         if platform == "cuda" else f"{platform}: only CUDA SM {SM[0]}.{SM[1]} is checked"),
        (kv_cache_dtype not in ("auto", "bfloat16") or dtype not in ("auto", "bfloat16"), "a KV cache other than bf16"),
        (block_size is not None, "--block-size set"),
        (num_speculative_tokens > 0 and not mtp, "speculative decoding"),
        (mtp and bool(shape.mtp_reasons), shape.mtp_reasons),
        (bool(other), other),
    ]
    return "; ".join(why for hit, why in reasons if hit)


def layer_specs(layers: Sequence[Step5Layer]) -> list[tuple[CacheSpec, int]]:
    """Each cache's spec and its block-stride alignment in bytes, in vLLM's registration order."""
    specs: list[tuple[CacheSpec, int]] = []
    for layer in layers:
        per_token = 2 * layer.kv_heads * layer.head_dim * KV_BYTES
        page = BLOCK_SIZE * per_token
        if layer.kind == "sliding":
            specs.append((CacheSpec("attn", "sliding", BLOCK_SIZE, layer.window, page, "bfloat16"), 1))
            continue
        specs.append((CacheSpec("attn", "full", BLOCK_SIZE, 0, page, "bfloat16"), DSA_KERNEL_BLOCK * per_token))
        summary = BLOCK_SIZE // SUMMARY_TOKENS * SUMMARY_ROW_BYTES
        specs.append((CacheSpec("sparse_summary_cache", "full", BLOCK_SIZE, 0, summary, "uint8"), 1))
        specs.append((CacheSpec("csa_tail_ring", "ring", BLOCK_SIZE, 0, page, "bfloat16"), RING_ROW_BYTES))
    return specs


def packing(layers: Sequence[Step5Layer], scope: str = "") -> Step5Packing:
    """vLLM 0.34's groups and BLNHC block for these layers (meaningful only when `scope` is "")."""
    specs = layer_specs(layers)
    groups = packed_groups([spec for spec, _ in specs])
    widest = max(g.page_bytes for g in groups)
    alignment = math.lcm(*(align for _, align in specs))
    return Step5Packing(tuple(groups), -(-widest // alignment) * alignment, scope)


def num_blocks(kv: Step5Packing, kv_memory_bytes: int) -> int:
    """Blocks vLLM 0.34 allocates in `kv_memory_bytes` of one rank."""
    return kv_memory_bytes // kv.bytes_per_block


def divides(shape: Step5Shape, tp: int) -> bool:
    """Whether vLLM takes this TP: it divides every layer's query heads, and the KV heads divide by it or
    it by them (model.py:914-942)."""
    return all(layer.heads % tp == 0 and (layer.kv_heads % tp == 0 if layer.kv_heads >= tp else tp % layer.kv_heads == 0)
               for layer in shape.layers)


def plan_packing(shape: Step5Shape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> Packing:
    """The packing make_plan reports for this command (with the MTP draft's layers where the command drafts
    with it): unsure, with its reason, outside the scope."""
    tp = max(1, settings.tensor_parallel_size)
    mtp = drafts_with_mtp(settings.speculative_method, settings.num_speculative_tokens)
    too_small = ring_too_small(per_rank(shape, tp, mtp), settings.num_speculative_tokens) if mtp else ""
    other = [why for hit, why in (
        (settings.pipeline_parallel_size > 1, "pipeline parallelism"),
        (settings.attention_backend is not None, "--attention-backend set"),
        (settings.disable_hybrid_kv_cache_manager, "--disable-hybrid-kv-cache-manager"),
        (bool(settings.speculative_config) and not mtp, f"--speculative-config method {settings.speculative_method!r}: "
                                                        f"only Step5's MTP draft is planned"),
        (bool(too_small), too_small),
        (not divides(shape, tp),
         f"TP {settings.tensor_parallel_size} not dividing the heads (vLLM refuses it: model.py:914-942)")) if hit]
    major, _, minor = device.sm.partition(".")
    sm = (int(major), int(minor or 0)) if device.platform == "cuda" and major.isdigit() and minor.isdigit() else (0, 0)
    dtype = (config_dtype or "not given") if settings.dtype == "auto" else settings.dtype
    scope = out_of_scope(shape, sm=sm, kv_cache_dtype=settings.kv_cache_dtype,
                         dtype=dtype, block_size=settings.block_size,
                         num_speculative_tokens=settings.num_speculative_tokens, platform=device.platform,
                         minor=(version.parts[0], version.parts[1]) if version is not None else None,
                         other="; ".join(other), mtp=mtp)
    kv = packing(per_rank(shape, tp, mtp), scope)
    unsure = (f"Step5 outside the one scope kvwatch checked against vLLM's own code: {scope}",) if scope else ()
    return Packing(kv.groups, kv.bytes_per_block, "STEP5_DSA" if device.platform == "cuda" else None, unsure,
                   attention="step5_dsa", block_size=BLOCK_SIZE, source=SOURCE, dtype_bytes=KV_BYTES,
                   extra_retained=draft_retained_tokens(shape, settings.num_speculative_tokens) if mtp else 0,
                   drafted=mtp and bool(shape.mtp_layers))


# The layer classes whose caches this module plans (architecture_kinds.PLANNED_KINDS).
STEP5_KINDS: dict[str, str] = {
    "Step5CSATailRing": "Step5 CSA tail ring (planner/step5_sparse.py)",
    "Step5SparseSummaryCacheLayer": "Step5 CSA summary (planner/step5_sparse.py)"}
