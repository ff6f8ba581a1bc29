"""vLLM's own KV cache for a full-attention target with extract_hidden_states' hidden-state cache: run as a
script, one release per process.

    python tests/hidden_state_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: each target layer's spec from
Attention.get_kv_cache_spec (a decoder layer, no window: model_executor/layers/attention/attention.py,
vLLM 0.34.0 :637-713), the hidden-state layer's from CacheOnlyAttentionLayer.get_kv_cache_spec
(model_executor/models/extract_hidden_states.py:306-313; 0.33.0 the same lines) with the heads and dtype
ExtractHiddenStatesModel gives it: len(eagle_aux_hidden_state_layer_ids) heads of the hidden size, in the
model dtype where the KV cache is quantized (:331-357, :338-339), then get_kv_cache_groups,
get_kv_cache_config_from_groups for a KV budget and get_kv_cache_capacity (vllm_sources.packed_answer), at
the block size Platform._preferred_block_size_for_backends picks from CacheConfig.DEFAULT_BLOCK_SIZE for
the target's FLASH_ATTN (CUDA SM 9.0's first decoder backend: platforms/cuda.py:166-178 in 0.34) and the
hidden-state layer's CACHE_ONLY_ATTN. A case names the target's layers, KV heads per rank, head size and
KV dtype. It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from vllm_sources import cpu_imports, packed_answer, run_oracle_script


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    import vllm
    assert Path(vllm.__file__).is_relative_to(root)
    cpu_imports(root)
    from vllm.config.cache import CacheConfig
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionBackend, CacheOnlyAttentionLayer
    from vllm.platforms.interface import Platform
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.core import kv_cache_planning, kv_cache_utils

    ns = types.SimpleNamespace
    answers = []
    for case in cases:
        cache = CacheConfig()
        cache.kv_cache_layout = "NHD"
        model_dtype = getattr(torch, case["dtype"])
        model = ns(dtype=model_dtype, max_model_len=case["max_model_len"], hf_text_config=ns(),
                   get_head_size=lambda case=case: case["head_size"])   # what FLASH_ATTN's block sizes read
        cache.cache_dtype = case["kv_cache_dtype"]
        config = ns(cache_config=cache, model_config=model, compilation_config=ns(static_forward_context={}),
                    scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
                    attention_config=ns(hisparse_config=None), num_gpu_blocks_override=None,
                    parallel_config=ns(tensor_parallel_size=case["tp"], decode_context_parallel_size=1,
                                       prefill_context_parallel_size=1),
                    speculative_config=None, max_in_flight_tokens=case["max_in_flight_tokens"])
        cache.block_size = Platform._preferred_block_size_for_backends(
            [FlashAttentionBackend, CacheOnlyAttentionBackend], CacheConfig.DEFAULT_BLOCK_SIZE, config)
        kv_dtype = case["kv_cache_dtype"]
        layer = ns(attn_type=AttentionType.DECODER, kv_cache_dtype=kv_dtype, sliding_window=None,
                   num_kv_heads=case["kv_heads"], head_size=case["head_size"], head_size_v=case["head_size"],
                   kv_cache_torch_dtype=kv_cache_dtype_str_to_dtype(kv_dtype, model))
        specs: dict[str, Any] = {f"model.layers.{i}.self_attn.attn": Attention.get_kv_cache_spec(layer, config)
                                 for i in range(case["layers"])}
        # a quantized KV cache is "auto" for the hidden states (extract_hidden_states.py:338-339)
        hidden = ns(num_heads=case["aux_layers"], head_size=case["hidden_size"], kv_cache_torch_dtype=model_dtype)
        specs[f"cache_only_layers.{case['layers']}"] = CacheOnlyAttentionLayer.get_kv_cache_spec(hidden, config)
        answer = packed_answer(config, specs, case["kv_memory_bytes"], kv_cache_planning, kv_cache_utils)
        answer["specs"] = sorted({(type(s).__name__, s.block_size, s.page_size_bytes) for s in specs.values()})
        answers.append(answer)
    return answers


if __name__ == "__main__":
    run_oracle_script(main)
