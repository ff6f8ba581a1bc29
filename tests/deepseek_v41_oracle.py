"""vLLM's own KV cache for a DeepSeek-V4.1 config.json on CUDA SM 9.0: run as a script, one release per process.

    python tests/deepseek_v41_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers. The platform is made to report
compute capability 9.0 (the scope kvwatch plans: planner/deepseek_v41.py), so the release's own
checks pick what SM 9.0 gets: _use_v41_mxfp8_kv_record is False (584-byte records, 576-byte page
alignment, no block-stride alignment, vllm/models/deepseek_v41/attention.py:198-199, :576-632), the
V4.1 FlashMLA and indexer backends take 64-token kernel blocks (sparse_mla.py:116-117,
vllm/v1/attention/backends/mla/indexer.py:317-322), and the cache block size is what
Platform._preferred_block_size_for_backends picks for the backends the layers name, in layer order
(vllm/platforms/interface.py:710-757, :781-791). The specs are the layers' own get_kv_cache_spec
methods (DeepseekV4Attention for a kv source's compressed latent, DeepseekV4IndexerCache for its index
keys, DeepseekV4SWACache for the sliding window, CompressorStateCache for a ratio-2 compressor's state),
called on the attributes their constructors set; then get_kv_cache_groups, get_kv_cache_config_from_groups
for a KV budget and get_kv_cache_capacity for the tokens vLLM logs. Only the constructors' arithmetic is
the oracle's own, each line citing the 0.34.0 source: a layer's ratio (attention.py:381-392), which
layers own a compressed cache and index keys (:393-421, :503-517), the record sizes and alignments
(:570-632, the FlashMLA class: nvidia/flashmla.py:70-71, attention.py:266), the FP8 indexer key width
(attention.py:181-189), the compressor state (compressor.py:238-266, :335-342: 2 * head_dim float32
rows, ring of max(8, next power of two of num_speculative_tokens + 2)) and bounded replay on
(vllm/config/cache.py:379). A case with "dspark" (k speculative tokens) drafts with DSpark: k widens
the rings (compressor.py:250-252), and the draft's n_mtp_layers or num_nextn_predict_layers (3 when
neither) layers at layers.{num_hidden_layers + i} (nvidia/dspark.py:90-94, :125-134), registered after
the target's, are built as above: never kv or index sources past the backbone (attention.py:403-405).
It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    from vllm.config.attention import AttentionConfig
    from vllm.config.cache import CacheConfig
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability, Platform

    type(current_platform).get_device_capability = classmethod(   # type: ignore[method-assign]
        lambda cls, device_id=0: DeviceCapability(9, 0))
    from vllm.models.deepseek_v41 import attention
    from vllm.models.deepseek_v41.compressor import CompressorBackend, CompressorStateCache
    from vllm.models.deepseek_v41.nvidia.flashmla import DeepseekV4FlashMLAAttention
    from vllm.v1.attention.backends.mla.indexer import DeepseekV41IndexerBackend
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from vllm.v1.core import kv_cache_planning, kv_cache_utils

    assert not attention._use_v41_mxfp8_kv_record()
    ns = types.SimpleNamespace
    answers = []
    for case in cases:
        text = case["config"].get("text_config", case["config"])
        cache = CacheConfig()
        cache.cache_dtype = "fp8_ds_mla"   # auto and fp8 both resolve to it (attention.py:220-229)
        cache.kv_cache_layout = "BLHNC"    # the first layout the indexer backend lists (indexer.py:300-303)
        config = ns(cache_config=cache, attention_config=AttentionConfig(), model_config=None,
                    scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
                    parallel_config=ns(decode_context_parallel_size=1, prefill_context_parallel_size=1))
        # the backends the layers name, in layer order (attention first, then its swa cache, index
        # keys and compressor state): DSv4.1 FlashMLA, its SWA backend, the V4.1 indexer, the compressor
        backends = [DeepseekV4FlashMLAAttention.backend_cls, DeepseekV4FlashMLAAttention.swa_backend_cls,
                    DeepseekV41IndexerBackend, CompressorBackend]
        cache.block_size = Platform._preferred_block_size_for_backends(
            backends, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        ratios, kv_sources = text["compress_ratios"], set(text["kv_source_layer_ids"])
        index_sources = set(text["index_source_layer_ids"])
        record, alignment = 584, 576   # attention.py:577, :586 (kv_mxfp8 False)
        specs: dict[str, Any] = {}
        k, backbone = case.get("dspark", 0), text["num_hidden_layers"]
        drafts = (text.get("n_mtp_layers") or text.get("num_nextn_predict_layers") or 3) if k else 0
        for layer in range(backbone + drafts):
            ratio = int(ratios[layer]) if layer < len(ratios) else 0
            prefix = f"model.layers.{layer}.attn"
            source = layer < backbone and layer in kv_sources
            attn = ns(is_kv_source=source, kv_cache_dtype="fp8_ds_mla", compress_ratio=ratio,
                      head_dim=text["head_dim"], kv_cache_torch_dtype=torch.uint8, kv_page_alignment=alignment,
                      compressed_bytes_per_token=record)
            spec = attention.DeepseekV4Attention.get_kv_cache_spec(attn, config)
            if spec is not None:
                specs[prefix] = spec
            if layer < backbone and layer in index_sources and source:
                key = attention._indexer_k_cache_head_dim(text["index_head_dim"], False)
                index = ns(cache_config=cache, head_dim=key, dtype=torch.uint8, compress_ratio=ratio,
                           sparse_logits=False, rocm_mxfp4=False)
                specs[f"{prefix}.indexer.k_cache"] = attention.DeepseekV4IndexerCache.get_kv_cache_spec(index, config)
            swa = ns(bounded_replay=True, block_size=32, head_dim=text["head_dim"], dtype=torch.uint8,
                     window_size=text["sliding_window"], cache_config=cache, packed_bytes_per_token=record,
                     packed_page_alignment=alignment, packed_block_stride_alignment=None)
            specs[f"{prefix}.swa_cache"] = DeepseekV4SWACache.get_kv_cache_spec(swa, config)
            if source and ratio > 1:
                state = ns(block_size=max(8, 1 << (k + 2 - 1).bit_length()), state_dim=2 * text["head_dim"],
                           dtype=torch.float32)
                specs[f"{prefix}.compressor.state_cache"] = CompressorStateCache.get_kv_cache_spec(state, config)
        config.model_config = ns(max_model_len=case["max_model_len"])
        config.max_in_flight_tokens = case["max_in_flight_tokens"]   # VllmConfig.max_in_flight_tokens
        groups = kv_cache_planning.get_kv_cache_groups(config, specs)
        planned = kv_cache_planning.get_kv_cache_config_from_groups(config, groups, case["kv_memory_bytes"])
        answers.append({
            "block_size": cache.block_size,
            "specs": [[name, type(s).__name__, s.block_size, s.page_size_bytes] for name, s in specs.items()],
            "groups": [{"type": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
                        "block_size": g.kv_cache_spec.block_size,
                        "page_size_bytes": g.kv_cache_spec.page_size_bytes} for g in groups],
            "num_blocks": planned.num_blocks,
            "tokens": kv_cache_utils.get_kv_cache_capacity(config, planned)[0]})
    return answers


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))
