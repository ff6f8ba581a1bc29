"""Voxtral's audio encoder, as vLLM builds it: no cache, or a causal one with caches of its own (pure).

VoxtralForConditionalGeneration and VoxtralRealtimeGeneration build their audio tower with
VoxtralEncoderModel (vLLM 0.34.0, model_executor/models/voxtral.py:727-732; 0.33.0 :726-731; 0.32.0
the same lines as 0.33.0): vLLM's WhisperEncoder, whose layers hold no cache (planner/cross_attention.py
WHISPER_ENCODER_ONLY), unless the audio config's `is_causal` is set; then WhisperCausalEncoder, each of
whose layers is a WhisperCausalAttentionWithBlockPooling with a KV cache of its own beside the
language model's: a sliding-window spec of `tokens_per_state` 1 / `block_pool_size` whose window is
counted in pooled tokens, `cdiv(sliding_window, block_pool_size) + 1` (vLLM 0.34.0 and 0.33.0,
model_executor/models/whisper_causal.py:411-426).

Where `is_causal` comes from: vLLM's Mistral-format parser (params.json, read in place of config.json
where the repository has consolidated*.safetensors: transformers_utils/config.py:934-943) sets it
from `encoder_args.causal` and names the architecture after it, VoxtralRealtimeGeneration when causal,
else VoxtralForConditionalGeneration (transformers_utils/configs/mistral.py:254-285 in 0.34.0, :235-266
in 0.33.0 and 0.32.0); transformers' VoxtralEncoderConfig, the HF-format audio config, has no such field.
So VoxtralForConditionalGeneration builds the causal encoder only from a config.json whose audio_config
sets `is_causal` itself, and VoxtralRealtimeGeneration always builds it (its processing asserts it,
voxtral_realtime.py:460). tests/test_voxtral.py runs vLLM's own parser on a real params.json.

Scope: where vLLM reads a Voxtral params.json, kvwatch reads it too (boundary/model_source.py), as
params_config translates it: the architecture, the encoder's fields and the language model's text
config (any other params.json is left for config.json). The causal encoder's caches are planned by
planner/voxtral_encoder.py from CausalEncoder.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.errors import ConfigError

CAUSAL_POOLING = "WhisperCausalAttentionWithBlockPooling"


# vLLM's Mistral-format parser (vLLM 0.34.0, transformers_utils/configs/mistral.py; 0.33.0 the same
# code): params.json keys -> the text config's (_remap_general_mistral_args, :155-182).
_TEXT_KEYS = {"dim": "hidden_size", "norm_eps": "rms_norm_eps", "n_kv_heads": "num_key_value_heads",
              "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size"}
# A params.json without max_position_embeddings takes the HF config.json's text config's, else this
# (transformers_utils/config.py:517-522, :1617-1636 in 0.34.0; :484-489, :1569-1588 in 0.33.0).
DEFAULT_MAX_POSITIONS = 128_000


def is_audio_params(params: Mapping[str, Any]) -> bool:
    """Whether a params.json is Voxtral's: `multimodal.whisper_model_args.encoder_args` (adapt_config_dict,
    mistral.py:84-88); the only params.json kvwatch reads (planner/voxtral.py scope)."""
    multimodal = params.get("multimodal")
    whisper = multimodal.get("whisper_model_args") if isinstance(multimodal, Mapping) else None
    return isinstance(whisper, Mapping) and isinstance(whisper.get("encoder_args"), Mapping) \
        and bool(whisper["encoder_args"]) and isinstance(whisper.get("downsample_args", {}), Mapping)


def params_config(params: Mapping[str, Any], hf_max_positions: int | None) -> dict[str, Any]:
    """The config vLLM builds from a Voxtral params.json (is_audio_params), as a config.json kvwatch reads:
    the architecture and `audio_config.is_causal` from `encoder_args.causal`, the audio config's encoder
    layers, heads, head size and window, and the language model's text config with a list
    `sliding_window` or an int turned into `layer_types` (_remap_mistral_sliding_window, mistral.py:185-205)
    and its length keys (`max_seq_len` defaults to `max_position_embeddings`); `hf_max_positions`: the HF
    config.json's text max_position_embeddings beside it, if any. Its figures are checked against vLLM's
    own parser by tests/test_voxtral.py."""
    text: dict[str, Any] = {_TEXT_KEYS.get(k, k): v for k, v in params.items() if k != "multimodal"}
    positions = params.get("max_position_embeddings") or hf_max_positions or DEFAULT_MAX_POSITIONS
    text["max_position_embeddings"] = positions
    text["max_seq_len"] = params.get("max_seq_len", positions)
    text["model_type"] = params.get("model_type", "transformer")
    text["architectures"] = ["MistralForCausalLM"]
    window, layers = text.get("sliding_window"), text.get("num_hidden_layers")
    layers = layers if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 else None
    if isinstance(window, list) and window and layers is not None:
        text["layer_types"] = ["full_attention" if w is None else "sliding_attention"
                               for w in window * (layers // len(window))]
        text["sliding_window"] = next((w for w in window if w is not None), None)
    elif isinstance(window, int) and not isinstance(window, bool) and window and layers is not None \
            and text.get("layer_types") is None:
        text["layer_types"] = ["sliding_attention"] * layers
    whisper = params["multimodal"]["whisper_model_args"]
    encoder = whisper["encoder_args"]
    causal = bool(encoder.get("causal"))
    pool = whisper.get("downsample_args", {}).get("downsample_factor") if causal else 1
    return {
        "architectures": ["VoxtralRealtimeGeneration" if causal else "VoxtralForConditionalGeneration"],
        "model_type": "voxtral", "text_config": text,
        "audio_config": {"is_causal": causal, "block_pool_size": pool, "sliding_window": encoder.get("sliding_window"),
                         "encoder_layers": encoder.get("n_layers"), "encoder_attention_heads": encoder.get("n_heads"),
                         "encoder_head_dim": encoder.get("head_dim"), "d_model": encoder.get("dim")},
    }


@dataclass(frozen=True)
class CausalEncoder:
    """The causal audio encoder's cache layers as WhisperCausalEncoder builds them (whisper_causal.py):
    `layers` encoder layers (encoder_layers), each of `heads` KV heads (encoder_attention_heads, no GQA)
    of `head_dim` (encoder_head_dim), a sliding window of `window` encoder frames (sliding_window),
    `pool` frames pooled into one language-model token (block_pool_size, the downsample_factor)."""

    layers: int
    heads: int
    head_dim: int
    window: int
    pool: int

    def heads_per_rank(self, tp: int) -> int:
        """WhisperCausalAttention's KV heads on one rank: max(1, heads / TP) (whisper_causal.py:447-458)."""
        return max(1, self.heads // tp)

    @property
    def pooled_window(self) -> int:
        """The spec's window, in pooled tokens: cdiv(sliding_window, block_pool_size) + 1 (whisper_causal.py:424)."""
        return -(-self.window // self.pool) + 1

    def page_bytes(self, block_size: int, tp: int, dtype_bytes: int) -> int:
        """The spec's page: one block of `block_size` tokens holds block_size / tokens_per_state =
        block_size x pool states of K and V per head (AttentionSpec.page_size_bytes, tokens_per_state
        1 / block_pool_size: v1/kv_cache_interface.py)."""
        return self.heads_per_rank(tp) * block_size * self.pool * 2 * self.head_dim * dtype_bytes


def causal_encoder(config: Mapping[str, Any]) -> CausalEncoder | None:
    """The causal encoder of a Voxtral config (model_type `voxtral`, as vLLM's parser and transformers'
    VoxtralConfig name it) whose audio config sets `is_causal` (params_config gives one for a causal
    params.json), else None; a causal one without its sizes is refused naming the field, as
    vLLM cannot build it either (WhisperCausalEncoderLayer reads them and asserts a pool above 1, whisper_causal.py:538-560)."""
    audio = config.get("audio_config")
    if config.get("model_type") != "voxtral" or not isinstance(audio, Mapping) or not audio.get("is_causal"):
        return None   # VoxtralEncoderModel's reading: other models' audio configs are their own
    sizes = []
    for key in ("encoder_layers", "encoder_attention_heads", "encoder_head_dim", "sliding_window", "block_pool_size"):
        value = audio.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"config.json: audio_config.{key} must be a positive integer for a causal audio "
                              f"encoder, got {str(value)[:40]!r}")
        sizes.append(value)
    if sizes[4] < 2:
        raise ConfigError("config.json: audio_config.block_pool_size must be above 1 for a causal audio encoder "
                          "(WhisperCausalEncoderLayer asserts it)")
    return CausalEncoder(*sizes)
