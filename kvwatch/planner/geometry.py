"""Model geometry from a Hugging Face config.json: what the KV cache of one token costs.

Mirrors vLLM's ModelArchConfigConvertor (transformers_utils/model_arch_config_convertor.py):
the same attribute fallbacks for kv heads and head size, the same MLA model-type list.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.bailing_linear import bailing_linear_layout
from kvwatch.planner.config_defaults import HEAD_DIM_DEFAULTS, QK_HEAD_CACHE
from kvwatch.planner.config_keys import MAX_FIELD, MAX_LEN_KEYS, own_key, standard_keys
from kvwatch.planner.cross_attention import with_cross_attention
from kvwatch.planner.deepseek_v4 import DeepseekV4Shape, deepseek_v4_shape, weight_quantization
from kvwatch.planner.deepseek_v41 import DeepseekV41Shape, deepseek_v41_shape
from kvwatch.planner.dots3_note import Dots3Shape, dots3_shape
from kvwatch.planner.glm5_next import Glm5NextShape, glm5_next_shape
from kvwatch.planner.indexer import indexer_bytes_per_token
from kvwatch.planner.inkling import inkling_layout, is_inkling
from kvwatch.planner.layer_pattern import PatternError, pattern_error
from kvwatch.planner.layers import FULL, PURE_STATE_SPACE, LayerLayout, kimi_linear_layout, layer_layout
from kvwatch.planner.minimax_sparse import SparseIndexer, sparse_indexer
from kvwatch.planner.mistral_large4 import Large4Shape, large4_shape
from kvwatch.planner.mtp_draft import MtpDraft, mtp_draft
from kvwatch.planner.packed_draft import packed_draft_weights
from kvwatch.planner.prefix_lm import prefix_lm_layers, weight_layers
from kvwatch.planner.qwen4_exp import Qwen4ExpShape, qwen4_exp_shape
from kvwatch.planner.static_sink import sink_attention
from kvwatch.planner.step5_sparse import Step5Shape, step5_shape
from kvwatch.planner.voxtral import causal_encoder
from kvwatch.planner.weights import WeightCount, count_model_weights
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import resolve
from kvwatch.vllm_releases.max_len_rules import MAX_LEN_RULES, MaxLenRules

# vLLM's is_deepseek_mla list (0.32): these model types store one MLA latent per token.
MLA_MODEL_TYPES = frozenset({
    "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41",
    "dots3_note", "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa",
    "glm4_moe_lite", "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "mistral_large_4",
    "pangu_ultra_moe", "pangu_ultra_moe_mtp", "bailing_hybrid", "bailing_hybrid_mtp",
    "bailing_hybrid_v3_mtp", "hy_v4", "hy_v4_mtp",
})
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
                 "num_attention_groups")
_MAX_LEN_KEYS = MAX_LEN_KEYS   # planner/config_keys.py
_ASSUMED_MAX_LEN = 2048   # vLLM's assumption when config.json names no length
_DTYPE_NAMES = {"float16": "float16", "half": "float16", "bfloat16": "bfloat16",
                "float32": "float32", "float": "float32"}


@dataclass(frozen=True)
class ModelGeometry:
    model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    attention: str                 # "full" or "mla"
    num_kv_heads: int              # total, before tensor parallelism (1 for MLA)
    head_size: int                 # per K (or per latent for MLA)
    head_size_v: int               # 0 for MLA: no separate V
    config_dtype: str | None       # as config.json says, normalised; None when absent
    sliding_window: int | None     # the window (or attention chunk) of the layers that have one
    layer_kinds: tuple[str, ...]   # per cache layer: "full", "sliding", "chunked" or "mamba"
    max_position_embeddings: int | None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    num_attention_heads: int | None = None
    hidden_size: int | None = None
    weight_count: WeightCount | None = None   # parameters by kind, for the GPU memory estimate
    quantization: Mapping[str, Any] | None = None   # config.json's quantization_config
    derived_max_model_len: int | None = None   # the longest max_model_len vLLM accepts (None: unknown)
    derived_max_model_len_key: str | None = None
    layout: LayerLayout = None  # type: ignore[assignment]  # filled from layer_kinds when not given
    sparse_attention: bool = False   # MLA with the DeepSeek-V3.2 indexer (index_topk in config.json)
    indexer_bytes_per_token: int = 0   # that indexer's cache, every layer, one token (planner/indexer.py)
    # MiniMax-M3's sparse layers, each with a key-only indexer cache in the blocks (planner/minimax_sparse.py)
    sparse_indexer: SparseIndexer | None = None
    # DeepSeek-V4's compressed, sliding and indexer caches, packed by their own rule (planner/deepseek_v4.py)
    deepseek_v4: DeepseekV4Shape | DeepseekV41Shape | None = None   # V4.1's: planner/deepseek_v41.py
    step5: Step5Shape | None = None   # Step5's sliding, DSA, summary and tail-ring caches (planner/step5_sparse.py)
    glm5_next: Glm5NextShape | None = None   # GLM-5-Next's KDA, MLA, indexer and tail-ring caches (planner/glm5_next.py)
    qwen4_exp: Qwen4ExpShape | None = None   # Qwen4-Exp's GDN, PLE and QSA caches (planner/qwen4_exp.py)
    dots3_note: Dots3Shape | None = None   # Dots3's sliding and padded DSA latents, indexer keys (planner/dots3_note.py)
    mistral_large4: Large4Shape | None = None   # Mistral Large 4's latents and indexer keys (planner/mistral_large4.py)
    # vLLM's max_model_len when none is given (or auto) where it is not the derived one: LongRoPE
    # models default to original_max_position_embeddings (config/model.py _get_and_verify_max_len).
    default_len: int | None = None
    # The (text) config.json's fields that are set: some layer kinds vLLM builds only when one is.
    present_fields: frozenset[str] = frozenset()
    sink_len: int = 0   # openPangu's static sink tokens per layer (planner/static_sink.py; 0: none)
    # An encoder-decoder model's encoder length (Whisper: max_source_positions; planner/cross_attention.py)
    max_source_positions: int = 0
    # The checkpoint's MTP head, planned where --speculative-config drafts with it (planner/mtp_draft.py)
    mtp_draft: MtpDraft | None = None
    # Step5's, GLM-5-Next's or Qwen4-Exp's MTP head, loaded where their planner plans it (planner/packed_draft.py)
    packed_draft: WeightCount | None = None
    # What transformers' config class raises loading this config.json (planner/layer_pattern.py; None: loads)
    config_class_error: PatternError | None = None

    def __post_init__(self) -> None:
        if self.layout is None:   # a geometry written by hand: its kinds and window are the layout
            object.__setattr__(self, "layout", LayerLayout(tuple(self.layer_kinds), self.sliding_window))

    @property
    def default_max_model_len(self) -> int:
        """vLLM's max_model_len when none is given (and the ceiling of --max-model-len auto): LongRoPE's
        original length, else the derived one, else its assumed 2048."""
        return self.default_len or self.derived_max_model_len or _ASSUMED_MAX_LEN

    @property
    def is_hybrid(self) -> bool:
        return len(set(self.layer_kinds)) > 1


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's fields under text_config."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" in text:
        return text
    return config


# Far above any real model, far below what would exhaust memory or overflow the arithmetic.


def _required_int(cfg: Mapping[str, Any], key: str) -> int:
    value = _positive_int(cfg, key)
    assert value is not None   # _positive_int raises for a missing required field
    return value


def _positive_int(cfg: Mapping[str, Any], key: str, required: bool = True) -> int | None:
    value = cfg.get(key)
    if value is None:
        if required:
            own = own_key(cfg, key)   # the family's own name for it (planner/config_keys.py)
            raise ConfigError(f"config.json: missing field {own}" if own else f"config.json: missing field {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.json: field {key!r} must be a positive integer, got {str(value)[:40]!r}")
    if value > MAX_FIELD:
        raise ConfigError(f"config.json: field {key!r} = {value} is not a model's (at most {MAX_FIELD})")
    return value


def _int(cfg: Mapping[str, Any], *keys: str) -> int:
    return next((cfg[k] for k in keys if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)), 0)


def _quantization(config: Mapping[str, Any], text: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """quantization_config: the text model's, else the top level's (multimodal checkpoints)."""
    for source in (text, config):
        value = source.get("quantization_config")
        if isinstance(value, Mapping):
            return value
    return None


def _rope_parameter_sets(cfg: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """RoPE parameters as transformers normalises them: rope_parameters (maybe one per layer type),
    else the legacy rope_scaling; the legacy `type` key read as `rope_type`."""
    params = cfg.get("rope_parameters")
    if not isinstance(params, Mapping) or not params:
        params = cfg.get("rope_scaling")
    if not isinstance(params, Mapping) or not params:
        return []
    nested = [p for p in params.values() if isinstance(p, Mapping) and p]
    return nested if nested and len(nested) == len(params) else [params]


def max_len_rules(release: str | None) -> MaxLenRules:
    """How vLLM `release` (planned as the known release vllm_releases.resolve gives; None: the
    default release) derives max_model_len."""
    if release in MAX_LEN_RULES:
        return MAX_LEN_RULES[release]
    return MAX_LEN_RULES[str(resolve(parse_version(release) if release else None).used)]


def derive_max_model_len(cfg: Mapping[str, Any], model_type: str,
                         rules: MaxLenRules | None = None) -> tuple[int | None, str | None]:
    """The longest max_model_len vLLM accepts for this config.json, and the key it comes from
    (transformers_utils/model_arch_config_convertor.py derive_max_model_len_and_key, then
    config/model.py _get_and_verify_max_len): the smallest of the length keys, model_max_length
    when present, times the RoPE scaling factor of types that do not include it already (per
    release: vllm_releases/max_len_rules.py; before 0.30 a yarn length is its
    original_max_position_embeddings times the factor)."""
    rules = rules or max_len_rules(None)
    derived: float | None = None
    key: str | None = None
    for name in _MAX_LEN_KEYS:
        value = cfg.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            if derived is None or value < derived:
                derived, key = float(value), name
    model_max_length = cfg.get("model_max_length")
    if isinstance(model_max_length, (int, float)) and not isinstance(model_max_length, bool) and model_max_length > 0:
        derived, key = float(model_max_length), "model_max_length"
    if derived is None:
        return None, None
    rope = _rope_parameter_sets(cfg)
    if rope and "gemma3" not in model_type:
        factor: float = 1.0
        for p in rope:
            rope_type = p.get("rope_type", p.get("type", "default"))
            if rope_type == "su":
                rope_type = "longrope"
            if rope_type not in rules.prescaled_rope_types:
                raw = p.get("factor", factor)
                factor = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 1.0
                original = p.get("original_max_position_embeddings")
                if (rope_type == "yarn" and rules.yarn_from_original_source and isinstance(original, int)
                        and not isinstance(original, bool) and original > 0):
                    derived = float(original)
        derived *= factor
    if not 0 < derived < 2**62:
        return None, None
    return int(derived), key


def longrope_default_len(cfg: Mapping[str, Any], rules: MaxLenRules | None = None) -> int | None:
    """For LongRoPE, vLLM defaults max_model_len to original_max_position_embeddings "to avoid
    performance degradation for shorter sequences" (from 0.11: MaxLenRules.longrope_default_source)."""
    if not (rules or max_len_rules(None)).longrope_default_source:
        return None
    types = {t for p in _rope_parameter_sets(cfg) if isinstance(t := p.get("rope_type", p.get("type")), str)}
    if not types & {"longrope", "su"}:
        return None
    original = cfg.get("original_max_position_embeddings")
    for p in _rope_parameter_sets(cfg):
        original = p.get("original_max_position_embeddings", original)
    return original if isinstance(original, int) and not isinstance(original, bool) and original > 0 else None


def geometry_from_config(config: Mapping[str, Any], release: str | None = None) -> ModelGeometry:
    """Turn a config.json dict into a ModelGeometry as the known vLLM `release` reads it (None: the
    default release), or raise ConfigError naming the field."""
    rules = max_len_rules(release)
    if not isinstance(config, Mapping):
        raise ConfigError("config.json: expected a JSON object")
    cfg = standard_keys(_text_config(config))   # GPT-2's n_embd as hidden_size, ... (planner/config_keys.py)
    model_type = cfg.get("model_type") or config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError("config.json: missing field 'model_type'")
    architectures = config.get("architectures") or ()
    if not isinstance(architectures, (list, tuple)) or not all(isinstance(a, str) for a in architectures):
        raise ConfigError(f"config.json: field 'architectures' must be a list of names, got {str(architectures)[:40]!r}")
    architectures = tuple(architectures)
    num_layers = _required_int(cfg, "num_hidden_layers")
    if model_type in PURE_STATE_SPACE:   # Mamba / Mamba2 / Falcon-Mamba: no attention, a state per layer
        return _state_space_geometry(config, cfg, model_type, architectures, num_layers, rules)
    num_heads = _required_int(cfg, "num_attention_heads")
    hidden = _positive_int(cfg, "hidden_size", required=False)
    raw_dtype = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    config_dtype = _DTYPE_NAMES.get(str(raw_dtype)) if raw_dtype else None
    max_len = next((cfg[k] for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), int)), None)
    derived, derived_key = derive_max_model_len(cfg, model_type, rules)

    if model_type in MLA_MODEL_TYPES and cfg.get("kv_lora_rank") is not None:
        rank = _required_int(cfg, "kv_lora_rank")
        glm5_next = glm5_next_shape(cfg, architectures, config.get("model_type"))   # a NoPE latent: qk_rope_head_dim 0 (planner/glm5_next.py)
        rope = 0 if glm5_next is not None and cfg.get("qk_rope_head_dim") == 0 else _required_int(cfg, "qk_rope_head_dim")
        mla_layout = kimi_linear_layout(cfg, num_layers) or bailing_linear_layout(cfg, architectures, num_layers) \
            or LayerLayout((FULL,) * num_layers)
        return ModelGeometry(
            model_type=model_type, architectures=architectures, num_layers=num_layers,
            attention="mla", num_kv_heads=1, head_size=rank + rope, head_size_v=0,
            config_dtype=config_dtype, sliding_window=None, layer_kinds=mla_layout.kinds, layout=mla_layout,
            max_position_embeddings=max_len, kv_lora_rank=rank, qk_rope_head_dim=rope,
            num_attention_heads=num_heads, hidden_size=hidden, weight_count=count_model_weights(config, cfg), quantization=_quantization(config, cfg),
            derived_max_model_len=derived, derived_max_model_len_key=derived_key,
            sparse_attention="index_topk" in cfg, indexer_bytes_per_token=indexer_bytes_per_token(cfg),
            present_fields=_present(cfg), mtp_draft=mtp_draft(cfg, model_type),
            glm5_next=glm5_next, dots3_note=(dots3 := dots3_shape(cfg, architectures)),
            packed_draft=packed_draft_weights(cfg, glm5_next or dots3),
            mistral_large4=large4_shape(cfg, architectures))

    kv_heads = next((cfg[k] for k in _KV_HEAD_KEYS if cfg.get(k) is not None), num_heads)
    if (prefix_lm := prefix_lm_layers(cfg, architectures)) is not None:   # HRM-Text (planner/prefix_lm.py)
        num_layers, kv_heads = prefix_lm
    if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or not 0 < kv_heads <= MAX_FIELD:
        raise ConfigError(f"config.json: the number of KV heads must be a positive integer, got {str(kv_heads)[:40]!r}")
    head_size = cfg.get("head_dim") or cfg.get("hidden_size_per_head") or HEAD_DIM_DEFAULTS.get(model_type)
    if (qk := QK_HEAD_CACHE.get(model_type)) is not None:   # cached heads as wide as q and k (planner/config_defaults.py)
        head_size = (_positive_int(cfg, "qk_nope_head_dim", required=False) or qk[0]) \
            + (_positive_int(cfg, "qk_rope_head_dim", required=False) or qk[1])
    if head_size is None:
        if hidden is None:
            raise ConfigError("config.json: missing field 'head_dim' (or 'hidden_size' to derive it)")
        head_size = hidden // num_heads
    if isinstance(head_size, bool) or not isinstance(head_size, int) or not 0 < head_size <= MAX_FIELD:
        raise ConfigError(f"config.json: field 'head_dim' must be a positive integer, got {str(head_size)[:40]!r}")
    layout = inkling_layout(cfg, num_layers) if is_inkling(model_type) \
        else with_cross_attention(layer_layout(cfg, model_type, num_layers, head_size, kv_heads), model_type)
    if (encoder := causal_encoder(config)) is not None:   # Voxtral Realtime's audio encoder (planner/voxtral.py)
        layout = replace(layout, causal_encoder=encoder)
    head_size_v = head_size
    # HRM-Text's weights are two stacks, run at every recurrence step (planner/prefix_lm.py)
    weighed = cfg if (stacks := weight_layers(cfg, architectures)) is None else {**cfg, "num_hidden_layers": stacks}
    sink = sink_attention(cfg, architectures)
    if sink is not None:   # openPangu's sink attention: K and V heads differ, no window (planner/static_sink.py)
        head_size, head_size_v, layout = sink.head_size, sink.head_size_v, LayerLayout((FULL,) * num_layers)
    return ModelGeometry(
        model_type=model_type, architectures=architectures, num_layers=num_layers,
        attention="full", num_kv_heads=kv_heads, head_size=head_size, head_size_v=head_size_v,
        config_dtype=config_dtype, sliding_window=layout.window, layer_kinds=layout.kinds, layout=layout,
        max_position_embeddings=max_len, num_attention_heads=num_heads, hidden_size=hidden,
        weight_count=count_model_weights(config, weighed),
        quantization=weight_quantization(_quantization(config, cfg), cfg, architectures), derived_max_model_len=derived,
        derived_max_model_len_key=derived_key, default_len=longrope_default_len(cfg, rules), present_fields=_present(cfg),
        sparse_indexer=sparse_indexer(cfg, architectures, num_layers, parse_version(release) if release else None),
        sink_len=sink.sink_len if sink is not None else 0,
        max_source_positions=_positive_int(cfg, "max_source_positions", required=False) or 0,
        deepseek_v4=(v4 := deepseek_v4_shape(cfg, architectures) or deepseek_v41_shape(cfg, architectures)),
        mtp_draft=mtp_draft(cfg, model_type), step5=(step5 := step5_shape(cfg, architectures)),
        qwen4_exp=(qwen4 := qwen4_exp_shape(cfg, architectures)),
        packed_draft=packed_draft_weights(cfg, step5 or qwen4 or v4),
        config_class_error=pattern_error(cfg, model_type))


def _state_space_geometry(config: Mapping[str, Any], cfg: Mapping[str, Any], model_type: str,
                          architectures: tuple[str, ...], num_layers: int, rules: MaxLenRules) -> ModelGeometry:
    """A pure state-space model: no attention head, every layer one recurrent state per sequence."""
    raw_dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    derived, derived_key = derive_max_model_len(cfg, model_type, rules)
    layout = layer_layout(cfg, model_type, num_layers)
    return ModelGeometry(
        model_type=model_type, architectures=architectures, num_layers=num_layers, attention="none",
        num_kv_heads=0, head_size=0, head_size_v=0,
        config_dtype=_DTYPE_NAMES.get(str(raw_dtype)) if raw_dtype else None, sliding_window=None,
        layer_kinds=layout.kinds, layout=layout, max_position_embeddings=None, num_attention_heads=None,
        hidden_size=_positive_int(cfg, "hidden_size", required=False), weight_count=count_model_weights(config, cfg),
        quantization=_quantization(config, cfg), derived_max_model_len=derived,
        derived_max_model_len_key=derived_key, present_fields=_present(cfg))


def _present(cfg: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(k for k, v in cfg.items() if v is not None)
