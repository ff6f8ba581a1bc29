"""vLLM's own KV cache for a Mistral Large 4 params.json: run as a script, one release per process.

    python tests/mistral_large4_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: the config as vLLM reads a
Mistral-format params.json (adapt_config_dict, vllm/transformers_utils/configs/mistral.py, whose fields
the answer records for kvwatch's own reading of the file), each layer's KV source and indexer
(get_layer_specs, vllm/models/mistral/common/layer_spec.py), the block size every backend accepts
(Platform._preferred_block_size_for_backends from CacheConfig.DEFAULT_BLOCK_SIZE), the layout they
all list (get_supported_kv_cache_layouts), each cache's spec (MistralIndexerCache and
MLAAttention.get_kv_cache_spec, each through the runner's customize_attention_spec with the layer's
backend), get_kv_cache_groups and get_kv_cache_config_from_groups for a KV budget, and
get_kv_cache_capacity for the tokens vLLM logs. Only the constructor's choices are the oracle's own,
citing vLLM 0.34.0: a KV-sharing layer registers no cache of its own (v1/worker/gpu/attn_utils.py:145-147);
a layer's indexer registers its keys before the latent (models/mistral/nvidia/attention.py:130-168),
`index_head_dim + index_head_dim // 128 * 4` uint8 bytes (nvidia/indexer.py:146-151); the latent is
`kv_lora_rank + qk_rope_head_dim` on every owning layer, NoPE ones included (attention.py:44-46,
:151-166); the KV cache dtype stays `auto` (bf16) where params.json's dsa section has no
`fp8_kv_cache` (model_executor/models/config.py:141-155); the sparse MLA backend is
FLASH_ATTN_MLA_SPARSE, CUDA SM 9.0's first for a 576 latent (platforms/cuda.py:137-152), which
takes a bf16 KV cache and a model with index_topk (flashattn_mla_sparse.py:81-116), and the
indexer's DeepseekV32IndexerBackend (nvidia/indexer.py:79-80); the backends in registration order
stand for Platform._find_non_ssm_backends' walk. A case with "dspark" adds the DSpark draft of
`--speculative-config` method dspark: vLLM's get_mistral_large_4_dspark_config reads the params.json's
`mtp` section (transformers_utils/configs/mistral.py:477-545), and its `n_layers` dense MLA layers at
layers.{n_layers of the target + i} (models/mistral/mistral_large4/nvidia/dspark.py:122-146,
:283-287) each register a latent of the target's width (no indexer, no KV sharing), non-causal, of the
window draft_attention_windows gives (none without `mtp.ragged_attention`: the oracle's scope), in the
`auto` dtype the DSpark config sets (v1/worker/gpu/spec_decode/dspark/config.py:69-74), on
FLASH_ATTN_MLA, CUDA SM 9.0's first dense MLA backend (platforms/cuda.py:146-154), which takes FA3 on
SM 9.x (flashattn_mla.py:69-88); the drafter loads before the block size is chosen
(v1/executor/uniproc_executor.py:74-75), so its backend joins the walk. What lets the model modules
import on a CPU is vllm_sources.cpu_imports's. It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import copy
import sys
import types
from pathlib import Path
from typing import Any

from vllm_sources import bare_layer, bare_vllm_config, cpu_imports, packed_answer, run_oracle_script

# The fields of vLLM's config that kvwatch's own reading of params.json must give the same
# (kvwatch/planner/mistral_large4.py `hf_config`).
READ_FIELDS = ("model_type", "architectures", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "hidden_size", "intermediate_size", "vocab_size", "max_position_embeddings", "dtype", "q_lora_rank",
               "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_topk", "index_head_dim",
               "index_n_heads", "kv_source_layers", "index_sharing", "fp8_kv_cache", "n_routed_experts",
               "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "first_k_dense_replace",
               "moe_layer_freq", "tie_word_embeddings", "quantization_config", "max_seq_len", "hidden_act",
               "rope_theta", "rope_parameters")


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    import vllm
    assert Path(vllm.__file__).is_relative_to(root)
    cpu_imports(root, "vllm.models.mistral.mistral_large4")   # its __init__ refuses a CPU platform
    from vllm.config.cache import CacheConfig
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.models.mistral.common.layer_spec import get_layer_specs
    from vllm.models.mistral.mistral_large4.nvidia.dspark import draft_attention_windows
    from vllm.models.mistral.nvidia.indexer import MistralIndexerCache
    from vllm.platforms.interface import Platform
    from vllm.transformers_utils.configs.mistral import adapt_config_dict, get_mistral_large_4_dspark_config
    from vllm.v1.attention.backends.mla.flashattn_mla import FlashAttnMLABackend
    from vllm.v1.attention.backends.mla.flashattn_mla_sparse import FlashAttnMLASparseBackend
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.core import kv_cache_planning, kv_cache_utils
    from vllm.v1.worker.utils import customize_attention_spec

    ns = types.SimpleNamespace


    answers = []
    for case in cases:
        text = adapt_config_dict(copy.deepcopy(case["params"]), defaults={})
        assert not getattr(text, "fp8_kv_cache", False), "the oracle's scope: a bf16 latent"
        cache = CacheConfig()
        model = ns(dtype=torch.bfloat16, max_model_len=case["max_model_len"], hf_text_config=text)
        config = bare_vllm_config(cache, model, case["tp"])
        layers = get_layer_specs(text)
        backends: list[Any] = []
        for spec in layers:
            for b in [DeepseekV32IndexerBackend] * spec.has_indexer + [FlashAttnMLASparseBackend]:
                if b not in backends:
                    backends.append(b)
        draft = get_mistral_large_4_dspark_config(text) if case.get("dspark") else None
        windows = draft_attention_windows(draft, case["dspark"]) if draft is not None else []
        assert not any(windows), "the oracle's scope: a DSpark draft with no sliding window"
        if draft is not None:
            backends.append(FlashAttnMLABackend)
        cache.block_size = Platform._preferred_block_size_for_backends(
            backends, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        cache.kv_cache_layout = get_supported_kv_cache_layouts(backends)[0].name
        specs: dict[str, Any] = {}
        for spec in layers:
            p = f"model.layers.{spec.layer_idx}.self_attn"
            if spec.has_indexer:
                keys = bare_layer(MistralIndexerCache, cache_config=cache, dtype=torch.uint8,
                            head_dim=text.index_head_dim + text.index_head_dim // 128 * 4)
                specs[f"{p}.indexer.k_cache"] = customize_attention_spec(
                    keys.get_attn_backend(), keys.get_kv_cache_spec(config))
            if spec.shares_kv:   # reads layer kv_source_layer's latent: no cache of its own
                continue
            mla = ns(kv_cache_dtype="auto", head_size=text.kv_lora_rank + text.qk_rope_head_dim, sliding_window=None,
                     topk_buffer_width=text.index_topk, indexer=object() if spec.has_indexer else None,
                     non_causal_multi_token_decode=False)
            specs[f"{p}.attn"] = customize_attention_spec(
                FlashAttnMLASparseBackend, MLAAttention.get_kv_cache_spec(mla, config))
        for i, window in enumerate(windows):   # the DSpark draft's dense, non-causal latents
            mla = ns(kv_cache_dtype="auto", head_size=draft.kv_lora_rank + draft.qk_rope_head_dim,
                     sliding_window=window, topk_buffer_width=None, indexer=None, non_causal_multi_token_decode=True)
            specs[f"model.layers.{text.num_hidden_layers + i}.self_attn.attn"] = customize_attention_spec(
                FlashAttnMLABackend, MLAAttention.get_kv_cache_spec(mla, config))
        config.max_in_flight_tokens = case["max_in_flight_tokens"]
        answer = packed_answer(config, specs, case["kv_memory_bytes"], kv_cache_planning, kv_cache_utils)
        answer["specs"] = [[name.split(".self_attn.")[1], type(s).__name__, s.block_size, s.page_size_bytes,
                            str(s.dtype).removeprefix("torch."), s.get_block_stride_alignment()]
                           for name, s in specs.items()]
        answer["config"] = {k: getattr(text, k, None) for k in READ_FIELDS}
        answer["config"]["dtype"] = str(answer["config"]["dtype"]).removeprefix("torch.")
        answers.append(answer)
    return answers


if __name__ == "__main__":
    run_oracle_script(main)
