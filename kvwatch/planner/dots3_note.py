"""Dots3's (dots3_note) caches and vLLM's packing of them into blocks, on one scope only (pure).

Dots3 is MLA with two latents: its sliding layers keep a wider one than its DSA layers, and vLLM pads
the DSA layers' latent rows to the sliding width so that both share one row size (the "padded MLA").
The scope: vLLM 0.33 or 0.34 on CUDA SM 9.0, a bf16 model with a bf16 KV cache (`--kv-cache-dtype
auto`), no `--block-size`, no speculative decoding but with the checkpoint's MTP draft (below), no
pipeline parallelism, no `--attention-backend`,
the hybrid KV cache manager on, a config with `index_topk`, `layer_types`, an `index_head_dim` of 128
and the sliding latent of 1,088 its backend takes. Anything else is unsure (`out_of_scope`), not
planned. Each rule cites vLLM 0.34.0 (0.33.0 has the same code, its model.py a line earlier from
:221):

- a layer is sliding where `layer_types[i]` is "sliding_attention", else DSA
  (vllm/models/dots3_note/nvidia/model.py:525-529);
- a sliding layer: an MLA latent of `swa_kv_lora_rank + swa_qk_rope_head_dim` with window
  `sliding_window_size` (:353-481): a SlidingWindowMLASpec (model_executor/layers/attention/
  mla_attention.py:1587-1592) on Dots3NoteTritonMLABackend, which takes that head of 1,088 only and
  multiples of 16 tokens (models/dots3_note/nvidia/attention.py:433-442, v1/attention/backends/mla/
  triton_mla.py:126-133);
- a DSA layer: its indexer's keys where DeepseekV2MLAAttention's IndexCache rule keeps them
  (planner/indexer.py: an MLAAttentionSpec of `index_head_dim + index_head_dim // 128 * 4` uint8
  bytes, model_executor/models/deepseek_v2.py:658-666, :731-736, :1138-1169), registered first, then
  its latent of `kv_lora_rank + qk_rope_head_dim` padded to the sliding latent
  (Dots3NotePaddedMLAAttention.get_kv_cache_spec, model.py:228-240, :307) on
  Dots3NotePaddedSparseBackend, whose blocks must be whole latent rows apart
  (v1/attention/backends/mla/flashattn_mla_sparse.py:50-55, mla/sparse_utils.py:43-46);
- every backend takes CacheConfig.DEFAULT_BLOCK_SIZE 64 (the indexer's only kernel block is 64:
  v1/attention/backends/mla/indexer.py:237-238), so the block is 64 (platforms/interface.py:731-734);
- Dots3NotePaddedSparseBackend lists the BLHNC layout only (attention.py:695-700), a block-outermost
  one, so _get_packed_kv_cache_groups (v1/core/kv_cache_planning.py:958; :914 in 0.33) packs the
  caches as for DeepSeek-V4 (planner/deepseek_v4.py `packed_groups`: the sliding latents one bucket,
  the DSA latents and indexer keys another), and a block is the largest group's pages rounded up to
  the least common multiple of every layer's block-stride alignment (:620-648);
- the MTP draft (`--speculative-config` method "mtp" or "dots3_note_mtp", k speculative tokens > 0):
  vLLM maps a config.json of model_type "dots3_note" to Dots3NoteMTPModel with n_predict =
  `num_nextn_predict_layers` (Dots3NoteConfig's default 1, transformers_utils/configs/dots3_note.py:24)
  and appends `mtp_layer_types` (one sliding_attention a layer when unset; another length is a
  ValueError) to `layer_types` (config/speculative.py:832-846; 0.33.0 :734-748). Its layers at
  `model.layers.{num_hidden_layers + i}` are Dots3 decoder layers of that type (models/dots3_note/
  nvidia/mtp.py:53-57, :103-120; model.py:520-529), so their caches are the target's kinds and join
  its groups; a DSA draft layer always builds its indexer, whatever the IndexCache rule says of the
  target's (model_executor/models/deepseek_v2.py:1157-1168). With more than one draft layer and k > 1
  vLLM drafts with the multi-module MTP speculator, whose prefill lookahead of k tokens makes every
  sliding window retain k - 1 more (v1/core/kv_cache_planning.py:1742-1748, config/speculative.py:
  1813-1827, v1/worker/gpu/spec_decode/multi_module_mtp/config.py:13-18; 0.33.0 the same through
  config/vllm.py:655-675 and speculative.py:2188-2194, which does not read
  `index_share_for_mtp_iteration`). kvwatch reads that field from config.json only, not from
  `--speculative-config`.

MLA caches are TP-replicated: tensor parallelism changes no page, only whether vLLM takes it (the
sliding and DSA heads must divide by it: model.py:373 and deepseek_v2.py's column-parallel
projections). kvwatch reads no context-parallel or KV-connector flag, so a command with one is planned
as one without.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import positive_field
from kvwatch.planner.deepseek_v4 import CacheSpec, Group, Packing, drafts_with_mtp, mtp_retained_tokens, packed_groups
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.indexer import QUANT_BLOCK, SCALE_BYTES, indexer_flags
from kvwatch.planner.one_scope import bf16_model, mtp_draft_reason, outside
from kvwatch.values.versions import VllmVersion

ARCHITECTURES = frozenset({"Dots3NoteForCausalLM"})
MODEL_TYPES = frozenset({"dots3_note"})
SOURCE = "vLLM 0.34.0, vllm/models/dots3_note/nvidia/model.py:228-529, " \
         "vllm/models/dots3_note/nvidia/attention.py:433-700, vllm/v1/core/kv_cache_planning.py:620-648, :958-1085"
BACKEND = "DOTS3_NOTE_PADDED_MLA_SPARSE"   # attention.py:703-704, the DSA layers' backend
BLOCK_SIZE = 64           # CacheConfig.DEFAULT_BLOCK_SIZE (config/cache.py:185), which every backend takes
SWA_HEAD = 1088           # Dots3NoteTritonMLABackend.get_supported_head_sizes (attention.py:437-438)
INDEX_HEAD_DIM = 128      # the only index_head_dim checked
KV_BYTES = 2              # bf16
CHECKED_MINORS = frozenset({(0, 33), (0, 34)})   # the releases whose code the oracle ran (tests/dots3_note_oracle.py)
_SIZES = ("kv_lora_rank", "qk_rope_head_dim", "swa_kv_lora_rank", "swa_qk_rope_head_dim", "sliding_window_size",
          "num_attention_heads", "swa_num_attention_heads")


@dataclass(frozen=True)
class Dots3Shape:
    """What vLLM's Dots3 layers read from config.json to build their caches."""

    sliding: tuple[bool, ...]   # per decoder layer: sliding (True) or DSA
    indexer: tuple[bool, ...]   # per decoder layer: a DSA layer with its indexer's keys
    latent: int                 # the DSA latent, kv_lora_rank + qk_rope_head_dim
    swa_latent: int             # the sliding latent, which the DSA latent is padded to
    window: int                 # sliding_window_size
    index_key: int              # an indexer key's bytes
    heads: tuple[int, int]      # num_attention_heads, swa_num_attention_heads (TP must divide both)
    config_reasons: str         # the config's own ways out of the scope ("" when inside)
    mtp_sliding: tuple[bool, ...] = ()   # per MTP draft layer: sliding (True) or DSA (which keeps its indexer)
    mtp_reasons: str = ""       # why its MTP draft is not planned ("" when it is)
    index_share: bool = False   # index_share_for_mtp_iteration (0.34 drafts with one module when set)


def dots3_shape(cfg: Mapping[str, Any], architectures: Sequence[str]) -> Dots3Shape | None:
    """The shape of a Dots3 config.json; None for any other model."""
    model_type = cfg.get("model_type")
    if not (ARCHITECTURES & set(architectures) or (isinstance(model_type, str) and model_type in MODEL_TYPES)):
        return None
    layers = positive_field(cfg, "num_hidden_layers", None, "Dots3")
    size = {k: positive_field(cfg, k, None, "Dots3") for k in _SIZES}
    types = cfg.get("layer_types")
    if types is not None and not (isinstance(types, list) and len(types) >= layers):
        raise ConfigError("config.json: Dots3's layer_types must list every layer (vLLM reads one per layer)")
    sliding = tuple(types is not None and types[i] == "sliding_attention" for i in range(layers))
    index_dim = positive_field(cfg, "index_head_dim", INDEX_HEAD_DIM, "Dots3")
    flags = indexer_flags(cfg, layers)
    shape = Dots3Shape(sliding, tuple(f and not s for f, s in zip(flags, sliding, strict=True)),
                       size["kv_lora_rank"] + size["qk_rope_head_dim"],
                       size["swa_kv_lora_rank"] + size["swa_qk_rope_head_dim"], size["sliding_window_size"],
                       index_dim + index_dim // QUANT_BLOCK * SCALE_BYTES,
                       (size["num_attention_heads"], size["swa_num_attention_heads"]), "")
    reasons = [why for hit, why in (
        ("index_topk" not in cfg, "no index_topk (the DSA layers need it: model.py:586-591)"),
        (types is None, "no layer_types (vLLM reads config.layer_types per layer: model.py:525-529)"),
        (index_dim != INDEX_HEAD_DIM, f"index_head_dim {index_dim} (only {INDEX_HEAD_DIM} is checked)"),
        (shape.swa_latent != SWA_HEAD, f"a sliding latent of {shape.swa_latent} (its backend takes {SWA_HEAD} only)"),
        (shape.latent > shape.swa_latent, "a DSA latent wider than the sliding one (vLLM asserts it: model.py:234)"),
        (not any(shape.sliding) or all(shape.sliding), "not a sliding and DSA hybrid"),
    ) if hit]
    mtp_sliding, mtp_reasons = _mtp_layers(cfg)
    return replace(shape, config_reasons="; ".join(reasons), mtp_sliding=mtp_sliding, mtp_reasons=mtp_reasons,
                   index_share=cfg.get("index_share_for_mtp_iteration") is True)


def _mtp_layers(cfg: Mapping[str, Any]) -> tuple[tuple[bool, ...], str]:
    """The MTP draft's layers (sliding or DSA) as config/speculative.py:832-846 appends them, and why vLLM
    would not build the draft ("" when it does)."""
    if cfg.get("model_type") != "dots3_note":
        return (), f"a config.json of model_type {cfg.get('model_type')!r}, which vLLM does not map to its MTP head " \
                   f"(only dots3_note: config/speculative.py:832)"
    count = cfg.get("num_nextn_predict_layers", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= 64:
        return (), f"num_nextn_predict_layers {count!r}: an MTP draft of 1 to 64 layers is planned"
    types = cfg.get("mtp_layer_types")
    if types is None:
        return (True,) * count, ""
    if not isinstance(types, list) or len(types) != count:
        return (), "mtp_layer_types not one entry per MTP layer (vLLM refuses it: config/speculative.py:837-841)"
    return tuple(t == "sliding_attention" for t in types), ""


def layer_specs(shape: Dots3Shape, mtp: bool = False) -> list[tuple[CacheSpec, int]]:
    """Each cache's spec and its block-stride alignment in bytes, in vLLM's registration order (with `mtp`,
    the MTP draft's layers after the target's, each DSA one with its indexer)."""
    page = BLOCK_SIZE * shape.swa_latent * KV_BYTES
    specs: list[tuple[CacheSpec, int]] = []
    draft = [(sliding, not sliding) for sliding in shape.mtp_sliding] if mtp else []
    for sliding, indexer in (*zip(shape.sliding, shape.indexer, strict=True), *draft):
        if sliding:
            specs.append((CacheSpec("attn", "swa_mla", BLOCK_SIZE, shape.window, page, "bfloat16"), 1))
            continue
        if indexer:   # its kernel block is the block itself: no stride alignment (v1/worker/utils.py:469-479)
            specs.append((CacheSpec("indexer.k_cache", "mla", BLOCK_SIZE, 0, BLOCK_SIZE * shape.index_key, "uint8"), 1))
        specs.append((CacheSpec("mla_attn", "mla", BLOCK_SIZE, 0, page, "bfloat16"), shape.swa_latent * KV_BYTES))
    return specs


@dataclass(frozen=True)
class Dots3Packing:
    groups: tuple[Group, ...]
    bytes_per_block: int


def packing(shape: Dots3Shape, mtp: bool = False) -> Dots3Packing:
    """vLLM's groups and BLHNC bytes per block (the same on every TP rank; with `mtp`, the MTP draft's too)."""
    specs = layer_specs(shape, mtp)
    groups = packed_groups([spec for spec, _ in specs])
    widest = max(g.page_bytes for g in groups)
    alignment = math.lcm(*(align for _, align in specs))
    return Dots3Packing(tuple(groups), -(-widest // alignment) * alignment)


def draft_reasons(shape: Dots3Shape, settings: EngineSettings) -> str:
    """Why this command's draft is not planned with the target ("" where it drafts with the checkpoint's
    MTP head, or drafts not at all)."""
    return mtp_draft_reason(settings, "Dots3", shape.mtp_reasons) or ""


def retained_tokens(shape: Dots3Shape, num_speculative_tokens: int, version: VllmVersion | None) -> int:
    """The tokens every sliding window retains past its own for the MTP draft (0.33 does not read
    index_share_for_mtp_iteration: config/speculative.py:2188-2194 there)."""
    share = shape.index_share and (version is None or version.parts[:2] != (0, 33))
    return mtp_retained_tokens(len(shape.mtp_sliding), num_speculative_tokens, share)


def out_of_scope(shape: Dots3Shape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> str:
    """Why this command lies outside the one scope planned here; "" when it lies inside."""
    tp = max(1, settings.tensor_parallel_size)
    bf16 = settings.kv_cache_dtype in ("auto", "bfloat16") and bf16_model(settings, config_dtype)
    return outside(settings, device, version, checked=CHECKED_MINORS, config_reasons=shape.config_reasons,
                   dtype=(not bf16, "a model or KV cache other than bf16"), draft=draft_reasons(shape, settings),
                   backend=None, own=[(any(h % tp for h in shape.heads),
                                       f"TP {tp} not dividing the attention heads (vLLM asserts it: model.py:373)")])


def plan_packing(shape: Dots3Shape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> Packing:
    """The packing make_plan reports for this command: unsure, with its reason, outside the scope."""
    scope = out_of_scope(shape, settings, device, version, config_dtype)
    mtp = drafts_with_mtp(settings.speculative_method, settings.num_speculative_tokens) and not shape.mtp_reasons
    kv = packing(shape, mtp)
    unsure = (f"Dots3 outside the one scope kvwatch checked against vLLM's own code "
              f"(CUDA SM 9.0, bf16, defaults): {scope}",) if scope else ()
    return Packing(kv.groups, kv.bytes_per_block, BACKEND if device.platform == "cuda" else None, unsure,
                   attention="dots3_note", block_size=BLOCK_SIZE, source=SOURCE, dtype_bytes=KV_BYTES,
                   extra_retained=retained_tokens(shape, settings.num_speculative_tokens, version) if mtp else 0,
                   drafted=mtp)


# The layer class whose cache this module plans (architecture_kinds).
DOTS3_KINDS: dict[str, str] = {
    "Dots3NotePaddedMLAAttention": "Dots3 DSA latent padded to the sliding latent (planner/dots3_note.py)"}
