"""vLLM's own KV cache for a DeepSeek-V4 config.json: run as a script, one release per process.

    python tests/deepseek_v4_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: the config as transformers
loads it (layer_types, compress_rates), the five get_kv_cache_spec methods the layers of one
DeepSeek-V4 decoder layer carry (DeepseekV4Attention for the compressed latent,
DeepseekV4SWACache for the sliding window, CompressorStateCache for the float32 compressor state,
DeepseekV4IndexerCache for the index keys, vllm/models/deepseek_v4/{attention,compressor}.py and
vllm/v1/attention/backends/mla/sparse_swa.py), called on the attributes the constructors set,
then get_kv_cache_groups (whose _get_packed_kv_cache_groups packs them) and
get_kv_cache_config_from_groups for a KV budget, and get_kv_cache_capacity for the tokens vLLM
logs ("GPU KV cache size: N tokens") at a max_model_len and max_in_flight_tokens.
Only the constructors' arithmetic is the oracle's own, each line citing the 0.34.0 source:
the layer's compress ratio (attention.py:238-243: layer_types through compress_rates, 1 for MTP
layers), the KV dtype (attention.py:95-130 with use_fp8_ds_mla_layout True, the class CUDA picks
on SM 9.0 and SM 12.0 by default, nvidia/model.py:567-570), the main block size (the sparse MLA
and indexer backends' kernel block size 256, sparse_mla.py:60, indexer.py:306), the SWA cache's
defaults (sparse_swa.py:85-88), the state cache's block size and window (compressor.py:158-171),
its width 2 * coff * head_dim (compressor.py:298) and the layout (indexer.py:300-303, BLHNC first) and the FP8 indexer key width
head_dim + head_dim // 128 * 4 (attention.py:983-986). MTP layers (num_nextn_predict_layers,
nvidia/mtp.py:214-215) join the same KV cache config when a speculative config asks for them; so do
a DSpark draft's `n_mtp_layers` (3 when unset or 0) DeepseekV4DecoderLayer at
layers.{num_hidden_layers + i} (nvidia/dspark.py:106, :132-141, the same lines in 0.33.0) for a case
with "dspark". It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any


def _state(ratio: int, head_dim: int, config: Any) -> Any:
    """CompressorStateCache's spec, on the attributes its constructor sets (compressor.py:139-172, :298)."""
    import torch
    from vllm.models.deepseek_v4.compressor import CompressorStateCache
    coff = 1 + (ratio == 4)
    state = types.SimpleNamespace(block_size={4: 4, 128: 8}[ratio], state_dim=2 * coff * head_dim,
                                  dtype=torch.float32, sliding_window=coff * ratio)
    return CompressorStateCache.get_kv_cache_spec(state, config)


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    import transformers
    from vllm.config.attention import AttentionConfig
    from vllm.config.cache import CacheConfig
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention, DeepseekV4IndexerCache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.core import kv_cache_planning, kv_cache_utils

    ns = types.SimpleNamespace
    answers = []
    for case in cases:
        text = transformers.AutoConfig.for_model(**case["config"])
        cache = CacheConfig()
        cache.block_size = 256
        cache.cache_dtype = "fp8_ds_mla"   # auto and fp8 both resolve to it (attention.py:108-124)
        cache.kv_cache_layout = "BLHNC"    # the first layout DeepSeek-V4's indexer backend lists
        config = ns(cache_config=cache, attention_config=AttentionConfig(), model_config=None,
                    scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
                    parallel_config=ns(decode_context_parallel_size=1, prefill_context_parallel_size=1))
        drafts = text.num_nextn_predict_layers if case.get("mtp") else \
            (getattr(text, "n_mtp_layers", None) or 3) if case.get("dspark") else 0
        layers = text.num_hidden_layers + drafts
        specs: dict[str, Any] = {}
        for layer in range(layers):
            ratio = max(1, text.compress_rates.get(text.layer_types[layer], 0)) \
                if layer < text.num_hidden_layers else 1
            prefix = f"model.layers.{layer}.attn"
            # in the order the layer's constructor registers its caches (attention.py:304-373)
            if ratio == 4:
                key = text.index_head_dim + text.index_head_dim // 128 * 4
                index = ns(cache_config=cache, head_dim=key, dtype=torch.uint8, compress_ratio=ratio)
                specs[f"{prefix}.indexer.k_cache"] = DeepseekV4IndexerCache.get_kv_cache_spec(index, config)
                specs[f"{prefix}.indexer.compressor.state_cache"] = _state(ratio, text.index_head_dim, config)
            swa = ns(bounded_replay=False, block_size=64, head_dim=text.head_dim, dtype=torch.uint8,
                     window_size=text.sliding_window, cache_config=cache, packed_bytes_per_token=584,
                     packed_page_alignment=576, packed_block_stride_alignment=None)
            specs[f"{prefix}.swa_cache"] = DeepseekV4SWACache.get_kv_cache_spec(swa, config)
            if ratio > 1:
                attn = ns(compress_ratio=ratio, kv_cache_dtype="fp8_ds_mla", head_dim=text.head_dim,
                          kv_cache_torch_dtype=torch.uint8)
                specs[prefix] = DeepseekV4Attention.get_kv_cache_spec(attn, config)
                specs[f"{prefix}.compressor.state_cache"] = _state(ratio, text.head_dim, config)
        config.model_config = ns(max_model_len=case["max_model_len"])
        config.max_in_flight_tokens = case["max_in_flight_tokens"]   # VllmConfig.max_in_flight_tokens (config/vllm.py:569)
        groups = kv_cache_planning.get_kv_cache_groups(config, specs)
        planned = kv_cache_planning.get_kv_cache_config_from_groups(config, groups, case["kv_memory_bytes"])
        kinds: dict[str, dict[str, Any]] = {}
        for name, spec in specs.items():
            kind = f"{name.split('.attn', 1)[1].lstrip('.') or 'latent'} block {spec.block_size}"
            kinds.setdefault(kind, {"page_size_bytes": [], "dtype": str(spec.dtype).removeprefix("torch."),
                                    "window": getattr(spec, "sliding_window", None) or 0})
            kinds[kind]["page_size_bytes"].append(spec.page_size_bytes)
        answers.append({
            "groups": [{"type": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
                        "block_size": g.kv_cache_spec.block_size,
                        "page_size_bytes": g.kv_cache_spec.page_size_bytes} for g in groups],
            "num_blocks": planned.num_blocks, "kinds": kinds,
            "tokens": kv_cache_utils.get_kv_cache_capacity(config, planned)[0]})
    return answers


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))
