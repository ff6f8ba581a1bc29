"""The standard config keys of families whose config.json names them otherwise (pure).

vLLM reads a config through transformers, whose `attribute_map` answers `config.hidden_size` with
GPT-2's `n_embd` and so on, and whose class defaults fill what the file leaves out. kvwatch reads
config.json as JSON, so it applies the same map and defaults itself, for the families whose vLLM
model file reads them (vLLM 0.22.1, vllm/model_executor/models/{gpt2,gpt_j,gpt_bigcode,bloom,mpt}.py;
Whisper: vLLM 0.33.0, whisper.py).
Read from transformers 5.19.0's configuration files, cited per row. A key the file states wins.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kvwatch.errors import ConfigError
from kvwatch.planner.longcat_flash_weights import LONGCAT_FLASH, longcat_flash_keys
from kvwatch.vllm_releases.generated.config_class_defaults import SIZE_DEFAULTS, TIED_BY_DEFAULT


class FamilyKeys(NamedTuple):
    aliases: tuple[tuple[str, str], ...]   # (the standard key, the key this family's config.json uses)
    tied_embeddings: bool                  # transformers' default of tie_word_embeddings
    source: str


_GPT2_ALIASES = (("hidden_size", "n_embd"), ("max_position_embeddings", "n_positions"),
                 ("num_attention_heads", "n_head"), ("num_hidden_layers", "n_layer"))
FAMILY_KEYS: dict[str, FamilyKeys] = {
    "gpt2": FamilyKeys(_GPT2_ALIASES, True, "models/gpt2/configuration_gpt2.py:71-76, :103"),
    "gpt_bigcode": FamilyKeys(_GPT2_ALIASES, True, "models/gpt_bigcode/configuration_gpt_bigcode.py:52-57, :80"),
    "gptj": FamilyKeys(_GPT2_ALIASES, False, "models/gptj/configuration_gptj.py:45-50, :69"),
    "bloom": FamilyKeys((("num_hidden_layers", "n_layer"), ("num_attention_heads", "n_head"), ("hidden_size", "n_embed")),
                        True, "models/bloom/configuration_bloom.py:53-56, :73, :76-78 (n_embed)"),
    "mpt": FamilyKeys((("num_attention_heads", "n_heads"), ("hidden_size", "d_model"), ("num_hidden_layers", "n_layers")),
                      True, "models/mpt/configuration_mpt.py:113-117, :137"),
    # Whisper's cache layers are its decoder's: vLLM 0.33.0 whisper.py:614 builds decoder_layers of them, each
    # a self-attention and a cross-attention of decoder_attention_heads heads of d_model (:446-447, :455-456).
    # transformers' attribute_map answers the encoder's instead (configuration_whisper.py:120-124), which
    # the planner does not read; the released checkpoints have as many heads in both.
    "whisper": FamilyKeys((("hidden_size", "d_model"), ("num_attention_heads", "decoder_attention_heads"),
                           ("num_key_value_heads", "decoder_attention_heads"), ("num_hidden_layers", "decoder_layers")),
                          True, "models/whisper/configuration_whisper.py:120-124, :164; vLLM 0.33.0 whisper.py:446-456, "
                                ":614"),
    # ChatGLM / GLM-4 (THUDM's remote-code checkpoints): vLLM reads them through its own ChatGLMConfig (vLLM
    # 0.32.0 transformers_utils/configs/chatglm.py:11-14, :45-49) and builds the MLP ffn_hidden_size wide
    # (models/chatglm.py:156-171). The KV heads and the vocabulary are set in standard_keys below. The class
    # sets no tie_word_embeddings, so the file's is read (:409; the published files state false).
    "chatglm": FamilyKeys((("num_hidden_layers", "num_layers"), ("intermediate_size", "ffn_hidden_size")),
                          False, "vLLM 0.32.0 transformers_utils/configs/chatglm.py:11-14, :45-49"),
    # DBRX: the top-level names, and its attention and experts in nested sections (standard_keys below).
    "dbrx": FamilyKeys((("hidden_size", "d_model"), ("num_attention_heads", "n_heads"), ("num_hidden_layers", "n_layers"),
                        ("max_position_embeddings", "max_seq_len")),
                       False, "models/dbrx/configuration_dbrx.py:130-135, :153"),
}
# DBRX's nested sections: the standard key, the section, its key there, the section class's default
# (transformers 5.19.0 models/dbrx/configuration_dbrx.py:42 DbrxAttentionConfig, :74-76 DbrxFFNConfig). vLLM
# 0.32.0 builds Wqkv with kv_n_heads KV heads (models/dbrx.py:200, :209-216) and moe_num_experts experts of
# ffn_hidden_size, top moe_top_k (:165-170).
DBRX_NESTED = (("num_key_value_heads", "attn_config", "kv_n_heads", 1),
               ("intermediate_size", "ffn_config", "ffn_hidden_size", 3584),
               ("num_local_experts", "ffn_config", "moe_num_experts", 4),
               ("num_experts_per_tok", "ffn_config", "moe_top_k", 1))
# GPTBigCode's multi-query attention (transformers configuration_gpt_bigcode.py:78, :83, on by default;
# vLLM 0.22.1 gpt_bigcode.py:77-82: one KV head) and MPT's MLP width (expansion_ratio x d_model, 4 by
# default: configuration_mpt.py:122; vLLM 0.22.1 mpt.py:160-162).
MPT_EXPANSION_RATIO = 4


# Cohere ASR's decoder (vLLM 0.32.0-0.34.0, model_executor/models/cohere_asr.py:343-350, :438-440) reads
# its layers from config.json's NeMo-style `transf_decoder.config_dict`, not from the top-level keys
# transformers' CohereAsrConfig fills: num_layers decoder layers, each a self-attention and a
# cross-attention of num_attention_heads heads (KV heads too, :124) of hidden_size / heads (:125).
# vLLM's max_model_len comes from the top level as for any model: config.json's own keys, else the
# class's max_position_embeddings default, 1024 (transformers 5.19.0, configuration_cohere_asr.py:71).
COHERE_ASR_DECODER = (("hidden_size", "hidden_size"), ("num_attention_heads", "num_attention_heads"),
                      ("num_key_value_heads", "num_attention_heads"), ("num_hidden_layers", "num_layers"))
COHERE_ASR_MAX_POSITIONS = 1024
# The keys vLLM derives max_model_len from, the smallest wins (vLLM 0.34.0,
# transformers_utils/model_arch_config_convertor.py:375-408 derive_max_model_len_and_key).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")


# Canary (vLLM 0.34.0, model_executor/models/canary.py:112-190) builds its decoder from transformers'
# CanaryConfig.decoder_config: num_hidden_layers layers, each a self-attention and a cross-attention
# (Cohere ASR's classes: num_attention_heads heads, KV heads too, of hidden_size / heads; its
# num_key_value_heads and head_dim are not read). vLLM's text config is that decoder config
# (CanaryConfig.get_text_config, vllm/transformers_utils/config.py:1303-1317), so max_model_len comes
# from its keys. The class's defaults fill what the file leaves out (transformers 5.19.0,
# configuration_canary.py:48-55; an absent decoder_config is all defaults, :138-141).
CANARY_DECODER_DEFAULTS = {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 8,
                           "max_position_embeddings": 1024}


# Nemotron-Parse (vLLM 0.32.0-0.34.0, model_executor/models/nemotron_parse.py; 0.34.0 :82-116, :223-265,
# :645-651) builds its MBart decoder from config.decoder: decoder_layers layers, each whisper.py's
# self-attention and cross-attention of decoder_attention_heads heads (KV heads too) of d_model / heads;
# its RADIO encoder holds no cache. Its config class is the checkpoint's own (auto_map): NemotronParseConfig
# makes `decoder` a NemotronParseTextConfig whose max_sequence_length is the top level's (default 9000)
# and whose defaults fill what the file leaves out (d_model 1024, decoder_layers 12, decoder_attention_heads
# 16: public copies of its configuration_nemotron_parse.py). vLLM's text config is that decoder
# (transformers' get_text_config takes `decoder`; vllm/transformers_utils/config.py:1303-1317), so
# max_model_len comes from the decoder's length keys (its own num_hidden_layers, the encoder's count in
# published files, sizes nothing: the cache is the layers the model builds), and the heads vLLM's TP
# check divides (config/model.py:1577-1583) are its num_attention_heads, which the class sets to
# encoder_attention_heads.
NEMOTRON_PARSE_DECODER_DEFAULTS = {"d_model": 1024, "decoder_layers": 12, "decoder_attention_heads": 16}
NEMOTRON_PARSE_MAX_SEQUENCE_LENGTH = 9000
NEMOTRON_PARSE_ENCODER_HEADS = 16   # NemotronParseTextConfig's encoder_attention_heads default


def _decoder_keys(cfg: Mapping[str, Any], fields: Mapping[str, Any], aliases: tuple[tuple[str, str], ...]
                  ) -> dict[str, Any]:
    """`cfg` with the decoder's layer keys (`aliases`: standard key, the decoder's own) and the head
    size the decoder's attention derives (hidden_size / heads, cohere_asr.py:125)."""
    out = {**cfg, **{standard: fields.get(own) for standard, own in aliases}}
    heads, hidden = out["num_attention_heads"], out["hidden_size"]
    ok = isinstance(hidden, int) and isinstance(heads, int) and not isinstance(heads, bool) and heads > 0
    out["head_dim"] = hidden // heads if ok else None
    return out


def _cohere_asr_keys(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    decoder = cfg.get("transf_decoder")
    fields = decoder.get("config_dict") if isinstance(decoder, Mapping) else None
    if not isinstance(fields, Mapping):
        raise ConfigError("config.json: Cohere ASR needs 'transf_decoder' with its 'config_dict', which vLLM's "
                          "cohere_asr.py reads its decoder layers from")
    missing = next((own for _, own in COHERE_ASR_DECODER if fields.get(own) is None), None)
    if missing is not None:   # vLLM has no default for them: config_dict.get() gives None (cohere_asr.py:347-350)
        raise ConfigError(f"config.json: Cohere ASR's transf_decoder.config_dict lacks {missing!r}, which vLLM's "
                          f"cohere_asr.py reads its decoder layers from")
    out = _decoder_keys(cfg, fields, COHERE_ASR_DECODER)
    if not any(cfg.get(k) is not None for k in MAX_LEN_KEYS):
        out["max_position_embeddings"] = COHERE_ASR_MAX_POSITIONS
    return out


def _canary_keys(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    decoder = cfg.get("decoder_config")
    if decoder is not None and not isinstance(decoder, Mapping):
        raise ConfigError("config.json: Canary's 'decoder_config' must be an object")
    fields = {**CANARY_DECODER_DEFAULTS, **{k: v for k, v in (decoder or {}).items() if v is not None}}
    lengths = {k: fields.get(k) for k in MAX_LEN_KEYS}   # the decoder config's, not the top level's
    out = _decoder_keys(cfg, fields, (("hidden_size", "hidden_size"), ("num_attention_heads", "num_attention_heads"),
                                      ("num_key_value_heads", "num_attention_heads"),
                                      ("num_hidden_layers", "num_hidden_layers")))
    return {**out, **lengths}


def _nemotron_parse_keys(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    decoder = cfg.get("decoder")
    if decoder is not None and not isinstance(decoder, Mapping):
        raise ConfigError("config.json: Nemotron-Parse's 'decoder' must be an object")
    fields = {**NEMOTRON_PARSE_DECODER_DEFAULTS, **{k: v for k, v in (decoder or {}).items() if v is not None}}
    top = cfg.get("max_sequence_length")
    fields["max_sequence_length"] = NEMOTRON_PARSE_MAX_SEQUENCE_LENGTH if top is None else top
    lengths = {k: fields.get(k) for k in MAX_LEN_KEYS}   # the decoder's, not the top level's
    out = _decoder_keys(cfg, fields, (("hidden_size", "d_model"), ("num_attention_heads", "decoder_attention_heads"),
                                      ("num_key_value_heads", "decoder_attention_heads"),
                                      ("num_hidden_layers", "decoder_layers")))
    # the text config's num_attention_heads, which vLLM's TP check divides, is the encoder's
    # (NemotronParseTextConfig sets it from encoder_attention_heads); the layers' heads are the decoder's
    out["num_attention_heads"] = fields.get("encoder_attention_heads", NEMOTRON_PARSE_ENCODER_HEADS)
    return {**out, **lengths}


def class_defaults(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """`cfg` with what transformers' class of its model_type fills when the file leaves out
    tie_word_embeddings or a size (vocab_size, Gemma 4's per-layer input: vllm_releases/generated/
    config_class_defaults.py): published files often leave out what equals the default (google/gemma-3-*-it:
    no vocab_size, no tie_word_embeddings; vLLM's model reads the class's value, e.g. vLLM 0.32.0
    models/gemma3.py:398 `if config.tie_word_embeddings`)."""
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        return cfg
    filled = {field: size for field, size in SIZE_DEFAULTS.get(model_type, {}).items() if cfg.get(field) is None}
    if cfg.get("tie_word_embeddings") is None and model_type in TIED_BY_DEFAULT:
        filled["tie_word_embeddings"] = True
    return {**cfg, **filled} if filled else cfg


def standard_keys(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """`cfg` with the standard keys its family's transformers class answers (unchanged for other families)."""
    model_type = cfg.get("model_type")
    if model_type == "cohere_asr":
        return _cohere_asr_keys(cfg)
    if model_type == "canary":
        return _canary_keys(cfg)
    if model_type == "nemotron_parse":
        return _nemotron_parse_keys(cfg)
    if model_type == LONGCAT_FLASH:   # two attention sublayers per block (planner/longcat_flash_weights.py)
        return longcat_flash_keys(class_defaults(cfg))
    family = FAMILY_KEYS.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        return class_defaults(cfg)
    out = dict(class_defaults(cfg))
    for standard, own in family.aliases:
        if out.get(standard) is None and out.get(own) is not None:
            out[standard] = out[own]
    if out.get("tie_word_embeddings") is None:
        out["tie_word_embeddings"] = family.tied_embeddings
    if model_type == "gpt_bigcode" and out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = 1 if out.get("multi_query", True) else out.get("num_attention_heads")
    if model_type == "chatglm":
        # KV heads: multi_query_group_num only with multi_query_attention (default off), else one per query
        # head (vLLM 0.32.0 models/chatglm.py:60-65); embedding and LM head padded_vocab_size rows (:329-346)
        if out.get("num_key_value_heads") is None:
            out["num_key_value_heads"] = out.get("multi_query_group_num", 1) if out.get("multi_query_attention") \
                else out.get("num_attention_heads")
        if out.get("padded_vocab_size") is not None:
            out["vocab_size"] = positive_field(out, "padded_vocab_size", needs="ChatGLM's embedding and LM head")
    if model_type == "dbrx":
        for standard, section, own, default in DBRX_NESTED:
            nested = out.get(section)
            if out.get(standard) is None:
                out[standard] = positive_field(nested, own, default, needs=f"DBRX's {section}") \
                    if isinstance(nested, Mapping) else default
    if model_type == "mpt" and out.get("intermediate_size") is None:
        ratio = out.get("expansion_ratio")
        ratio = ratio if isinstance(ratio, int) and not isinstance(ratio, bool) and ratio > 0 else MPT_EXPANSION_RATIO
        if isinstance(out.get("hidden_size"), int):
            out["intermediate_size"] = ratio * out["hidden_size"]
    return out


def own_key(cfg: Mapping[str, Any], standard: str) -> str:
    """How this family's config.json names a standard key ("" when it uses the standard name), for an
    error that names the field the user can add: Whisper's heads are its 'decoder_attention_heads'."""
    model_type = cfg.get("model_type")
    family = FAMILY_KEYS.get(model_type) if isinstance(model_type, str) else None
    own = next((o for s, o in family.aliases if s == standard), "") if family is not None else ""
    return f"{own!r} (its {standard!r})" if own else ""


# A config field no model has come near (2**24): above it, a value is malformed, not a model's, and
# would have the planner build per-layer tables of that length.
MAX_FIELD = 1 << 24


def positive_field(cfg: Mapping[str, Any], key: str, default: int | None = None, needs: str = "") -> int:
    """A positive integer field of config.json, at most MAX_FIELD: its value, else `default`; a missing
    field with no default, or a bad value, is one ConfigError naming the field (`needs`: who reads it)."""
    value = cfg.get(key)
    if value is None and default is not None:
        return default
    who = f" ({needs})" if needs else ""
    if value is None:
        raise ConfigError(f"config.json: missing field {key!r}{who}")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_FIELD:
        raise ConfigError(f"config.json: field {key!r} must be a positive integer of at most {MAX_FIELD}{who}, "
                          f"got {str(value)[:40]!r}")
    return value
