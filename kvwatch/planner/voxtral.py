"""Voxtral's audio encoder, as vLLM builds it: no cache, or a causal one kvwatch does not plan (pure).

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

Scope: kvwatch reads config.json (boundary/model_source.py), not params.json; for a Mistral repository
it takes the language model's figures in config.json's text_config to be those vLLM reads from
params.json. The causal encoder's caches are not planned: a plan of one is marked unknown.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CAUSAL_POOLING = "WhisperCausalAttentionWithBlockPooling"
# The marker a config.json's `audio_config.is_causal` adds to the fields the architecture verdict reads
# (planner/geometry.py present_fields): the one thing that makes VoxtralForConditionalGeneration build
# the causal encoder.
CAUSAL_AUDIO_FIELD = "audio_config.is_causal"
# The architecture whose causal encoder depends on that flag (VoxtralRealtimeGeneration's never does).
CAUSAL_WHEN_FLAGGED = frozenset({"VoxtralForConditionalGeneration"})


def audio_fields(config: Mapping[str, Any]) -> frozenset[str]:
    """CAUSAL_AUDIO_FIELD where the config.json's audio config asks for vLLM's causal encoder
    (VoxtralEncoderModel reads `getattr(config, "is_causal", False)`), else nothing."""
    audio = config.get("audio_config")
    return frozenset({CAUSAL_AUDIO_FIELD}) if isinstance(audio, Mapping) and audio.get("is_causal") else frozenset()


def causal_pooling_off(kind: str, architecture: str, config: Mapping[str, Any] | None) -> bool:
    """Whether vLLM leaves this kind out of this architecture for this config: the causal encoder's
    pooled attention of a VoxtralForConditionalGeneration whose audio config is not causal (for
    config None, the architecture as vLLM's own config parsers give it, never causal)."""
    return (kind == CAUSAL_POOLING and architecture in CAUSAL_WHEN_FLAGGED
            and (config is None or config.get(CAUSAL_AUDIO_FIELD) is None))
