"""vLLM's own KV cache for a GLM-5-Next config.json: run as a script, one release per process.

    python tests/glm5_next_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: the config as transformers'
Glm5NextTextConfig loads it, the block size (Platform._preferred_block_size_for_backends from
CacheConfig.DEFAULT_BLOCK_SIZE, then Platform._align_hybrid_block_size, which resolves the model class
through vLLM's registry for its KDA state shape and dtypes), the layout every backend lists
(get_supported_kv_cache_layouts), each cache's spec (Glm5NextLinearAttention,
Glm5NextIndexerCache, Glm5NextTailCache and MLAAttention.get_kv_cache_spec, each attention spec
through the runner's customize_attention_spec), get_kv_cache_groups and
get_kv_cache_config_from_groups for a KV budget, and get_kv_cache_capacity for the tokens vLLM logs.
The scope is the oracle's own, citing vLLM 0.34.0: CUDA SM 9.0, whose first sparse MLA backend for a
512 head is FLASHINFER_MLA_SPARSE_SM90 with FlashInfer >= 0.6.18 (platforms/cuda.py:136-152); the
indexer's paged-MQA pages off SM 12.x, which is what vllm/utils/deep_gemm.py:43 answers on this CPU
too; the backends in the order an MLA layer registers them (the indexer's keys, its tail ring, the
latent: models/glm5next/common/attention.py:260-275, :536-574), standing for
Platform._find_non_ssm_backends' walk over the built layers; FlashKDA as the KDA prefill backend on
SM 9.0 for a bf16 model of head_dim 128 and a bounded gate (common/kda.py:141-164); the Mamba cache
mode "align" and mamba_block_size = block_size that prefix caching, on by default, sets
(model_executor/models/config.py:1094-1110). A case with "mtp" (k speculative tokens) drafts with the
checkpoint's MTP head: the speculative config the KDA layers, the tail rings and the block read
(num_speculative_tokens), and the draft's num_nextn_predict_layers MLA layers at
model.layers.{num_hidden_layers + i}, registered after the target's and built as its MLA layers
(models/glm5next/common/mtp.py:70-81, :112-128, model.py:472); else no speculative decoding.
glm5next's model module imports
the GLM-4.1V image processor, whose transformers module needs torchvision: where it is not
installed an empty package stands in (no answer reads it). It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from vllm_sources import bare_layer, bare_vllm_config, packed_answer, run_oracle_script


def _stub_torchvision() -> None:
    """An empty torchvision package where none is installed (see above)."""
    import importlib.abc
    import importlib.machinery
    import importlib.util
    if importlib.util.find_spec("torchvision") is not None:
        return

    class Empty(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name == "torchvision" or name.startswith("torchvision."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec: Any) -> None:
            return None

        def exec_module(self, module: Any) -> None:
            module.__path__ = []
            module.__getattr__ = lambda attr: type(attr, (), {})
    sys.meta_path.insert(0, Empty())


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    from transformers import Glm5NextTextConfig
    from vllm.config.cache import CacheConfig
    _stub_torchvision()
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.models.glm5next.common.attention import Glm5NextIndexerCache, Glm5NextTailCache
    from vllm.models.glm5next.common.kda import Glm5NextLinearAttention
    from vllm.models.glm5next.common.model import get_sparse_topk_buffer_width
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse_sm90 import FlashInferMLASparseSM90Backend
    from vllm.v1.attention.backends.mla.indexer import Glm5NextIndexerBackend, KpoolTailBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.core import kv_cache_planning, kv_cache_utils
    from vllm.v1.worker.utils import customize_attention_spec

    ns = types.SimpleNamespace
    backends = [Glm5NextIndexerBackend, KpoolTailBackend, FlashInferMLASparseSM90Backend]

    class Cuda(Platform):   # the walk over the built layers' backends, in their order (see above)
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config: Any) -> list[Any]:
            return backends

    answers = []
    for case in cases:
        text = Glm5NextTextConfig(**{k: v for k, v in case["config"].items()
                                     if k not in ("architectures", "model_type", "torch_dtype")})
        tp, k = case["tp"], case.get("mtp", 0)
        cache = CacheConfig()
        cache.mamba_cache_mode = "align"
        latent = text.kv_lora_rank + text.qk_rope_head_dim   # an MLA model's head size: the latent a token
        model = ns(use_mla=True, dtype=torch.bfloat16, architecture="Glm5NextForCausalLM", hf_text_config=text,
                   is_hybrid=True, model_impl="auto", get_num_kv_heads=lambda _: 1,
                   get_head_size=lambda h=latent: h, max_model_len=case["max_model_len"])
        config = bare_vllm_config(cache, model, tp, k, use_flashinfer_replayssm=False)
        cache.block_size = Cuda._preferred_block_size_for_backends(backends, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        Cuda._align_hybrid_block_size(config, backends[0])
        cache.mamba_block_size = cache.block_size   # MambaModelConfig in align mode (models/config.py:1106-1110)
        cache.kv_cache_layout = get_supported_kv_cache_layouts(backends)[0].name
        config.compilation_config.static_forward_context = {}

        specs: dict[str, Any] = {}
        kpool = text.index_kpool
        kda_backend = "flashkda" if text.linear_head_dim == 128 and text.linear_lower_bound is not None else "triton"
        draft = ["indexed_attention"] * (text.num_nextn_predict_layers if k else 0)   # MTP: MLA (model.py:472)
        for i, kind in enumerate([*text.layer_types, *draft]):
            p = f"model.layers.{i}.self_attn"   # the draft's decoder layer takes its own prefix (mtp.py:74-78)
            if kind == "linear_attention":
                kda = bare_layer(Glm5NextLinearAttention, tp_size=tp, num_heads=text.linear_num_heads,
                           head_dim=text.linear_head_dim, conv_size=text.linear_conv_kernel_dim, num_spec=k,
                           model_config=model, cache_config=cache, kda_prefill_backend=kda_backend)
                specs[p] = kda.get_kv_cache_spec(config)
                continue
            index = bare_layer(Glm5NextIndexerCache, cache_config=cache, dtype=torch.uint8, _index_kpool=kpool,
                         head_dim=text.index_head_dim + text.index_head_dim // 128 * 4)   # attention.py:260-266
            specs[f"{p}.indexer.k_cache"] = customize_attention_spec(
                Glm5NextIndexerBackend, index.get_kv_cache_spec(config))
            tail = bare_layer(Glm5NextTailCache, cache_config=cache, _index_kpool=kpool, head_dim=text.index_head_dim)
            specs[f"{p}.indexer.tail_cache"] = customize_attention_spec(KpoolTailBackend, tail.get_kv_cache_spec(config))
            mla = ns(kv_cache_dtype="auto", head_size=latent, sliding_window=None,
                     topk_buffer_width=get_sparse_topk_buffer_width(text), indexer=object(),
                     non_causal_multi_token_decode=False)
            specs[f"{p}.mla_attn"] = customize_attention_spec(backends[2], MLAAttention.get_kv_cache_spec(mla, config))
        model.max_model_len = case["max_model_len"]
        config.max_in_flight_tokens = case["max_in_flight_tokens"]
        answers.append(packed_answer(config, specs, case["kv_memory_bytes"], kv_cache_planning, kv_cache_utils))
    return answers


if __name__ == "__main__":
    run_oracle_script(main)
