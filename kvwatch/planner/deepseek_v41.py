"""DeepSeek-V4.1's cache kinds and vLLM 0.34's packing of them, on CUDA SM 9.x (pure).

DeepSeek-V4.1 (DeepseekV41ForCausalLM) builds the DeepSeek-V4 layer classes with caches of other
shapes (vLLM 0.34.0, vllm/models/deepseek_v41/):

- every layer's compress ratio is `compress_ratios[i]`, 0 (sliding window only), 1 or 2
  (attention.py:381-392);
- only the `kv_source_layer_ids` layers own a compressed latent cache (an MLAAttentionSpec of the
  cache block size, one `bytes_per_token` row per `ratio` tokens, attention.py:1256-1288) and a
  compressor, whose float32 state (ratio 2 only: a ratio-1 compressor keeps none) is a
  CircularBufferSpec of `2 * head_dim` a row and `max(8, next power of two of num_speculative_tokens
  + 2)` rows, one block a request (compressor.py:238-266, :335-342; kv_cache_interface.py:982-1018);
- only the kv sources that are also `index_source_layer_ids` own the indexer's FP8 keys,
  `index_head_dim + index_head_dim // 128 * 4` bytes per state (attention.py:181-189, :503-517,
  :1324-1359); the other layers read their source's caches;
- every layer has a sliding-window cache of block 32 (attention.py:614-632), with bounded replay on by
  default (vllm/config/cache.py:379), which keeps it out of prefix caching and changes no size.

The records depend on the GPU (_use_v41_mxfp8_kv_record, attention.py:198-199): on SM 10.x they are
528 bytes with 512-byte page alignment and a block-stride alignment, and the default class there is
FlashMLA mega attention with NVFP4 compressed records (nvidia/model.py:256-268). kvwatch plans one
scope exactly: CUDA SM 9.x with the class CUDA picks there (DeepseekV4FlashMLAAttention, FlashMLA
sparse), `--kv-cache-dtype` auto or fp8 (both the fp8_ds_mla layout, attention.py:220-229), no
speculative decoding, no `--block-size`, no context parallelism. There every row is 584 bytes, every
packed page is padded to 576 bytes and no spec has a block-stride alignment, and the cache block size
is 64: the one every backend the layers name takes (the V4.1 FlashMLA and indexer backends' 64-token
kernel blocks on SM 9.x, sparse_mla.py:116-117 and vllm/v1/attention/backends/mla/indexer.py:317-322;
vllm/platforms/interface.py:710-757). Anything else keeps its figures marked unsure, with the reason.
The groups are DeepSeek-V4's packing rule (planner/deepseek_v4.py), the compressor rings being state
buckets (kv_cache_planning.py:1037-1042).

The DSpark draft (`--speculative-config` method "dspark") is planned with the target in that scope: it
reuses the target's config, as DSparkV41DraftModel (v1/worker/gpu/spec_decode/dspark/config.py:56-68),
k = num_speculative_tokens or, unset, the config's `block_size` or `dspark_block_size` (:77-85); it
builds `n_mtp_layers` or `num_nextn_predict_layers` (3 when neither) DeepseekV4DecoderLayer at
`layers.{num_hidden_layers + i}` (nvidia/dspark.py:90-94, :125-134), which are never kv or index sources
(attention.py:403-405) and so own only their block-32 sliding cache; and every compressor ring holds
max(8, next power of two of k + 2) rows (compressor.py:250-252). A drafter of the target's hidden
states looks one token ahead, so the windows retain no more (dflash/config.py:19,
speculator_config.py:122-125).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner import deepseek_v4
from kvwatch.planner.config_keys import positive_field
from kvwatch.planner.deepseek_v4 import CacheSpec, DeepseekV4Shape, Packing
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.values.versions import VllmVersion

ARCHITECTURES = frozenset({"DeepseekV41ForCausalLM"})
MODEL_TYPES = frozenset({"deepseek_v41", "deepseek_v41_text"})
CHECKED_MINORS = frozenset({(0, 34)})   # the release the oracle ran (tests/deepseek_v41_oracle.py)
SOURCE = "vLLM 0.34.0, vllm/models/deepseek_v41/attention.py:570-632, :1256-1359, compressor.py:238-266, " \
         "sparse_mla.py:116-117, vllm/platforms/interface.py:710-757"

BLOCK = 64            # the cache block size on SM 9.x (see above)
SWA_BLOCK = 32        # attention.py:622
ROW_BYTES = 584       # the SM 9.x record (attention.py:577)
RING_ROWS = 8         # max(8, 2 ** ceil(log2(0 + 2))) without speculative decoding (compressor.py:251-252)
DSPARK_LAYERS = 3     # nvidia/dspark.py:90-94, when config.json names none
QUANT_BLOCK = 128     # the indexer's FP8 key scale block (attention.py:189)
BACKEND = "FLASHMLA_SPARSE_DSV41"


@dataclass(frozen=True)
class DeepseekV41Shape:
    """What vLLM's DeepSeek-V4.1 layers read from config.json to build their caches."""

    ratios: tuple[int, ...]        # each decoder layer's compress ratio (0: sliding window only)
    kv_sources: frozenset[int]
    index_sources: frozenset[int]
    head_dim: int
    index_head_dim: int
    window: int
    dspark_layers: int = DSPARK_LAYERS   # the DSpark draft's layers, when it drafts
    dspark_block: int = 0                # the config's DSpark block (0: none), k when the command names none


def ring_rows(num_speculative_tokens: int) -> int:
    """A compressor ring's rows: drafts, bonus token and the previous row, a power of two >= 8
    (compressor.py:250-252)."""
    return max(RING_ROWS, 1 << (num_speculative_tokens + 2 - 1).bit_length())


AnyShape = DeepseekV4Shape | DeepseekV41Shape


def _ids(value: object, field: str) -> frozenset[int]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ConfigError(f"config.json: DeepSeek-V4.1 field {field!r} must list layer ids")
    return frozenset(value)


def deepseek_v41_shape(cfg: Mapping[str, Any], architectures: Sequence[str]) -> DeepseekV41Shape | None:
    """The shape of a DeepSeek-V4.1 (text) config.json; None for any other model."""
    model_type = cfg.get("model_type")
    if not (ARCHITECTURES & set(architectures) or (isinstance(model_type, str) and model_type in MODEL_TYPES)):
        return None
    layers = deepseek_v4._count(cfg.get("num_hidden_layers"), "num_hidden_layers")
    listed = cfg.get("compress_ratios")
    if not isinstance(listed, list):
        raise ConfigError("config.json: DeepSeek-V4.1 needs compress_ratios, one a layer")
    # MTP layers past the list are pure sliding window (attention.py:382-387)
    ratios = tuple(deepseek_v4._count(r, "compress_ratios") for r in listed[:layers]) + (0,) * (layers - len(listed))
    if bad := sorted({r for r in ratios if r not in (0, 1, 2)}):
        raise ConfigError(f"config.json: DeepSeek-V4.1 compress ratio {bad[0]}: vLLM takes 0, 1 or 2 "
                          f"(vllm/models/deepseek_v41/attention.py:388-392)")
    shape = DeepseekV41Shape(ratios, _ids(cfg.get("kv_source_layer_ids", []), "kv_source_layer_ids"),
                             _ids(cfg.get("index_source_layer_ids", []), "index_source_layer_ids"),
                             positive_field(cfg, "head_dim", 512, "DeepSeek-V4.1"),
                             positive_field(cfg, "index_head_dim", 128, "DeepSeek-V4.1"),
                             positive_field(cfg, "sliding_window", 128, "DeepSeek-V4.1"))
    drafts = [cfg.get(k) for k in ("n_mtp_layers", "num_nextn_predict_layers")]
    blocks = [cfg.get(k) for k in ("block_size", "dspark_block_size")]
    shape = replace(shape, dspark_layers=next((deepseek_v4._count(d, "n_mtp_layers") for d in drafts if d), DSPARK_LAYERS),
                    dspark_block=next((deepseek_v4._count(b, "dspark_block_size") for b in blocks if b is not None), 0))
    if any(ratios) and not (shape.kv_sources and shape.index_sources):   # attention.py:407-414
        raise ConfigError("config.json: DeepSeek-V4.1 needs kv_source_layer_ids and index_source_layer_ids "
                          "for its compressed layers")
    return shape


def _pad(size: int) -> int:
    return -(-size // deepseek_v4.PAGE_ALIGNMENT) * deepseek_v4.PAGE_ALIGNMENT


def layer_specs(shape: DeepseekV41Shape, dspark: int = 0) -> list[list[CacheSpec]]:
    """Per layer, its own caches in the order vLLM registers them: the compressed latent (the attention
    layer itself, attention.py:490-498), the index keys, the sliding window, the compressor ring; with a
    DSpark draft of `dspark` speculative tokens (0: none), its layers' sliding windows after the target's
    and the rings it widens."""
    out: list[list[CacheSpec]] = []
    rows = ring_rows(dspark)
    for layer, ratio in enumerate((*shape.ratios, *[0] * (shape.dspark_layers if dspark else 0))):
        source = layer in shape.kv_sources
        own: list[CacheSpec] = []
        if source:
            own.append(CacheSpec("latent", "mla", BLOCK, 0, _pad(BLOCK // max(ratio, 1) * ROW_BYTES), "uint8"))
            if layer in shape.index_sources:
                key = shape.index_head_dim + shape.index_head_dim // QUANT_BLOCK * 4
                own.append(CacheSpec("indexer", "mla", BLOCK, 0, _pad(BLOCK // max(ratio, 1) * key), "uint8"))
        own.append(CacheSpec("swa_cache", "swa_mla", SWA_BLOCK, shape.window, _pad(SWA_BLOCK * ROW_BYTES), "uint8"))
        if source and ratio > 1:
            own.append(CacheSpec("state", "ring", rows, 0, rows * 2 * shape.head_dim * 4, "float32"))
        out.append(own)
    return out


def groups_for(shape: DeepseekV41Shape, dspark: int = 0) -> list[deepseek_v4.Group]:
    """The KV cache groups of a DeepSeek-V4.1 model (SM 9.x scope), with a DSpark draft of `dspark` tokens."""
    return deepseek_v4.packed_groups([s for layer in layer_specs(shape, dspark) for s in layer])


def num_blocks(shape: DeepseekV41Shape, kv_memory_bytes: int, dspark: int = 0) -> int:
    """Blocks vLLM 0.34 allocates for DeepSeek-V4.1 in `kv_memory_bytes` of one rank (SM 9.x scope)."""
    return kv_memory_bytes // deepseek_v4.bytes_per_block(groups_for(shape, dspark))


def dspark_tokens(shape: DeepseekV41Shape, settings: EngineSettings) -> int:
    """The k a DSpark draft of this command runs with (0: it drafts with no DSpark, or k is unknown)."""
    if settings.speculative_method != "dspark":
        return 0
    return settings.num_speculative_tokens if settings.num_speculative_tokens > 0 else shape.dspark_block


def out_of_scope(version: VllmVersion | None, platform: str, sm: str, kv_cache_dtype: str | None,
                 attention_backend: str | None, speculative_method: str | None, block_size: int | None,
                 dspark: int = 0) -> tuple[str, ...]:
    """Why the plan of this command is unsure: each way it leaves the scope vLLM's code was checked in."""
    reasons = []
    if version is not None and version.parts[:2] not in CHECKED_MINORS:
        reasons.append(f"DeepSeek-V4.1's caches are checked against vLLM 0.34 only, not vLLM {version}")
    if platform != "cuda" or sm.split(".")[0] != "9":
        reasons.append(f"DeepSeek-V4.1 on {platform} SM {sm}: only CUDA SM 9.x is planned (SM 10.x takes "
                       f"528-byte records, a block-stride alignment and NVFP4 compressed rows)")
    if attention_backend not in (None, BACKEND, "FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV4"):   # nvidia/model.py:248-254
        reasons.append(f"DeepSeek-V4.1 with --attention-backend {attention_backend}: only FlashMLA sparse is planned")
    if (kv_cache_dtype or "auto") not in ("auto", "fp8", "fp8_ds_mla"):
        reasons.append(f"DeepSeek-V4.1 with --kv-cache-dtype {kv_cache_dtype}: only the fp8_ds_mla layout is planned")
    if speculative_method == "dspark" and not dspark:
        reasons.append("--speculative-config method 'dspark' without num_speculative_tokens, and config.json "
                       "names no DSpark block (vLLM takes k from it: dspark/config.py:77-85)")
    elif speculative_method and speculative_method != "dspark":
        reasons.append(f"--speculative-config method {speculative_method!r}: DeepSeek-V4.1's compressor rings "
                       f"and its draft's caches with speculative decoding are planned for DSpark only")
    if block_size is not None and block_size != BLOCK:
        reasons.append(f"DeepSeek-V4.1 with --block-size {block_size}: only the default block {BLOCK} is planned")
    return tuple(reasons)


def packing_for(shape: AnyShape, settings: EngineSettings, device: Device, version: VllmVersion | None) -> Packing:
    """The packing of a DeepSeek-V4 or V4.1 model under this command, with why its figures are unsure."""
    if isinstance(shape, DeepseekV4Shape):
        return deepseek_v4.packing(shape, settings.speculative_method, settings.num_speculative_tokens,
                                   device.platform, device.sm, version, settings.attention_backend)
    dspark = dspark_tokens(shape, settings)
    groups = tuple(groups_for(shape, dspark))
    unsure = out_of_scope(version, device.platform, device.sm, settings.kv_cache_dtype, settings.attention_backend,
                          settings.speculative_method, settings.block_size, dspark)
    return Packing(groups, deepseek_v4.bytes_per_block(groups), BACKEND if device.platform == "cuda" else None, unsure,
                   block_size=BLOCK, source=SOURCE, drafted=dspark > 0)
