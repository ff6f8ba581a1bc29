"""vLLM's own KV cache for a Qwen4-Exp config.json: run as a script, one release per process.

    python tests/qwen4_exp_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: the config as transformers'
Qwen4ExpTextConfig loads it, the block size (Platform._preferred_block_size_for_backends from
CacheConfig.DEFAULT_BLOCK_SIZE, then Platform._align_hybrid_block_size, which resolves the model class
through vLLM's registry for its GDN and PLE state pages), the layout every backend lists
(get_supported_kv_cache_layouts), each cache's spec (QwenGatedDeltaNetAttention, Qwen4ExpPLELayer,
QSARawKeyCache (0.33: QSAKeyStateCache), QSACompressedKeyCache and Qwen4ExpQSAAttention.get_kv_cache_spec, the attention specs
through the runner's customize_attention_spec), get_kv_cache_groups and get_kv_cache_config_from_groups
for a KV budget, and get_kv_cache_capacity for the tokens vLLM logs. The two QSA indexer caches are
built by their own constructors; the other layers are bare objects holding the attributes their
get_kv_cache_spec reads. The scope and the constructors' arithmetic are the oracle's own, citing vLLM
0.34.0 vllm/models/qwen4_exp/nvidia: a layer's PLE state on `ple_layer_ids` (1-based, model.py:216-231)
is built before its GDN or QSA layer (:232-265); a QSA layer's indexer registers its raw-key ring and
compressed key before the layer's K/V (qsa.py:406-473, qsa_indexer.py:165-181); KV heads per rank
`max(1, num_key_value_heads // TP)` and head_dim `head_dim or hidden_size // heads` (qsa.py:344-345);
the ring carries MRoPE positions where the model keeps M-RoPE (qsa_indexer.py:168: a VL wrapper whose
rope_parameters have an mrope_section; the text model strips it, model_executor/models/config.py:
1334-1399); CUDA SM 9.0, where FlashInfer is the GDN prefill backend and a GDN layer exports
prefill checkpoints every 64 tokens in align mode (model_executor/layers/mamba/gdn/
qwen_gdn_linear_attn.py:187-330, :846-857); the Mamba cache mode "align" and mamba_block_size =
block_size that prefix caching, on by default, sets (model_executor/models/config.py:1094-1110). A
case with "mtp" (k speculative tokens) drafts with the MTP head: the speculative config's k reaches the
GDN and PLE state shapes (the block's, nvidia/model.py:817-867, and the layers' own num_spec), the
raw-key rings and every Mamba spec's speculative blocks through the release's own code, and
Qwen4ExpMultiTokenPredictor's `mtp_num_hidden_layers` (1 when unset) QSA decoder layers at
`mtp.layers.{num_hidden_layers + i}` (nvidia/mtp.py:198-249, Qwen4ExpMTP's prefix "mtp") register after
the target's, built as the target's QSA layers (none is on `ple_layer_ids`). Of Qwen4ExpForConditionalGenerationConfig.verify_and_update_config only the
Qwen3.5 part that sizes a cache runs (config.py:1293-1318, :1357: the SSM state's dtype from the
config's mamba_ssm_dtype). The model module imports the Qwen2-VL image processor, whose transformers module
needs torchvision: where it is not installed an empty package stands in (glm5_next_oracle.py). It
prints a JSON list, one answer per case.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from glm5_next_oracle import _stub_torchvision
from vllm_sources import bare_layer, bare_vllm_config, packed_answer, run_oracle_script


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    from transformers import Qwen4ExpTextConfig
    from vllm.config.cache import CacheConfig
    _stub_torchvision()
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
    from vllm.model_executor.models.config import Qwen3_5ForConditionalGenerationConfig, _strip_qwen4_exp_mrope
    from vllm.models.qwen4_exp.nvidia import model as _model  # noqa: F401  (first: qsa.py imports it back)
    from vllm.models.qwen4_exp.nvidia import qsa
    from vllm.models.qwen4_exp.nvidia.ple_layer import Qwen4ExpPLELayer
    try:   # 0.34: common/qsa_indexer.py; 0.33: the same caches in common/qsa_cache.py
        from vllm.models.qwen4_exp.common.qsa_indexer import QSACompressedKeyCache
        from vllm.models.qwen4_exp.common.qsa_indexer import QSARawKeyCache as RawKeyCache
    except ImportError:
        from vllm.models.qwen4_exp.common.qsa_cache import QSACompressedKeyCache  # type: ignore[no-redef]
        from vllm.models.qwen4_exp.common.qsa_cache import QSAKeyStateCache as RawKeyCache  # type: ignore[no-redef]
    # the K/V's backend: Qwen4ExpQSABackend in 0.34, Qwen4ExpQSAFlashAttentionBackend in 0.33 (nvidia/qsa.py:146)
    qsa_backend = getattr(qsa, "Qwen4ExpQSABackend", None) or qsa.Qwen4ExpQSAFlashAttentionBackend
    from vllm.platforms.interface import Platform
    from vllm.transformers_utils.config import uses_mrope
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.core import kv_cache_planning, kv_cache_utils
    from vllm.v1.kv_cache_interface import AttentionSpec
    from vllm.v1.worker.utils import customize_attention_spec

    ns = types.SimpleNamespace


    answers = []
    for case in cases:
        text = Qwen4ExpTextConfig(**{k: v for k, v in case["config"].items()
                                     if k not in ("architectures", "model_type", "torch_dtype")})
        tp = case["tp"]
        k = case.get("mtp", 0)
        architecture = case["config"]["architectures"][0]
        if architecture != "Qwen4ExpForConditionalGeneration":   # the text model drops M-RoPE (config.py:1394-1399)
            _strip_qwen4_exp_mrope(ns(hf_config=text, hf_text_config=text))
        mrope = uses_mrope(text)
        cache = CacheConfig()
        cache.mamba_cache_mode = "align"
        kv_heads = max(1, text.num_key_value_heads // tp)                                   # qsa.py:344
        head_dim = text.head_dim or text.hidden_size // text.num_attention_heads            # qsa.py:345
        model = ns(use_mla=False, dtype=torch.bfloat16, architecture=architecture, hf_text_config=text,
                   is_hybrid=True, model_impl="auto", get_num_kv_heads=lambda _, k=kv_heads: k,
                   get_head_size=lambda h=head_dim: h, max_model_len=case["max_model_len"], uses_mrope=mrope)
        config = bare_vllm_config(cache, model, tp, k, {"max_num_batched_tokens": 2048},
                                  use_flashinfer_replayssm=False, additional_config={})
        # the Qwen3.5 contract Qwen4-Exp's config class applies first: the SSM state in mamba_ssm_dtype
        Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(config)
        context = config.compilation_config.static_forward_context
        ple_ids = set(text.ple_layer_ids)
        first = text.num_hidden_layers   # the draft's layers after the target's (nvidia/mtp.py:198-249)
        drafted = [("qwen_sparse_attention", f"mtp.layers.{first + i}")
                   for i in range(getattr(text, "mtp_num_hidden_layers", 1) if k else 0)]
        for i, (kind, p) in enumerate([*((t, f"model.layers.{i}") for i, t in enumerate(text.layer_types)), *drafted]):
            if i + 1 in ple_ids:
                context[f"{p}.ple"] = bare_layer(Qwen4ExpPLELayer, model_config=model, cache_config=cache,
                                           hc_hidden_size=text.hidden_size * text.hc_count,
                                           conv_state_len=(text.ple_conv_kernel_size - 1) * text.ngram_size,
                                           num_spec_tokens=k)
            if kind == "linear_attention":
                context[f"{p}.linear_attn"] = bare_layer(
                    QwenGatedDeltaNetAttention, tp_size=tp, num_k_heads=text.linear_num_key_heads,
                    num_v_heads=text.linear_num_value_heads, head_k_dim=text.linear_key_head_dim,
                    head_v_dim=text.linear_value_head_dim,
                    conv_kernel_size=text.linear_conv_kernel_dim, num_spec=k, model_config=model, cache_config=cache,
                    vllm_config=config, _checkpoint_alignment=FLASHINFER_GDN_CHECKPOINT_ALIGNMENT,
                    _max_num_batched_tokens=2048)
                continue
            indexer = f"{p}.self_attn.indexer"
            RawKeyCache(head_size=text.indexer_head_dim, dtype=torch.bfloat16, cache_rope_positions=mrope,
                           prefix=f"{indexer}.raw_key_cache", cache_config=cache,
                           compress_ratio=text.indexer_compress_ratio, vllm_config=config)
            QSACompressedKeyCache(head_size=text.indexer_head_dim, dtype=torch.bfloat16,
                                  compress_ratio=text.indexer_compress_ratio, prefix=f"{indexer}.compressed_key_cache",
                                  cache_config=cache, vllm_config=config)
            context[f"{p}.self_attn.attn"] = bare_layer(
                qsa.Qwen4ExpQSAAttention, num_kv_heads=kv_heads, head_dim=head_dim, kv_cache_dtype="auto",
                kv_cache_torch_dtype=torch.bfloat16, attn_backend=qsa_backend)
        backends: list[Any] = []   # Platform._find_non_ssm_backends' walk, and every backend for the layout
        for layer in context.values():
            if layer.get_attn_backend() not in backends:
                backends.append(layer.get_attn_backend())
        attention = [b for b in backends if not b.is_ssm()]
        cache.block_size = Platform._preferred_block_size_for_backends(
            attention, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        Platform._align_hybrid_block_size(config, attention[0])
        cache.mamba_block_size = cache.block_size   # MambaModelConfig in align mode (models/config.py:1106-1110)
        cache.kv_cache_layout = get_supported_kv_cache_layouts(backends)[0].name
        specs: dict[str, Any] = {}
        for name, layer in context.items():
            spec = layer.get_kv_cache_spec(config)
            specs[name] = customize_attention_spec(layer.get_attn_backend(), spec) \
                if isinstance(spec, AttentionSpec) else spec
        config.max_in_flight_tokens = case["max_in_flight_tokens"]
        answers.append(packed_answer(config, specs, case["kv_memory_bytes"], kv_cache_planning, kv_cache_utils))
    return answers


if __name__ == "__main__":
    run_oracle_script(main)
