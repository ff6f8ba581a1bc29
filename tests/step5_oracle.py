"""vLLM's own KV cache for a Step5 config.json: run as a script, one release per process.

    python tests/step5_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: the config as its Step5Config
loads it (vllm/transformers_utils/configs/step5.py), the sparse section and each layer's DSA choice
(get_step5_sparse_config, _is_step5_full_attention_layer, _per_layer_value, _get_step5_layer_types),
the block size every backend accepts (Platform._preferred_block_size_for_backends from
CacheConfig.DEFAULT_BLOCK_SIZE), the layout they all list (get_supported_kv_cache_layouts), each
cache's spec (Attention.get_kv_cache_spec for the sliding and DSA layers,
Step5SparseSummaryCacheLayer and Step5CSATailRing.get_kv_cache_spec, each through the runner's
customize_attention_spec), get_kv_cache_groups and get_kv_cache_config_from_groups for a KV budget,
and get_kv_cache_capacity for the tokens vLLM logs at a max_model_len and max_in_flight_tokens.
Only the constructor's arithmetic is the oracle's own, citing vLLM 0.34.0
vllm/models/step5/nvidia/model.py: the layer's default type (:886-893), its window (:899-904), its
heads and head_dim (:1858-1872, :944, :951) and its DSA backend (:1008). A case with "mtp" (k
speculative tokens) adds the MTP draft's layers: Step5MultiTokenPredictor's decoder layers at
indices num_hidden_layers .. + num_nextn_predict_layers - 1, registered after the target's
(models/step5/nvidia/mtp.py:175-201), each built as above; the tail ring's 7 + k rows
(common/csa_tail_ring.py:182); and the sliding windows' retained tokens, which
get_global_kv_cache_groups sets from VllmConfig.num_prefill_lookahead_tokens
(v1/core/kv_cache_planning.py:1742-1748), here from the release's own
SpeculativeConfig.use_multi_module_mtp and its speculator config's num_prefill_lookahead_tokens.
It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

from vllm_sources import packed_answer, run_oracle_script


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    from vllm.config.cache import CacheConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.models.step5.common.csa_tail_ring import Step5CSATailRing, Step5CSATailRingBackend
    from vllm.models.step5.common.sparse_summary_cache import (
        Step5SparseSummaryBackend,
        Step5SparseSummaryCacheLayer,
    )
    from vllm.models.step5.nvidia import model as step5
    from vllm.models.step5.nvidia.sparse_attention import (
        Step5DSAAttentionBackend,
        Step5SplitKVFlashAttentionBackend,
    )
    from vllm.platforms.interface import Platform
    from vllm.transformers_utils.configs.step5 import Step5Config
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.core import kv_cache_planning, kv_cache_utils
    from vllm.v1.kv_cache_interface import SlidingWindowSpec
    from vllm.v1.worker.gpu.spec_decode.mtp.config import MTPSpeculatorConfig
    from vllm.v1.worker.gpu.spec_decode.multi_module_mtp.config import MultiModuleMTPSpeculatorConfig
    from vllm.v1.worker.utils import customize_attention_spec

    ns = types.SimpleNamespace
    answers = []
    for case in cases:
        text = Step5Config(**{k: v for k, v in case["config"].items() if k not in ("architectures", "model_type")})
        sparse = step5.get_step5_sparse_config(text)
        layer_types = step5._get_step5_layer_types(text)
        other = text.attention_other_setting or {}
        tp = case["tp"]
        cache = CacheConfig()
        config = ns(cache_config=cache, model_config=None, compilation_config=ns(static_forward_context={}),
                    scheduler_config=ns(disable_hybrid_kv_cache_manager=False),
                    attention_config=ns(hisparse_config=None), num_gpu_blocks_override=None,
                    parallel_config=ns(decode_context_parallel_size=1, prefill_context_parallel_size=1))
        layers = []
        k = case.get("mtp", 0)
        for i in range(text.num_hidden_layers + (text.num_nextn_predict_layers if k else 0)):
            default = "sliding_attention" if i % 2 == 0 else "full_attention"   # model.py:886-893
            layer_type = step5._per_layer_value(layer_types, i, name="layer_types", default=default)
            window = text.sliding_window if layer_type == "sliding_attention" else None   # :899-904
            own = bool(other) and i < len(layer_types) and layer_types[i] == other["attention_type"]
            heads = (other["num_attention_heads"] if own else None) or text.num_attention_heads
            if window is not None and text.swa_num_attention_heads is not None:
                heads = text.swa_num_attention_heads                                         # :899-902
            kv = (other["num_attention_groups"] if own else None) or text.num_attention_groups
            head_dim = (other["head_dim"] if own else None) or text.head_dim or text.hidden_size // heads  # :951
            dsa = sparse is not None and step5._is_step5_full_attention_layer(text, i, sparse) and window is None
            backend = Step5DSAAttentionBackend if dsa else Step5SplitKVFlashAttentionBackend   # :1008, :1163-1169
            block = "" if i < text.num_hidden_layers else ".mtp_block"   # the draft's (mtp.py:115-118)
            layers.append((f"model.layers.{i}{block}.self_attn.attn", backend, ns(
                attn_type=AttentionType.DECODER, kv_cache_dtype="auto", sliding_window=window,
                attn_backend=backend, num_kv_heads=max(1, kv // tp), head_size=head_dim, head_size_v=head_dim,
                kv_cache_torch_dtype=torch.bfloat16)))                                    # :944
        backends: list[Any] = []   # in the order the layers register (platforms/interface.py:689-707)
        for _, backend, _ in layers:
            for b in (backend, Step5SparseSummaryBackend, Step5CSATailRingBackend) \
                    if backend is Step5DSAAttentionBackend else (backend,):
                if b not in backends:
                    backends.append(b)
        cache.block_size = Platform._preferred_block_size_for_backends(
            backends, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        cache.kv_cache_layout = get_supported_kv_cache_layouts(backends)[0].name
        specs: dict[str, Any] = {}
        for name, backend, attn in layers:
            attn.get_kv_cache_spec = lambda c, a=attn: Attention.get_kv_cache_spec(a, c)
            specs[name] = customize_attention_spec(backend, attn.get_kv_cache_spec(config))
            if backend is Step5DSAAttentionBackend:
                summary = Step5SparseSummaryCacheLayer.get_kv_cache_spec(ns(), config)
                specs[f"{name}.sparse_summary_cache"] = customize_attention_spec(Step5SparseSummaryBackend, summary)
                ring = ns(_static_forward_context={name: attn}, main_layer_name=name, required_rows=7 + k)
                specs[f"{name}.csa_tail_ring"] = customize_attention_spec(
                    Step5CSATailRingBackend, Step5CSATailRing.get_kv_cache_spec(ring, config))
        if k:   # the draft's hf_config as config/speculative.py:1172-1185 makes it
            draft = ns(method="mtp", num_speculative_tokens=k, index_share_for_mtp_iteration=None,
                       draft_model_config=ns(hf_config=ns(model_type="step5_mtp",
                                                          n_predict=text.num_nextn_predict_layers)))
            draft.num_mtp_modules = types.MethodType(SpeculativeConfig.num_mtp_modules, draft)
            speculator = MultiModuleMTPSpeculatorConfig if SpeculativeConfig.use_multi_module_mtp(draft) \
                else MTPSpeculatorConfig
            lookahead = speculator.num_prefill_lookahead_tokens.fget(   # type: ignore[attr-defined]
                ns(num_speculative_tokens=k, uses_target_hidden_states=speculator.uses_target_hidden_states))
            for name, spec in specs.items():   # kv_cache_planning.py:1742-1748
                if isinstance(spec, SlidingWindowSpec):
                    specs[name] = dataclasses.replace(spec, extra_retained_tokens=max(0, lookahead - 1))
        config.model_config = ns(max_model_len=case["max_model_len"])
        config.max_in_flight_tokens = case["max_in_flight_tokens"]   # VllmConfig.max_in_flight_tokens
        answers.append(packed_answer(config, specs, case["kv_memory_bytes"], kv_cache_planning, kv_cache_utils))
    return answers


if __name__ == "__main__":
    run_oracle_script(main)
