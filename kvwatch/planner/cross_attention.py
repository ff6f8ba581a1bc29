"""Encoder-decoder models' cross-attention cache, as vLLM reserves it per request (pure).

Whisper's decoder layers (vLLM 0.34.0, vllm/model_executor/models/whisper.py:438-460; 0.33.0 the
same lines) each hold a self-attention layer (Attention: a FullAttentionSpec) and a cross-attention
layer (CrossAttention, model_executor/layers/attention/cross_attention.py:232-239: a
CrossAttentionSpec) of `decoder_attention_heads` heads of `d_model / heads`, at the block size in
force. The encoder's layers hold no cache (WhisperEncoderAttention is an MMEncoderAttention,
whisper.py:111, :204-210).

The two kinds never share a spec, so vLLM groups them apart (v1/core/kv_cache_planning.py
`_get_kv_cache_groups_uniform_page_size`): one group of the self-attention layers and one of the
cross-attention layers, one pool of blocks of the fuller group's pages. A request reserves, per
group, cdiv(max_memory_usage_bytes, page): the self-attention group cdiv(max_model_len, block),
the cross-attention group cdiv(max_num_encoder_input_tokens, block) whatever the audio's length
(CrossAttentionSpec.max_memory_usage_bytes), and that sum is what vLLM's maximum concurrency, its
"KV cache size: N tokens" and its check that one request fits divide by.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Protocol

from kvwatch.planner.layers import LayerLayout
from kvwatch.vllm_releases.kv_layout import Boundary

CROSS = "cross"   # a cross-attention cache layer: the encoder's keys and values, reserved per request


class _LayerSpec(Protocol):   # kv_groups.LayerSpec, which sizes its blocks with this module's rule
    @property
    def layer_kind(self) -> str: ...
    @property
    def block_size(self) -> int: ...
    @property
    def page_bytes(self) -> int: ...

# CrossAttentionSpec.max_memory_usage_bytes = cdiv(max_encoder_len, block_size) x page, where
# max_encoder_len is the scheduler config's max_num_encoder_input_tokens (vLLM 0.34.0,
# vllm/v1/kv_cache_interface.py:1255-1262; 0.33.0 :1221-1228; from 0.11: 0.11.2 :274-284), which
# SchedulerConfig sets to max_num_batched_tokens (0.34.0 vllm/config/scheduler.py:350; 0.33.0 :306;
# 0.11.2 :212), not to the model's encoder length. vLLM 0.10 read the model's own maximum encoder
# length instead (0.10.2 vllm/v1/kv_cache_interface.py:225-234: MULTIMODAL_REGISTRY
# .get_encdec_max_encoder_len, vllm/multimodal/registry.py:358-372, Whisper's audio tokens, which are
# its max_source_positions: models/whisper.py WhisperProcessingInfo.get_num_audio_tokens).
ENCODER_TOKENS_FROM_SCHEDULER = Boundary((0, 11, 0), "vLLM 0.11.2, vllm/v1/kv_cache_interface.py:282",
                                         "vLLM 0.10.2, vllm/v1/kv_cache_interface.py:232-233")
SPEC_SOURCE = "vLLM 0.34.0, vllm/v1/kv_cache_interface.py:1255-1262"
SCHEDULER_SOURCE = "vLLM 0.34.0, vllm/config/scheduler.py:350"
# An encoder-decoder model does not support chunked prefill (vLLM 0.34.0, vllm/config/model.py:2275-2277),
# so EngineArgs defaults max_num_batched_tokens to max(max_model_len, the usage default), then to at most
# max_num_seqs x max_model_len (vLLM 0.34.0, vllm/engine/arg_utils.py:3227-3262; 0.33.0 :3190-3225).
BATCHED_TOKENS_SOURCE = "vLLM 0.34.0, vllm/engine/arg_utils.py:3227-3262"

# The model types whose cross-attention layers kvwatch places, and the architectures that build them.
# Cohere ASR's decoder layers are Whisper's in cache terms (vLLM 0.32.0-0.34.0,
# model_executor/models/cohere_asr.py:152-171, :354-372): a self-attention (Attention), then a
# cross-attention (CrossAttention), of the same heads and head size (first_sub_layer and
# second_sub_layer); its Conformer encoder attends in plain torch (CohereASRMultiHeadAttention, :987),
# no vLLM attention layer. Its keys: planner/config_keys.py COHERE_ASR_DECODER. Canary (vLLM 0.34.0,
# canary.py:112-140) builds the same two layers per decoder layer from Cohere ASR's classes
# (self_attn, encoder_attn); its FastConformer encoder is transformers' ParakeetEncoder (canary.py:215),
# no vLLM attention layer. Its keys: config_keys.py CANARY_DECODER_DEFAULTS. Nemotron-Parse's MBart
# decoder layers (vLLM 0.32.0-0.34.0, models/nemotron_parse.py; 0.34.0 :82-116) are whisper.py's
# WhisperAttention (DECODER) and WhisperCrossAttention, named decoder.layers.N.{self_attn,encoder_attn};
# its RADIO vision encoder builds no vLLM attention layer. Its keys: config_keys.py
# NEMOTRON_PARSE_DECODER_DEFAULTS.
ENCODER_DECODER_MODEL_TYPES = frozenset({"whisper", "cohere_asr", "canary", "nemotron_parse"})
CROSS_ATTENTION_ARCHITECTURES = frozenset({"WhisperForConditionalGeneration", "CohereAsrForConditionalGeneration",
                                           "CanaryForConditionalGeneration", "NemotronParseForConditionalGeneration"})
# Architectures the release's table lists with CrossAttention only because their audio tower is vLLM's
# WhisperEncoder (whisper.py's WhisperAttention can build one, but the encoder's layers build none):
# their language model, from text_config, holds the cache (vLLM 0.34.0, models/ultravox.py:548, :694,
# kimi_audio.py:78, moss_transcribe_diarize.py:268, voxtral.py:30-34, ming_audio.py:32). Voxtral's causal
# encoder, which does hold a cache, is judged apart (planner/voxtral.py).
WHISPER_ENCODER_ONLY = frozenset({
    "UltravoxModel", "MoonshotKimiaForCausalLM", "MossTranscribeDiarizeForConditionalGeneration",
    "VoxtralForConditionalGeneration", "VoxtralRealtimeGeneration", "MingV3ASRForConditionalGeneration"})


def cross_attention_planned(kind: str, architecture: str) -> bool:
    """Whether the table's `kind` of this architecture is one kvwatch plans as vLLM builds it: Whisper's
    cross-attention, or a CrossAttention the architecture lists only through vLLM's WhisperEncoder."""
    return kind == "CrossAttention" and (architecture in CROSS_ATTENTION_ARCHITECTURES
                                         or architecture in WHISPER_ENCODER_ONLY)


def with_cross_attention(layout: LayerLayout, model_type: str) -> LayerLayout:
    """The decoder's cache layers in model order: each decoder layer's self-attention, then its
    cross-attention (the order of vLLM's layer names, model.decoder.layers.N.{self_attn,encoder_attn})."""
    if model_type not in ENCODER_DECODER_MODEL_TYPES:
        return layout
    kinds = tuple(kind for own in layout.kinds for kind in (own, CROSS))
    head_sizes = None if layout.head_sizes is None else tuple(s for s in layout.head_sizes for _ in (0, 1))
    kv_heads = None if layout.kv_heads is None else tuple(h for h in layout.kv_heads for _ in (0, 1))
    return replace(layout, kinds=kinds, head_sizes=head_sizes, kv_heads=kv_heads)


def max_num_encoder_input_tokens(batched_flag: int | None, chunked_prefill_flag: bool | None, default_batched: int,
                                 seqs: int, max_model_len: int, model_encoder_len: int, release: tuple[int, int, int]
                                 ) -> int:
    """The encoder tokens a CrossAttentionSpec reserves per request: from 0.11 the scheduler's
    max_num_batched_tokens (the flag, else the usage default raised to max_model_len where chunked
    prefill is off, as it is by default for an encoder-decoder model, and capped at
    max_num_seqs x max_model_len), before it the model's encoder length (`model_encoder_len`)."""
    if release < ENCODER_TOKENS_FROM_SCHEDULER.since:
        return model_encoder_len
    if batched_flag is not None:
        return batched_flag
    batched = default_batched if chunked_prefill_flag else max(max_model_len, default_batched)
    return min(seqs * max_model_len, batched)


def cross_blocks_per_request(encoder_tokens: int, block_size: int) -> int:
    """cdiv(CrossAttentionSpec.max_memory_usage_bytes, page): the blocks one request reserves per
    cross-attention group."""
    return -(-encoder_tokens // block_size)


def per_token_bytes(kinds: tuple[str, ...], layer_token_bytes: tuple[int, ...]) -> int:
    """The bytes one more token of a request takes over all cache layers: a cross-attention layer's
    reservation does not grow with the request's tokens."""
    return sum(b for kind, b in zip(kinds, layer_token_bytes, strict=True) if kind != CROSS)


def cross_bytes_per_request(specs: Iterable[_LayerSpec], encoder_tokens: int) -> int:
    """The bytes of one request's cross-attention reservation on one rank: per cross-attention layer
    (kv_groups.LayerSpec), its blocks (cdiv(encoder tokens, block)) of its page."""
    return sum(cross_blocks_per_request(encoder_tokens, s.block_size) * s.page_bytes
               for s in specs if s.layer_kind == CROSS)
