"""Which layers hold which cache, as vLLM builds them from a config.json (pure).

Many config.json files do not list their layer kinds: transformers fills `layer_types` from
per-architecture defaults when it loads the config, and vLLM's model files read that (or their
own rule). The rules below are those defaults, kept as data; neither transformers nor vLLM is
imported. Sources: transformers' configuration_gemma2/gemma3/llama4/qwen3_next/jamba/
nemotron_h/falcon_h1 files, and vLLM 0.32's model_executor/models/{gemma2,gemma3,gpt_oss,
llama,llama4,qwen3_next,granitemoehybrid,nemotron_h,jamba}.py.

A cache layer is one of:
- "full":    full attention, every token of the request
- "sliding": sliding-window attention (`window` tokens)
- "chunked": chunked local attention (Llama 4; `window` = attention_chunk_size)
- "mamba":   a recurrent state of fixed size per sequence (Mamba 1/2, gated delta net, LFM2's
             short convolution)

A layer whose `kv_sharing_target_layer_name` points at another layer (Gemma 3n, Gemma 4: the last
`num_kv_shared_layers`) reads that layer's cache and holds none: it is not a cache layer. A layer
type kvwatch cannot classify is kept as full attention and named in `unknown_layer_types`, so a
plan says it is unsure instead of failing or being silently wrong.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import ConfigError
from kvwatch.planner.inkling_ring import ConvRing
from kvwatch.planner.layer_pattern import pattern_layers
from kvwatch.planner.voxtral import CausalEncoder

FULL, SLIDING, CHUNKED, MAMBA = "full", "sliding", "chunked", "mamba"

# layer_types values seen in config.json files, by the cache they hold.
_LAYER_TYPE_KINDS = {
    "full_attention": FULL, "attention": FULL, "global_attention": FULL, "full": FULL,
    "sliding_attention": SLIDING, "sliding_window_attention": SLIDING, "local_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "minimax_m3_sparse": FULL,   # MiniMax-M3: a full K/V cache beside its indexer's (planner/minimax_sparse.py)
    "linear_attention": MAMBA, "mamba": MAMBA, "mamba2": MAMBA, "gated_delta_net": MAMBA,
    "conv": MAMBA,   # LFM2's short convolution: a conv state per sequence (MambaSpec)
}
# Architectures whose every layer is a state-space mixer: vLLM sizes one state per layer and
# sequence, no attention (model_executor/models/mamba.py, mamba2.py).
PURE_STATE_SPACE = {"mamba": "mamba1", "falcon_mamba": "mamba1", "mamba2": "mamba2"}
_GDN_INTERVAL_MODEL_TYPES = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
# Layers reading another layer's cache: the last num_kv_shared_layers (vLLM 0.32,
# model_executor/models/gemma3n.py and gemma4.py, `kv_sharing_target_layer_name`).
_KV_SHARING_MODEL_TYPES = frozenset({"gemma3n", "gemma3n_text", "gemma4", "gemma4_text"})


@dataclass(frozen=True)
class RecurrentState:
    """The per-sequence state of a Mamba-like layer, before tensor parallelism.

    family "mamba2":          conv (intermediate + 2 x groups x state, kernel - 1), ssm (heads, head_dim, state)
    family "gated_delta_net": conv (2 x k_heads x k_dim + v_heads x v_dim, kernel - 1), ssm (v_heads, v_dim, k_dim)
    family "mamba1":          conv (intermediate, kernel - 1), ssm (intermediate, state)
    family "short_conv":      conv (intermediate, kernel - 1), no ssm (LFM2: conv_dim, conv_L_cache)
    family "kda":             conv (3 x heads x head_dim, kernel - 1), ssm (heads, head_dim, head_dim)
                              (Kimi Delta Attention; its recurrent state is float32 unless asked:
                              MambaStateDtypeCalculator.kda_state_dtype)
    family "linear":          one (heads, head_dim, head_dim) tensor in the conv state's dtype, counted as
                              conv (Bailing V2.5's lightning attention: planner/bailing_linear.py)
    (model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator)
    """

    family: str
    conv_kernel: int
    intermediate_size: int = 0     # mamba1/mamba2
    n_groups: int = 1              # mamba2
    num_heads: int = 0             # mamba2 heads; gated delta net value heads
    head_dim: int = 0              # mamba2 head dim; gated delta net value head dim
    state_size: int = 0            # mamba1/2 state; gated delta net key head dim
    num_k_heads: int = 0           # gated delta net
    ssm_dtype: str | None = None   # the model's own SSM state dtype (None: vLLM's "auto")

    @property
    def checkpoint_blocks(self) -> int:
        """Prefill checkpoint states a request keeps with prefix caching: MambaMixer2 layers keep one
        (layers/mamba/mamba_mixer2.py get_kv_cache_spec), others none."""
        return 1 if self.family == "mamba2" else 0

    def element_counts(self, tp: int) -> tuple[int, int]:
        """(conv elements, ssm elements) on one tensor-parallel rank. Each split is vLLM's divide(),
        which asserts that the ranks divide it (vLLM 0.32.0, vllm/distributed/utils.py:51-62, called
        by model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator): a state that does
        not split is a ConfigError here, not a floored (or zero) state."""
        def split(count: int, what: str) -> int:
            if count % tp:
                raise ConfigError(f"the {self.family} state's {what} ({count}) does not split over {tp} "
                                  "tensor-parallel ranks (vLLM asserts it divides): choose a -tp that divides it")
            return count // tp

        if self.family == "mamba2":
            groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
            conv = split(self.intermediate_size + 2 * groups * self.state_size, "conv width") * (self.conv_kernel - 1)
            return conv, split(self.num_heads, "heads") * self.head_dim * self.state_size
        if self.family == "linear":   # its one state takes --mamba-cache-dtype, the conv state's rule
            return split(self.num_heads, "heads") * self.head_dim * self.head_dim, 0
        if self.family == "kda":
            conv = split(3 * self.num_heads * self.head_dim, "conv width") * (self.conv_kernel - 1)
            return conv, split(self.num_heads, "heads") * self.head_dim * self.head_dim
        if self.family == "gated_delta_net":
            conv_dim = self.state_size * self.num_k_heads * 2 + self.head_dim * self.num_heads
            return (split(conv_dim, "conv width") * (self.conv_kernel - 1),
                    split(self.num_heads, "value heads") * self.head_dim * self.state_size)
        conv = split(self.intermediate_size, "intermediate_size") * (self.conv_kernel - 1)
        if self.family == "short_conv":
            return conv, 0
        return conv, self.intermediate_size // tp * self.state_size


@dataclass(frozen=True)
class LayerLayout:
    kinds: tuple[str, ...]              # one per cache layer, in model order
    window: int | None = None           # sliding window or attention chunk, for those layers
    state: RecurrentState | None = None
    # Per cache layer (None: every attention layer has the model's head_dim and KV heads). Gemma 4's
    # full-attention layers are wider (global_head_dim) and may have fewer KV heads.
    head_sizes: tuple[int, ...] | None = None
    kv_heads: tuple[int, ...] | None = None
    kv_shared_layers: int = 0           # layers reading another layer's cache (not in kinds)
    unknown_layer_types: tuple[str, ...] = ()   # layer types kvwatch could not classify (kept as full)
    # Inkling: each decoder layer's short-convolution ring, a sliding-window spec of its own fixed
    # block beside the attention layers (planner/inkling.py)
    conv_rings: tuple[ConvRing, ...] = ()
    # Voxtral Realtime: its causal audio encoder's pooled sliding-window caches (planner/voxtral.py)
    causal_encoder: CausalEncoder | None = None

    @property
    def attention_layers(self) -> int:
        return sum(k != MAMBA for k in self.kinds)


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if default is not None and key not in cfg:
            return default
        raise ConfigError(f"config.json: field {key!r} must be a positive integer, got {str(value)[:40]!r}")
    return value


def _window(cfg: Mapping[str, Any]) -> int | None:
    window = cfg.get("sliding_window")
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def _from_layer_types(cfg: Mapping[str, Any], num_layers: int) -> list[str] | None:
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if not isinstance(types, list) or len(types) != num_layers:
        return None
    return [_LAYER_TYPE_KINDS.get(str(t).lower(), FULL) for t in types]


def unknown_layer_types(cfg: Mapping[str, Any], num_layers: int) -> tuple[str, ...]:
    """The listed layer types kvwatch has no rule for, each once, in order."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if not isinstance(types, list) or len(types) != num_layers:
        return ()
    unknown = [str(t)[:40] for t in types if str(t).lower() not in _LAYER_TYPE_KINDS]
    return tuple(dict.fromkeys(unknown))


def _attention_kinds(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> tuple[list[str], int | None]:
    window = _window(cfg)
    if model_type == "gpt_oss" and window:           # vLLM: even layers slide, whatever layer_types says
        return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)], window
    listed = _from_layer_types(cfg, num_layers)
    if listed is not None:
        if model_type in ("gemma4", "gemma4_text") and listed:
            listed[-1] = FULL                         # transformers Gemma4TextConfig forces the last layer full
        if CHUNKED in listed:
            return listed, _int(cfg, "attention_chunk_size")
        return listed, window
    if model_type in ("gemma4", "gemma4_text"):      # transformers: 5 sliding + 1 full, last layer full
        kinds = [SLIDING if (i + 1) % 6 else FULL for i in range(num_layers)]
        return kinds[:-1] + [FULL], window
    if model_type in ("gemma3n", "gemma3n_text"):    # transformers: every 5th layer full
        return [FULL if (i + 1) % 5 == 0 else SLIDING for i in range(num_layers)], window
    if model_type == "gemma2":                       # transformers: (i + 1) % 2 -> sliding
        return [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)], window
    if (exaone := pattern_layers(cfg, model_type, num_layers)) is not None:   # EXAONE 4: planner/layer_pattern.py
        return [SLIDING if slides else FULL for slides in exaone[0]], exaone[1]
    if model_type in ("gemma3", "gemma3_text", "cohere2"):
        pattern = _int(cfg, "sliding_window_pattern", 6 if model_type != "cohere2" else 4)
        return [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)], window
    if model_type in ("llama4", "llama4_text") and cfg.get("attention_chunk_size"):
        chunk = _int(cfg, "attention_chunk_size")
        no_rope = cfg.get("no_rope_layers")
        if not (isinstance(no_rope, list) and len(no_rope) == num_layers):
            interval = _int(cfg, "no_rope_layer_interval", 4)
            no_rope = [int((i + 1) % interval != 0) for i in range(num_layers)]
        # vLLM llama4.py: a layer with RoPE (no_rope_layers[i] != 0) uses chunked local attention.
        return [CHUNKED if flag else FULL for flag in no_rope], chunk
    if window and cfg.get("use_sliding_window") is False:
        return [FULL] * num_layers, None
    if window and isinstance(cfg.get("max_window_layers"), int) and cfg.get("use_sliding_window"):
        cut = cfg["max_window_layers"]                # Qwen2: layers below max_window_layers attend fully
        return [FULL if i < cut else SLIDING for i in range(num_layers)], window
    if window:                                       # Mistral v0.1, Phi-3: a window on every layer
        return [SLIDING] * num_layers, window
    return [FULL] * num_layers, None


def _hybrid_kinds(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> list[str] | None:
    """Layer kinds of attention + recurrent hybrids; None for attention-only models."""
    # transformers Qwen3NextConfig, Qwen3_5TextConfig, Qwen3_5MoeTextConfig: without layer_types,
    # every full_attention_interval-th layer (default 4) attends, the others are gated delta nets
    if model_type in _GDN_INTERVAL_MODEL_TYPES and not isinstance(cfg.get("layer_types"), list):
        interval = _int(cfg, "full_attention_interval", 4)
        return [FULL if (i + 1) % interval == 0 else MAMBA for i in range(num_layers)]
    if model_type == "nemotron_h":
        pattern = cfg.get("hybrid_override_pattern")
        if not isinstance(pattern, str) or len(pattern) != num_layers:
            raise ConfigError("config.json: nemotron_h needs hybrid_override_pattern with one character per layer")
        kinds = {"M": MAMBA, "*": FULL}
        return [kinds[c] for c in pattern if c in kinds]
    if model_type == "jamba" and not isinstance(cfg.get("layers_block_type"), list):
        period, offset = _int(cfg, "attn_layer_period", 8), cfg.get("attn_layer_offset", 4)
        return [FULL if i % period == offset else MAMBA for i in range(num_layers)]
    if model_type == "bamba":                        # transformers BambaConfig: attention at attn_layer_indices
        indices = cfg.get("attn_layer_indices")
        attention = set(indices) if isinstance(indices, list) else set()
        return [FULL if i in attention else MAMBA for i in range(num_layers)]
    if model_type == "falcon_h1":                    # every layer: attention and a Mamba2 mixer side by side
        return [FULL, MAMBA] * num_layers
    return None


def _recurrent_state(cfg: Mapping[str, Any], model_type: str) -> RecurrentState:
    if model_type in ("lfm2", "lfm2_moe"):           # ShortConv: conv_dim x (conv_L_cache - 1), model dtype
        dim = _int(cfg, "conv_dim") if "conv_dim" in cfg else _int(cfg, "hidden_size")
        return RecurrentState("short_conv", conv_kernel=_int(cfg, "conv_L_cache", 3), intermediate_size=dim)
    if PURE_STATE_SPACE.get(model_type) == "mamba1":  # Mamba / Falcon-Mamba: intermediate_size as listed
        return RecurrentState("mamba1", conv_kernel=_int(cfg, "conv_kernel", 4),
                              intermediate_size=_int(cfg, "intermediate_size"),
                              state_size=_int(cfg, "state_size", 16), ssm_dtype=_ssm_dtype(cfg, None))
    if model_type == "mamba2":                        # Mamba2ForCausalLM: intermediate = expand x hidden
        return RecurrentState("mamba2", conv_kernel=_int(cfg, "conv_kernel", 4),
                              intermediate_size=_int(cfg, "expand", 2) * _int(cfg, "hidden_size"),
                              n_groups=_int(cfg, "n_groups", 1), num_heads=_int(cfg, "num_heads"),
                              head_dim=_int(cfg, "head_dim"), state_size=_int(cfg, "state_size", 128),
                              ssm_dtype=_ssm_dtype(cfg, None))
    if model_type == "qwen3_next" or "linear_num_value_heads" in cfg:
        return RecurrentState("gated_delta_net", conv_kernel=_int(cfg, "linear_conv_kernel_dim", 4),
                              num_heads=_int(cfg, "linear_num_value_heads"), head_dim=_int(cfg, "linear_value_head_dim"),
                              num_k_heads=_int(cfg, "linear_num_key_heads"), state_size=_int(cfg, "linear_key_head_dim"),
                              ssm_dtype=_ssm_dtype(cfg, None))
    if model_type == "jamba":
        hidden = _int(cfg, "hidden_size")
        return RecurrentState("mamba1", conv_kernel=_int(cfg, "mamba_d_conv", 4),
                              intermediate_size=_int(cfg, "mamba_expand", 2) * hidden,
                              state_size=_int(cfg, "mamba_d_state", 16), ssm_dtype=_ssm_dtype(cfg, None))
    if model_type == "nemotron_h":
        heads, head_dim = _int(cfg, "mamba_num_heads"), _int(cfg, "mamba_head_dim")
        return RecurrentState("mamba2", conv_kernel=_int(cfg, "conv_kernel", 4), intermediate_size=heads * head_dim,
                              n_groups=_int(cfg, "n_groups", 1), num_heads=heads, head_dim=head_dim,
                              state_size=_int(cfg, "ssm_state_size", 128),
                              # vLLM NemotronHForCausalLMConfig: float32 unless the config names one
                              ssm_dtype=_ssm_dtype(cfg, "float32"))
    # Mamba2 with the mamba_* names: Granite-4.0-H (granitemoehybrid), Falcon-H1, Bamba
    hidden = _int(cfg, "hidden_size")
    # Falcon-H1 names the Mamba width; the others give it as an expansion of the hidden size
    intermediate = _int(cfg, "mamba_d_ssm") if "mamba_d_ssm" in cfg else _int(cfg, "mamba_expand", 2) * hidden
    return RecurrentState("mamba2", conv_kernel=_int(cfg, "mamba_d_conv", 4), intermediate_size=intermediate,
                          n_groups=_int(cfg, "mamba_n_groups", 1), num_heads=_int(cfg, "mamba_n_heads"),
                          head_dim=_int(cfg, "mamba_d_head"), state_size=_int(cfg, "mamba_d_state", 128),
                          ssm_dtype=_ssm_dtype(cfg, None))


def _ssm_dtype(cfg: Mapping[str, Any], default: str | None) -> str | None:
    value = cfg.get("mamba_ssm_cache_dtype") or cfg.get("mamba_ssm_dtype")
    return value if isinstance(value, str) else default


# Fields that describe a recurrent mixer: in a config kvwatch plans as attention only, they mean
# layers it did not place (a hybrid without a rule here), so the plan must say it is unsure.
_STATE_FIELD_PREFIXES = ("mamba_", "ssm_", "linear_attn", "linear_num_", "conv_L_cache", "short_conv")


def _unplaced_state_fields(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    fields = sorted(k for k in cfg if k.startswith(_STATE_FIELD_PREFIXES) and cfg[k] not in (None, False))
    return (f"a recurrent mixer ({', '.join(fields[:3])} in config.json)",) if fields else ()


def kv_shared_layers(cfg: Mapping[str, Any], model_type: str, num_layers: int) -> int:
    """How many of the last layers read an earlier layer's cache instead of holding their own."""
    if model_type not in _KV_SHARING_MODEL_TYPES:
        return 0
    # transformers' class defaults: Gemma3nTextConfig 15, Gemma4TextConfig 0
    shared = cfg.get("num_kv_shared_layers", 15 if model_type.startswith("gemma3n") else 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or shared < 0:
        raise ConfigError(f"config.json: field 'num_kv_shared_layers' must be a non-negative integer, "
                          f"got {str(shared)[:40]!r}")
    return min(shared, num_layers - 1)


def _per_layer_heads(cfg: Mapping[str, Any], model_type: str, kinds: tuple[str, ...], head_dim: int | None,
                     kv_heads: int | None) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """Gemma 4: full-attention layers take global_head_dim (default 512) and, with attention_k_eq_v,
    num_global_key_value_heads (transformers Gemma4TextConfig.per_layer_config; vLLM 0.32
    models/gemma4.py reads per_layer_config[i])."""
    if model_type not in ("gemma4", "gemma4_text") or head_dim is None or kv_heads is None:
        return None, None
    wide = cfg.get("global_head_dim", 512)
    wide = wide if isinstance(wide, int) and not isinstance(wide, bool) and wide > 0 else head_dim
    global_kv = cfg.get("num_global_key_value_heads")
    full_kv = global_kv if cfg.get("attention_k_eq_v") is True and isinstance(global_kv, int) and global_kv > 0 \
        else kv_heads
    return (tuple(wide if k == FULL else head_dim for k in kinds),
            tuple(full_kv if k == FULL else kv_heads for k in kinds))


def layer_layout(cfg: Mapping[str, Any], model_type: str, num_layers: int, head_dim: int | None = None,
                 kv_heads: int | None = None) -> LayerLayout:
    """The cache layers of this (text) config, in order (head_dim and kv_heads: the model's, for the
    architectures whose layers differ)."""
    unknown = unknown_layer_types(cfg, num_layers)
    if model_type in PURE_STATE_SPACE:
        return LayerLayout((MAMBA,) * num_layers, None, _recurrent_state(cfg, model_type))
    hybrid = _hybrid_kinds(cfg, model_type, num_layers)
    listed = _from_layer_types(cfg, num_layers) if hybrid is None else None
    if hybrid is None and listed is not None and MAMBA in listed:
        hybrid = listed
    if hybrid is not None:
        window = _window(cfg)
        kinds = _without_windowless_sliding(hybrid, window)
        return LayerLayout(kinds, window if SLIDING in kinds else None, _recurrent_state(cfg, model_type),
                           unknown_layer_types=unknown)
    listed_kinds, window = _attention_kinds(cfg, model_type, num_layers)
    unknown += _unplaced_state_fields(cfg)
    shared = kv_shared_layers(cfg, model_type, num_layers)
    kinds = _without_windowless_sliding(listed_kinds[:num_layers - shared], window)
    head_sizes, heads = _per_layer_heads(cfg, model_type, kinds, head_dim, kv_heads)
    return LayerLayout(kinds, window if set(kinds) & {SLIDING, CHUNKED} else None, head_sizes=head_sizes,
                       kv_heads=heads, kv_shared_layers=shared, unknown_layer_types=unknown)


def _without_windowless_sliding(kinds: list[str], window: int | None) -> tuple[str, ...]:
    """A sliding layer with no (valid) window attends to every token: vLLM's attention layer then
    has no sliding_window and its spec is full attention."""
    return tuple(FULL if k == SLIDING and window is None else k for k in kinds)


def kimi_linear_layout(cfg: Mapping[str, Any], num_layers: int) -> LayerLayout | None:
    """Kimi-Linear: KDA linear-attention layers and MLA layers, numbered from 1 in
    linear_attn_config (vLLM 0.32 models/kimi_k3, `kda_layers` / `full_attn_layers`)."""
    linear = cfg.get("linear_attn_config")
    if not isinstance(linear, Mapping) or not isinstance(linear.get("kda_layers"), list):
        return None
    kda = {n for n in linear["kda_layers"] if isinstance(n, int)}
    kinds = tuple(MAMBA if i + 1 in kda else FULL for i in range(num_layers))
    state = RecurrentState("kda", conv_kernel=_int(linear, "short_conv_kernel_size", 4),
                           num_heads=_int(linear, "num_heads"), head_dim=_int(linear, "head_dim"),
                           ssm_dtype=_ssm_dtype(cfg, "float32"))
    return LayerLayout(kinds, None, state)
