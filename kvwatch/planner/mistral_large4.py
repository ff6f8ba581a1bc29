"""Mistral Large 4's config (read from its params.json) and caches, on one scope only (pure).

vLLM serves Mistral Large 4 only from a Mistral-format params.json with a `dsa` section
(vllm/transformers_utils/configs/mistral.py:33-41, read where the checkpoint has consolidated
*.safetensors: transformers_utils/config.py:936-943). `hf_config` reads such a file into the fields
vLLM's adapt_config_dict gives the model (tests/mistral_large4_oracle.py checks them against it);
kvwatch reads no other Mistral-format params.json.

The scope: vLLM 0.34 (0.33 does not register the model) on CUDA SM 9.0, a bf16 latent (the KV cache
`auto` with no `fp8_kv_cache` in the dsa section, or `--kv-cache-dtype bfloat16`, which vLLM turns back
to auto: model_executor/models/config.py:141-155), no `--block-size`, no speculative decoding but the
DSpark draft of a params.json whose `mtp` section has no `ragged_attention` (below), no
pipeline parallelism, no `--attention-backend`, the hybrid KV cache manager on, an `index_head_dim` of
128 and no sliding window. Anything else is unsure (`out_of_scope`), not planned; kvwatch reads no
context-parallel or KV-connector flag, so a command with one is planned as one without. Each rule cites
vLLM 0.34.0:

- a layer's KV source is `kv_sharing.source_layers_str` (else itself) and it runs its own indexer where
  the expanded `dsa.sharing` pattern says "full" (configs/mistral.py:392-445,
  models/mistral/common/layer_spec.py:27-52);
- a layer with an indexer registers its keys first: an MLAAttentionSpec of `index_head_dim +
  index_head_dim // 128 * 4` uint8 bytes, one head, TP-replicated (models/mistral/nvidia/indexer.py:63-71,
  :146-151), on DeepseekV32IndexerBackend (kernel block 64: v1/attention/backends/mla/indexer.py:237-238);
- a layer that owns its KV keeps an MLA latent of `kv_lora_rank + qk_rope_head_dim` bf16 a token, NoPE
  layers too (models/mistral/nvidia/attention.py:44-46, :151-166; MLAAttention.get_kv_cache_spec,
  model_executor/layers/attention/mla_attention.py:1567-1599); a KV-sharing layer registers none
  (v1/worker/gpu/attn_utils.py:145-147). Its sparse backend on SM 9.0 is FLASH_ATTN_MLA_SPARSE, the first
  for a latent other than 512 (platforms/cuda.py:137-152), which takes SM 9.x with FA3, a bf16 KV cache, a
  model with index_topk and no DCP (flashattn_mla_sparse.py:81-116); blocks a multiple of 64 tokens, whole
  latent rows apart
  (flashattn_mla_sparse.py:50-55, mla/sparse_utils.py:43-46);
- both backends take CacheConfig.DEFAULT_BLOCK_SIZE 64 (platforms/interface.py:731-734), neither lists a
  layout, so the first default one, LBNHC, holds (v1/attention/backends/utils.py:229-270): not
  block-outermost. Every spec is an MLA spec of block 64, so get_kv_cache_groups puts every layer in one
  group (UniformTypeKVCacheSpecs, v1/core/kv_cache_planning.py:1188-1192), a block is the sum of the
  layers' pages, each rounded up to its block-stride alignment (:620-632), and a budget holds
  `budget // block` blocks.

The DSpark draft (`--speculative-config` method dspark): vLLM reads it from the target's own params.json,
whose `mtp` section needs a `dspark` block (get_mistral_large_4_dspark_config,
transformers_utils/configs/mistral.py:477-545, reached for a Mistral Large 4 draft config by
config/speculative.py:822-830). Its `mtp.n_layers` decoder layers at layers.{n_layers + i}
(models/mistral/mistral_large4/nvidia/dspark.py:122-146, :283-287) are dense MLA (no indexer, no KV
sharing), non-causal, each registering one latent of the target's width in the `auto` dtype the DSpark
config sets (v1/worker/gpu/spec_decode/dspark/config.py:69-74): an MLAAttentionSpec of block 64 that joins
the one group. Their backend, FLASH_ATTN_MLA (CUDA SM 9.0's first dense MLA backend, platforms/cuda.py:146-154),
takes blocks in multiples of 16 (flashattn_mla.py:49-50), so block 64 holds and their pages need no
stride alignment. An `mtp.ragged_attention` window makes the draft layers sliding-window MLA, on a backend
and in groups not checked: out of scope.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.config_keys import positive_field
from kvwatch.planner.deepseek_v4 import Group, Packing
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineSettings
from kvwatch.planner.indexer import QUANT_BLOCK, SCALE_BYTES
from kvwatch.planner.one_scope import bf16_model, outside
from kvwatch.values.versions import VllmVersion

ARCHITECTURES = frozenset({"MistralLarge4ForCausalLM"})
MODEL_TYPE = "mistral_large_4"
SOURCE = "vLLM 0.34.0, vllm/models/mistral/nvidia/attention.py:130-168, nvidia/indexer.py:63-71, :146-151, " \
         "vllm/v1/core/kv_cache_planning.py:620-632, :1188-1192"
BACKEND = "FLASH_ATTN_MLA_SPARSE"   # platforms/cuda.py:137-152, SM 9.0's first sparse backend for a 576 latent
BLOCK_SIZE = 64           # CacheConfig.DEFAULT_BLOCK_SIZE (config/cache.py:185)
INDEX_HEAD_DIM = 128      # the only index_head_dim checked
KV_BYTES = 2              # bf16
CHECKED_MINOR = (0, 34)   # the release whose code the oracle ran (tests/mistral_large4_oracle.py)
DEFAULT_MAX_LEN = 128_000   # params.json and config.json without max_position_embeddings (config.py:1618)

# params.json key -> vLLM's (configs/mistral.py:161-169, :300-324, :353-363)
_GENERAL = {"dim": "hidden_size", "norm_eps": "rms_norm_eps", "n_kv_heads": "num_key_value_heads",
            "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size"}
_MOE = {"route_every_n": "moe_layer_freq", "first_k_dense_replace": "first_k_dense_replace",
        "num_experts_per_tok": "num_experts_per_tok", "num_experts": "n_routed_experts",
        "expert_hidden_dim": "moe_intermediate_size", "routed_scale": "routed_scaling_factor",
        "num_shared_experts": "n_shared_experts", "num_expert_groups": "n_group",
        "num_expert_groups_per_tok": "topk_group"}
_DSA = {"topk": "index_topk", "n_heads": "index_n_heads", "head_dim": "index_head_dim", "norm_eps": "indexer_norm_eps",
        "ssmax_scaling": "indexer_ssmax_scaling", "sharing": "index_sharing", "nope": "index_nope",
        "rope_head_dim": "index_rope_head_dim"}
# params.json sections and keys adapt_config_dict consumes (renames or drops)
_CONSUMED = frozenset({"moe", "dsa", "kv_sharing", "nope", "mtp", "yarn", "quantization", "activation", "tied_embeddings"})
_YARN = {"factor": ("factor", float), "original_max_position_embeddings": ("original_max_position_embeddings", int),
         "beta": ("beta_fast", float), "alpha": ("beta_slow", float)}


def is_large4_params(params: Mapping[str, Any]) -> bool:
    """A Mistral-format params.json vLLM serves as MistralLarge4ForCausalLM: one with a `dsa` section."""
    return bool(params.get("dsa")) and params.get("model_type") != "mamba"


def _section(params: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A params.json section: an object, or {} where it is absent; anything else is a ConfigError."""
    value = params.get(name) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"params.json: {name} must be an object")
    return value


def _pattern(value: Any, layers: int, what: str) -> list[str]:
    """A comma-separated per-layer pattern, repeated to `layers` (configs/mistral.py:353-355)."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"params.json: {what} must be a comma-separated pattern")
    items = value.split(",")
    return (items * math.ceil(layers / len(items)))[:layers]


def hf_config(params: Mapping[str, Any], hf_max_len: int | None = None) -> dict[str, Any]:
    """The fields vLLM's adapt_config_dict gives a Mistral Large 4 params.json (configs/mistral.py:14-101,
    :160-184, :300-324, :380-445); what vLLM asserts is a ConfigError. `hf_max_len`: the
    max_position_embeddings of a config.json beside it, which vLLM takes where params.json names none
    (else 128,000: transformers_utils/config.py:516-522, :1617-1637)."""
    moe, sharing = _section(params, "moe"), _section(params, "kv_sharing")
    shared = moe.get("num_shared_experts")
    if not (params.get("qk_nope_head_dim") and isinstance(shared, int) and shared > 0):
        raise ConfigError("params.json: a dsa section needs MLA (qk_nope_head_dim) and MoE with shared experts "
                          "(vLLM asserts it: configs/mistral.py:35)")
    cfg: dict[str, Any] = {_GENERAL.get(k, k): v for k, v in params.items() if k not in _CONSUMED}
    max_len = params.get("max_position_embeddings")
    max_len = (hf_max_len or DEFAULT_MAX_LEN) if max_len is None else max_len
    cfg.update({"model_type": MODEL_TYPE, "architectures": ["MistralLarge4ForCausalLM"],
                "hidden_act": params.get("activation", "silu"), "tie_word_embeddings": params.get("tied_embeddings", False),
                "max_position_embeddings": max_len, "max_seq_len": params.get("max_seq_len", max_len),
                "dtype": params.get("dtype")})
    cfg.update({new: moe[old] for old, new in _MOE.items() if old in moe})
    if quantization := params.get("quantization"):
        cfg["quantization_config"] = _quantization(quantization)
    layers = positive_field(cfg, "num_hidden_layers", None, "Mistral Large 4")
    nope = params.get("nope")
    cfg["nope_layer_flags"] = [v == "nope" for v in _pattern(nope, layers, "nope")] if nope else [False] * layers
    source = sharing.get("source_layers_str")
    try:
        sources = [int(v) for v in source.split(",")] if source else list(range(layers))
    except (ValueError, AttributeError):
        raise ConfigError("params.json: kv_sharing.source_layers_str must list layer numbers") from None
    nope_flags = cfg["nope_layer_flags"]
    if len(sources) != layers or any(not 0 <= s <= i or sources[s] != s or nope_flags[i] != nope_flags[s]
                                     for i, s in enumerate(sources)):
        raise ConfigError("params.json: each layer must share KV with an earlier, non-sharing layer of its own "
                          "RoPE or NoPE kind, one source a layer (vLLM asserts it: configs/mistral.py:402-410)")
    cfg["kv_source_layers"] = sources
    dsa = {_DSA.get(k, k): v for k, v in _section(params, "dsa").items()}   # either spelling (configs/mistral.py:358-377)
    if dsa.get("index_nope") or not dsa.get("fp8_indexer", True) \
            or dsa.get("index_rope_head_dim", dsa.get("rope_head_dim")) not in (None, -1, params.get("qk_rope_head_dim")):
        raise ConfigError("params.json: vLLM asserts an FP8 indexer with the model's RoPE dims "
                          "(configs/mistral.py:422-432)")
    for key in ("index_topk", "index_n_heads", "index_head_dim", "indexer_norm_eps", "indexer_ssmax_scaling"):
        if key not in dsa:
            raise ConfigError(f"params.json: dsa section without {key} (vLLM requires it: configs/mistral.py:413-421)")
        cfg[key] = dsa[key]
    cfg["fp8_kv_cache"] = dsa.get("fp8_kv_cache", False)
    index_sharing = dsa.get("index_sharing")
    cfg["index_sharing"] = _pattern(index_sharing, layers, "dsa.sharing") if index_sharing else ["full"] * layers
    if not set(cfg["index_sharing"]) <= {"full", "shared"} or cfg["index_sharing"][0] != "full":
        raise ConfigError("params.json: dsa.sharing must be full or shared a layer, the first full "
                          "(vLLM asserts it: configs/mistral.py:442-443)")
    if params.get("mtp") is not None:
        cfg["mtp_config"] = params["mtp"]
    if isinstance(yarn := params.get("yarn"), Mapping) and yarn:
        rope: dict[str, Any] = {"rope_type": "yarn", "mscale_all_dim": 1}
        if params.get("rope_theta"):
            rope["rope_theta"] = params["rope_theta"]
        rope.update({new: cast(yarn[old]) for old, (new, cast) in _YARN.items() if old in yarn})
        if not yarn.get("apply_scale", True):
            rope["attention_factor"] = 1.0
        cfg["rope_parameters"] = rope
        cfg.pop("rope_theta", None)
    return cfg


def _quantization(quantization: Mapping[str, Any]) -> dict[str, Any]:
    """params.json's quantization as vLLM's quantization_config (configs/mistral.py:208-242)."""
    if quantization.get("qformat_weight") == "fp8_e4m3":
        act, weight = quantization.get("qscheme_act"), quantization.get("qscheme_weight")
        out: dict[str, Any] = {"quant_method": "fp8",
                               "activation_scheme": "dynamic" if act in ("NO_SCALES", "BLOCK") else "static"}
        if weight == "BLOCK":
            out["weight_block_size"] = [quantization.get("block_size_out"), quantization.get("block_size_in")]
        return out
    if str(quantization.get("quant_method", "")).lower().replace("_", "-") == "compressed-tensors":
        return {**quantization, "quant_method": "compressed-tensors"}
    raise ConfigError(f"params.json: unknown quantization {str(dict(quantization))[:80]} (vLLM refuses it)")


@dataclass(frozen=True)
class Large4Shape:
    """What vLLM's Mistral Large 4 layers read from the config to build their caches."""

    owns_kv: tuple[bool, ...]   # per layer: keeps its own latent (its KV source is itself)
    indexer: tuple[bool, ...]   # per layer: runs its own indexer
    latent: int                 # kv_lora_rank + qk_rope_head_dim
    index_key: int              # an indexer key's bytes
    heads: int                  # num_attention_heads (TP must divide them)
    fp8_kv_cache: bool          # the dsa section's default latent dtype
    config_reasons: str
    dspark_layers: int = 0      # mtp.n_layers where params.json's mtp section has a dspark block (0: none or unread)
    dspark_window: bool = False   # that section names a ragged_attention window (sliding draft layers)


def large4_shape(cfg: Mapping[str, Any], architectures: Sequence[str]) -> Large4Shape | None:
    """The shape of a Mistral Large 4 config (as `hf_config` reads it); None for any other model."""
    if not (ARCHITECTURES & set(architectures) or cfg.get("model_type") == MODEL_TYPE):
        return None
    layers = positive_field(cfg, "num_hidden_layers", None, "Mistral Large 4")
    sources, sharing = cfg.get("kv_source_layers"), cfg.get("index_sharing")
    if not (isinstance(sources, list) and isinstance(sharing, list) and len(sources) == len(sharing) == layers):
        raise ConfigError("config: Mistral Large 4 needs kv_source_layers and index_sharing for every layer "
                          "(as vLLM reads them from params.json)")
    index_dim = positive_field(cfg, "index_head_dim", None, "Mistral Large 4")
    latent = positive_field(cfg, "kv_lora_rank", None, "Mistral Large 4") + \
        positive_field(cfg, "qk_rope_head_dim", None, "Mistral Large 4")
    sparse = cfg.get("index_topk") is not None
    mtp = cfg.get("mtp_config")
    mtp = mtp if isinstance(mtp, Mapping) else {}
    dspark = isinstance(mtp.get("dspark"), Mapping)
    n_layers = mtp.get("n_layers")   # read only when the command drafts with DSpark (configs/mistral.py:509)
    dspark_layers = n_layers if dspark and isinstance(n_layers, int) and not isinstance(n_layers, bool) \
        and 0 < n_layers <= 1024 else 0
    reasons = [why for hit, why in (
        (not sparse, "no index_topk (not sparse)"),
        (index_dim != INDEX_HEAD_DIM, f"index_head_dim {index_dim} (only {INDEX_HEAD_DIM} is checked)"),
        (cfg.get("q_lora_rank") is not None, "a q_lora_rank (vLLM asserts none: attention.py:72)"),
        (cfg.get("sliding_window") is not None, "a sliding window"),
    ) if hit]
    return Large4Shape(tuple(s == i for i, s in enumerate(sources)), tuple(sparse and x == "full" for x in sharing),
                       latent, index_dim + index_dim // QUANT_BLOCK * SCALE_BYTES,
                       positive_field(cfg, "num_attention_heads", None, "Mistral Large 4"),
                       bool(cfg.get("fp8_kv_cache")), "; ".join(reasons), dspark_layers,
                       dspark and bool(mtp.get("ragged_attention")))


def layer_pages(shape: Large4Shape, dspark: bool = False) -> list[tuple[str, int, int]]:
    """Each cache's name, page and block-stride alignment in bytes, in vLLM's registration order, with the
    DSpark draft's latents last where it drafts."""
    pages: list[tuple[str, int, int]] = []
    for owns, indexer in zip(shape.owns_kv, shape.indexer, strict=True):
        if indexer:   # its kernel block is the block itself: no stride alignment (v1/worker/utils.py:469-479)
            pages.append(("indexer.k_cache", BLOCK_SIZE * shape.index_key, 1))
        if owns:
            pages.append(("attn", BLOCK_SIZE * shape.latent * KV_BYTES, shape.latent * KV_BYTES))
    # FLASH_ATTN_MLA's kernel blocks are multiples of 16, not fixed sizes: no stride alignment
    pages += [("attn", BLOCK_SIZE * shape.latent * KV_BYTES, 1)] * (shape.dspark_layers if dspark else 0)
    return pages


def group(shape: Large4Shape, dspark: bool = False) -> Group:
    """The one group of every cache, each page rounded up to its block-stride alignment (layer-outer)."""
    return Group("mla", BLOCK_SIZE, 0, tuple(-(-page // align) * align for _, page, align in layer_pages(shape, dspark)))


def speculative_reason(shape: Large4Shape, settings: EngineSettings) -> str:
    """Why this command's speculative decoding is not planned ("" where it drafts with a planned DSpark, or not
    at all)."""
    if settings.speculative_method == "dspark":
        if not shape.dspark_layers:
            return ("--speculative-config method dspark with no mtp.dspark section in params.json (vLLM refuses it: "
                    "transformers_utils/configs/mistral.py:493-498), or no positive mtp.n_layers")
        return "a DSpark draft with mtp.ragged_attention (sliding-window draft layers)" if shape.dspark_window else ""
    if settings.num_speculative_tokens > 0 or settings.speculative_config:
        return f"speculative decoding with method {settings.speculative_method!r} (only DSpark's draft is checked)"
    return ""


def out_of_scope(shape: Large4Shape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> str:
    """Why this command lies outside the one scope planned here; "" when it lies inside."""
    bf16_latent = settings.kv_cache_dtype == "bfloat16" or (settings.kv_cache_dtype == "auto" and not shape.fp8_kv_cache)
    tp = max(1, settings.tensor_parallel_size)
    return outside(settings, device, version, checked=(CHECKED_MINOR,), config_reasons=shape.config_reasons,
                   dtype=(not (bf16_latent and bf16_model(settings, config_dtype)),
                          "a model or latent other than bf16 (the dsa section's fp8_kv_cache makes it fp8_ds_mla)"),
                   draft=speculative_reason(shape, settings), backend=None,
                   own=[(shape.heads % tp != 0, f"TP {tp} not dividing the attention heads (vLLM asserts it: attention.py:71)")])


def plan_packing(shape: Large4Shape, settings: EngineSettings, device: Device, version: VllmVersion | None,
                 config_dtype: str | None) -> Packing:
    """The one group make_plan reports for this command: unsure, with its reason, outside the scope."""
    scope = out_of_scope(shape, settings, device, version, config_dtype)
    kv = group(shape, settings.speculative_method == "dspark")
    unsure = (f"Mistral Large 4 outside the one scope kvwatch checked against vLLM's own code "
              f"(CUDA SM 9.0, bf16, defaults): {scope}",) if scope else ()
    return Packing((kv,), kv.page_bytes, BACKEND if device.platform == "cuda" else None, unsure,
                   attention="mistral_large4", block_size=BLOCK_SIZE, source=SOURCE, dtype_bytes=KV_BYTES)


# The layer class whose cache this module plans (architecture_kinds), and the architectures building it with
# caches this module does not plan (none: the DSpark draft, MistralLarge4DSparkModel, is planned here with its
# target and has planner/draft_heads.py's verdict).
LARGE4_KINDS: dict[str, str] = {"MistralIndexerCache": "Mistral Large 4 indexer keys (planner/mistral_large4.py)"}
LARGE4_NOT_PLANNED: dict[str, str] = {}
