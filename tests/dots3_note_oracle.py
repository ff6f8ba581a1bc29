"""vLLM's own KV cache for a Dots3 (dots3_note) config.json: run as a script, one release per process.

    python tests/dots3_note_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers: the config as its Dots3NoteConfig
loads it (vllm/transformers_utils/configs/dots3_note.py), the block size every backend accepts (Platform._preferred_block_size_for_backends from
CacheConfig.DEFAULT_BLOCK_SIZE), the layout they all list (get_supported_kv_cache_layouts), each cache's
spec (MLAAttention.get_kv_cache_spec for a sliding layer, Dots3NotePaddedMLAAttention.get_kv_cache_spec
for a DSA layer's padded latent, DeepseekV32IndexerCache.get_kv_cache_spec for its indexer keys, each
through the runner's customize_attention_spec with the layer's backend), get_kv_cache_groups and
get_kv_cache_config_from_groups for a KV budget, and get_kv_cache_capacity for the tokens vLLM logs.
Only the constructor's arithmetic is the oracle's own, citing vllm/models/dots3_note/nvidia/model.py
(0.34.0; 0.33.0 has the same lines): a layer is sliding where `layer_types[i]` is "sliding_attention"
(:525-529), its latent `swa_kv_lora_rank + swa_qk_rope_head_dim` with window `sliding_window_size`
and Dots3NoteTritonMLABackend (:353-481); a DSA layer's latent `kv_lora_rank + qk_rope_head_dim`
padded to the sliding latent, its backend Dots3NotePaddedSparseBackend, its indexer key
`index_head_dim + index_head_dim // 128 * 4` uint8 bytes (:228-307, deepseek_v2.py:731-736), the
indexer registering before the latent, on the layers DeepseekV2MLAAttention's IndexCache rule keeps
(deepseek_v2.py:1138-1169); the backends in that registration order stand for
Platform._find_non_ssm_backends' walk over the built layers. What lets the model module import on a CPU
is vllm_sources.cpu_imports's (two package __init__s skipped, one name set as vLLM sets it off CUDA).
A case with "mtp" (k speculative tokens) adds the MTP draft's layers: the release's own
SpeculativeConfig.hf_config_override appends `mtp_layer_types` to `layer_types` and sets n_predict
(config/speculative.py:832-846), and Dots3NoteMultiTokenPredictor's decoder layers at indices
num_hidden_layers .. + n_predict - 1 (models/dots3_note/nvidia/mtp.py:103-120) are built as above,
a DSA one always with its indexer (deepseek_v2.py:1157-1168); every sliding window then retains
num_prefill_lookahead_tokens - 1 more tokens (v1/core/kv_cache_planning.py:1742-1748), here from the
release's own SpeculativeConfig.use_multi_module_mtp and, in 0.34, its speculator config's
num_prefill_lookahead_tokens (in 0.33, VllmConfig.num_prefill_lookahead_tokens, config/vllm.py:655-675).
It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

from vllm_sources import bare_layer, bare_vllm_config, cpu_imports, packed_answer, run_oracle_script


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    import vllm
    assert Path(vllm.__file__).is_relative_to(root)
    cpu_imports(root, "vllm.models.dots3_note")
    from vllm.config import VllmConfig
    from vllm.config.cache import CacheConfig
    from vllm.config.speculative import SpeculativeConfig
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
    from vllm.models.dots3_note.nvidia.attention import Dots3NotePaddedSparseBackend, Dots3NoteTritonMLABackend
    from vllm.models.dots3_note.nvidia.model import Dots3NotePaddedMLAAttention
    from vllm.platforms.interface import Platform
    from vllm.transformers_utils.configs.dots3_note import Dots3NoteConfig
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.core import kv_cache_planning, kv_cache_utils
    from vllm.v1.kv_cache_interface import SlidingWindowSpec
    from vllm.v1.worker.utils import customize_attention_spec

    ns = types.SimpleNamespace


    def has_indexer(text: Any, layer: int) -> bool:
        """DeepseekV2MLAAttention.__init__'s own rule, run up to its decision (deepseek_v2.py:1138-1169)."""
        freq = getattr(text, "index_topk_freq", 1)
        pattern = getattr(text, "index_topk_pattern", None)
        offset = getattr(text, "index_skip_topk_offset", 2)
        skip = (max(layer - offset + 1, 0) % freq != 0) if pattern is None \
            else (0 <= layer < len(pattern) and pattern[layer] == "S")
        mtp = layer >= text.num_hidden_layers   # a draft layer always builds its indexer (:1157-1168)
        return hasattr(text, "index_topk") and (not skip or mtp)

    def lookahead(text: Any, k: int) -> int:
        """num_prefill_lookahead_tokens of an MTP draft of k tokens, by the release's own code."""
        draft = ns(method="mtp", num_speculative_tokens=k, index_share_for_mtp_iteration=None,
                   draft_model_config=ns(hf_config=text))
        for method in ("num_mtp_modules", "use_multi_module_mtp", "use_eagle"):
            if hasattr(SpeculativeConfig, method):
                setattr(draft, method, types.MethodType(getattr(SpeculativeConfig, method), draft))
        try:   # 0.34: the speculator config's (v1/worker/gpu/spec_decode/*/config.py)
            from vllm.v1.worker.gpu.spec_decode.mtp.config import MTPSpeculatorConfig
            from vllm.v1.worker.gpu.spec_decode.multi_module_mtp.config import MultiModuleMTPSpeculatorConfig
        except ImportError:   # 0.33: VllmConfig's own
            return int(VllmConfig.num_prefill_lookahead_tokens.fget(   # type: ignore[attr-defined]
                ns(speculative_config=draft, num_speculative_tokens=k)))
        speculator = MultiModuleMTPSpeculatorConfig if draft.use_multi_module_mtp() else MTPSpeculatorConfig
        return int(speculator.num_prefill_lookahead_tokens.fget(   # type: ignore[attr-defined]
            ns(num_speculative_tokens=k, uses_target_hidden_states=speculator.uses_target_hidden_states)))

    answers = []
    for case in cases:
        text = Dots3NoteConfig(**{k: v for k, v in case["config"].items() if k not in ("model_type", "torch_dtype")})
        k = case.get("mtp", 0)
        if k:   # the draft's hf_config as the release makes it
            text = SpeculativeConfig.hf_config_override(text)
        cache = CacheConfig()
        model = ns(dtype=torch.bfloat16, max_model_len=case["max_model_len"], hf_text_config=text)
        config = bare_vllm_config(cache, model, case["tp"])
        swa = text.swa_kv_lora_rank + text.swa_qk_rope_head_dim
        latent = text.kv_lora_rank + text.qk_rope_head_dim
        kinds = ["sliding" if text.layer_types[i] == "sliding_attention" else "dsa"
                 for i in range(text.num_hidden_layers + (text.n_predict if k else 0))]
        backends: list[Any] = []
        for i, kind in enumerate(kinds):
            layer_backends = [Dots3NoteTritonMLABackend] if kind == "sliding" else \
                [DeepseekV32IndexerBackend] * has_indexer(text, i) + [Dots3NotePaddedSparseBackend]
            backends += [b for b in layer_backends if b not in backends]
        cache.block_size = Platform._preferred_block_size_for_backends(
            backends, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        cache.kv_cache_layout = get_supported_kv_cache_layouts(backends)[0].name
        specs: dict[str, Any] = {}
        for i, kind in enumerate(kinds):
            p = f"model.layers.{i}.self_attn"
            if kind == "sliding":
                mla = ns(kv_cache_dtype="auto", head_size=swa, sliding_window=text.sliding_window_size,
                         non_causal_multi_token_decode=False)
                specs[f"{p}.attn"] = customize_attention_spec(
                    Dots3NoteTritonMLABackend, MLAAttention.get_kv_cache_spec(mla, config))
                continue
            indexer = has_indexer(text, i)
            if indexer:
                keys = bare_layer(DeepseekV32IndexerCache, cache_config=cache, dtype=torch.uint8,
                            head_dim=text.index_head_dim + text.index_head_dim // 128 * 4)
                specs[f"{p}.indexer.k_cache"] = customize_attention_spec(
                    DeepseekV32IndexerBackend, keys.get_kv_cache_spec(config))
            padded = bare_layer(Dots3NotePaddedMLAAttention, kv_cache_dtype="auto", head_size=latent,
                          physical_head_size=swa, sliding_window=None, topk_buffer_width=text.index_topk,
                          indexer=object() if indexer else None, non_causal_multi_token_decode=False)
            specs[f"{p}.mla_attn"] = customize_attention_spec(
                Dots3NotePaddedSparseBackend, padded.get_kv_cache_spec(config))
        if k:
            extra = max(0, lookahead(text, k) - 1)
            for name, spec in specs.items():   # kv_cache_planning.py:1742-1748
                if isinstance(spec, SlidingWindowSpec):
                    specs[name] = dataclasses.replace(spec, extra_retained_tokens=extra)
        config.max_in_flight_tokens = case["max_in_flight_tokens"]
        answer = packed_answer(config, specs, case["kv_memory_bytes"], kv_cache_planning, kv_cache_utils)
        answer["specs"] = [[name.split(".self_attn.")[1], type(s).__name__, s.block_size, s.page_size_bytes,
                            str(s.dtype).removeprefix("torch."), getattr(s, "sliding_window", None) or 0,
                            s.get_block_stride_alignment()] for name, s in specs.items()]
        answers.append(answer)
    return answers


if __name__ == "__main__":
    run_oracle_script(main)
