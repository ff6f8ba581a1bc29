"""The rotary embedding's cos/sin cache vLLM builds with the model, and the buffers a model file
allocates beside its weights: both are on the GPU before the loader reports "Model loading took",
so they count with the weights (pure data and arithmetic, read from vLLM's code).

The cache: `get_rope` builds one RotaryEmbedding per distinct (head size, rotary dim, positions,
base, scaling, dtype) and every attention layer shares it (vLLM 0.13.0,
vllm/model_executor/layers/rotary_embedding/__init__.py:26-78, `_ROPE_DICT`). Its buffer is
`positions x rotary_dim` values (cos and sin halves), cast to the model dtype and registered on the
device (rotary_embedding/base.py:43-47; vLLM 0.8.5.post1 vllm/model_executor/layers/rotary_embedding.py:108-112,
vLLM 0.28.0 rotary_embedding/base.py:58-63), on every rank whole. How many positions depends on the
scaling type (CACHE_POSITIONS). A model whose layer types carry their own rope parameters (Gemma 3's
local and global layers) builds one cache per set.

The buffer: Qwen3-VL's language model keeps one zeroed (max_num_batched_tokens, text hidden size)
tensor per deepstack level in the model dtype, allocated in its __init__ (vLLM 0.11.2,
vllm/model_executor/models/qwen3_vl.py:1261-1269; the same in 0.13.0 :1308, 0.19.1 :1503, 0.28.0 :1824,
0.33.0 :2031)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kvwatch.errors import ConfigError
from kvwatch.vllm_releases.generated.config_class_defaults import LOCAL_ROPE, POSITION_DEFAULTS


class CachePositions(NamedTuple):
    """How many positions a scaling type's cache holds: `base` ("max": the max_position the model
    passes, config.max_position_embeddings; "original": rope_scaling's original_max_position_embeddings)
    times rope_scaling's factor when `times_factor`, times `multiple`."""

    base: str
    times_factor: bool
    multiple: int
    source: str


DEFAULT = CachePositions("max", False, 1, "rotary_embedding/base.py:69-73 (arange(max_position_embeddings))")
CACHE_POSITIONS: dict[str, CachePositions] = {
    # rope_type: positions, where vLLM 0.13.0 computes the cache (vllm/model_executor/layers/rotary_embedding/)
    "default": DEFAULT,
    "llama3": CachePositions("max", False, 1, "llama3_rope.py:11-30 (the base class's cache over max_position)"),
    "linear": CachePositions("max", True, 1, "linear_scaling_rope.py:89-91 (max_position_embeddings x factor)"),
    "dynamic": CachePositions("max", True, 1, "dynamic_ntk_scaling_rope.py:55-62 (max_position_embeddings x factor)"),
    "yarn": CachePositions("original", True, 1, "yarn_scaling_rope.py:77-78; __init__.py:197-234 passes the original"),
    "deepseek_yarn": CachePositions("original", True, 1, "deepseek_scaling_rope.py:95-98; __init__.py:238-261"),
    # M-RoPE: "We enlarge max_position_embeddings to 4 times" (mrope.py:236; vLLM 0.8.5.post1
    # rotary_embedding.py:946; 0.33.0 mrope.py:351 as positions_factor, 4 by default)
    "mrope": CachePositions("max", False, 4, "mrope.py:234-245 (cache_max_position_num = max_position_embeddings x 4)"),
}
# Model families whose position encoding is learned or ALiBi: vLLM builds no rotary cache for them
# (vLLM 0.22.1, vllm/model_executor/models/{gpt2,gpt_bigcode,opt,bloom,mpt,jais}.py call no get_rope).
NO_ROPE_MODEL_TYPES = frozenset({"gpt2", "gpt_bigcode", "opt", "bloom", "mpt", "jais"})
MAX_POSITION_FALLBACK = 8192   # models pass getattr(config, "max_position_embeddings", 8192) (models/llama.py)



def _model_type(cfg: Mapping[str, Any]) -> str | None:
    """config.json's model_type where it is a string (a hostile config may hold anything there)."""
    value = cfg.get("model_type")
    return value if isinstance(value, str) else None


def _positive(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0.0


def _rope_scaling(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in ("rope_scaling", "rope_parameters"):
        value = cfg.get(key)
        if isinstance(value, Mapping) and value:
            return value
    return {}


def cache_positions(cfg: Mapping[str, Any], multimodal_rope: bool = False) -> int:
    """The positions of the model's rotary cache (0 for a model without RoPE). `multimodal_rope`:
    the checkpoint is one whose vLLM model builds M-RoPE (a Qwen2/2.5/3-VL family whose config.json
    may omit rope_scaling's mrope_section, which transformers fills in)."""
    if _model_type(cfg) in NO_ROPE_MODEL_TYPES:
        return 0
    scaling = _rope_scaling(cfg)
    kind = str(scaling.get("rope_type", scaling.get("type", "default")))
    if "mrope_section" in scaling or kind == "mrope" or multimodal_rope:
        kind = "mrope"
    rule = CACHE_POSITIONS.get(kind, DEFAULT)
    # a file without the length: the class's default (the generated table), which vLLM's model passes
    maximum = (_positive(cfg.get("max_position_embeddings")) or POSITION_DEFAULTS.get(_model_type(cfg) or "")
               or MAX_POSITION_FALLBACK)
    base = _positive(scaling.get("original_max_position_embeddings")) if rule.base == "original" else 0.0
    positions = base or maximum
    if rule.times_factor:
        positions *= _positive(scaling.get("factor")) or 1.0
    return int(positions) * rule.multiple


def _whole(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def rotary_dim(cfg: Mapping[str, Any]) -> int:
    """The rotary width: MLA's rope part, a config's `rotary_dim`, else what `get_rope` reads from
    rope_parameters, its `rope_dim` or the head size times its partial_rotary_factor (vLLM 0.32.0,
    vllm/model_executor/layers/rotary_embedding/__init__.py:66-72), where transformers' standardize_rope_params
    moves a top-level partial_rotary_factor, rotary_pct or rotary_emb_fraction (transformers_utils/config.py:
    629-639). Transformers 5 configs (Qwen3.5/3.6) carry the factor inside rope_parameters only."""
    if isinstance(cfg.get("qk_rope_head_dim"), int) and cfg.get("kv_lora_rank"):
        return int(cfg["qk_rope_head_dim"])
    scaling = _rope_scaling(cfg)
    if dim := _whole(cfg.get("rotary_dim")) or _whole(scaling.get("rope_dim")):
        return dim
    hidden, heads = _positive(cfg.get("hidden_size")), _positive(cfg.get("num_attention_heads"))
    head_dim = _positive(cfg.get("head_dim")) or (hidden // heads if heads else 0.0)
    factor = (_positive(scaling.get("partial_rotary_factor")) or _positive(cfg.get("partial_rotary_factor"))
              or _positive(cfg.get("rotary_pct")) or _positive(cfg.get("rotary_emb_fraction")) or 1.0)
    if factor > 1.0:   # get_rope refuses it the same way (rotary_embedding/__init__.py:70-71)
        raise ConfigError(f"config.json: partial_rotary_factor={factor:g} must be between 0.0 and 1.0")
    return int(head_dim * factor)


def _per_layer_type(cfg: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(layer type, rope parameters) of a config whose sliding and full layers each have their own:
    transformers 5's rope_parameters per layer type ({"full_attention": {...}, "sliding_attention": {...}};
    vLLM 0.32.0 models/gemma3.py:157 `config.rope_parameters[layer_type]`), or an older file of such a
    class (generated LOCAL_ROPE, or one naming `rope_local_base_freq`), whose rope_scaling is the full
    layers' and whose sliding layers rotate unscaled at their own base; [] for one set."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and params and all(isinstance(v, Mapping) for v in params.values()):
        return [(str(k), v) for k, v in params.items() if v]
    if _model_type(cfg) in LOCAL_ROPE or cfg.get("rope_local_base_freq") is not None:
        # the two bases differ (the class's or the file's), which makes two caches even where both are unscaled
        return [("full_attention", {"rope_type": "default", **_rope_scaling(cfg), "base": "global"}),
                ("sliding_attention", {"rope_type": "default", "base": "local"})]
    return []


def rope_cache_elements(cfg: Mapping[str, Any], multimodal_rope: bool = False) -> int:
    """Values in the rotary cos/sin caches one rank holds (times the model dtype's bytes): one cache per
    distinct (positions, rotary dim, rope parameters), as get_rope's _ROPE_DICT keys them, so two for a model
    whose sliding and full layers differ in base or scaling (Gemma 3) and one where their sets are the same
    (OLMo 3); a full layer of Gemma 4 rotates its global head size."""
    sets = _per_layer_type(cfg)
    if not sets:
        return cache_positions(cfg, multimodal_rope) * rotary_dim(cfg)
    caches: dict[tuple[int, int, str], int] = {}
    for layer_type, params in sets:
        one = {**cfg, "rope_parameters": params, "rope_scaling": None}
        if layer_type == "full_attention" and _whole(cfg.get("global_head_dim")):
            one["head_dim"] = cfg["global_head_dim"]
        positions, dim = cache_positions(one, multimodal_rope), rotary_dim(one)
        caches[(positions, dim, repr(sorted(params.items(), key=str)))] = positions * dim
    return sum(caches.values())


# The multimodal families whose published configs carry rope_scaling.mrope_section, which makes
# get_rope build MRotaryEmbedding (vLLM 0.13.0, vllm/model_executor/layers/rotary_embedding/__init__.py:93,
# :213; vllm/transformers_utils/config.py:390-403 uses_mrope): a config.json copied without it still
# loads as M-RoPE.
MROPE_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})
# Qwen3-VL's deepstack buffers (see the module's docstring): from the release that added the model.
DEEPSTACK_BUFFER_MODEL_TYPES = frozenset({"qwen3_vl", "qwen3_vl_moe"})


def deepstack_levels(config: Mapping[str, Any]) -> int:
    """Deepstack levels whose (max_num_batched_tokens x text hidden) buffers the model allocates."""
    if _model_type(config) not in DEEPSTACK_BUFFER_MODEL_TYPES:
        return 0
    vision = config.get("vision_config")
    indexes = vision.get("deepstack_visual_indexes") if isinstance(vision, Mapping) else None
    return len(indexes) if isinstance(indexes, (list, tuple)) else 0
