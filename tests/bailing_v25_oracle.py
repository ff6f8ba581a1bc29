"""vLLM's own KV cache for a Bailing MoE V2.5 config.json: run as a script, one release per process.

    python tests/bailing_v25_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers, compiled out of the files whose
modules need CUDA kernels to import: which layers are linear (is_linear_layer, with the
`layer_group_size` default BailingMoeV25Model.__init__ reads), the state's shape and dtype
(BailingMoeV25ForCausalLM.get_mamba_state_shape_from_config / _dtype_from_config and
LinearAttention.get_state_shape / get_state_dtype, with MambaStateShapeCalculator and
MambaStateDtypeCalculator), the state layer's spec (MambaBase.get_kv_cache_spec), the MLA layer's
(MLAAttention.get_kv_cache_spec), the mamba cache mode (MambaModelConfig.verify_and_update_config),
the hybrid block size and padded state page (Platform._align_hybrid_block_size, with the named
backend's own kernel block sizes), get_kv_cache_groups and get_kv_cache_config_from_groups (the groups
and blocks of a KV budget). Only the layer constructors' arithmetic is the oracle's: the MLA head
(kv_lora_rank + qk_rope_head_dim, the model's defaults 512 and 64) and the linear layer's head count
and head_dim (LinearAttention.__init__). It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import ast
import contextlib
import json
import sys
import types
from pathlib import Path
from typing import Any

# The attention backend's class, whose kernel block sizes the alignment reads (its module needs CUDA kernels).
_BACKENDS = {"FLASH_ATTN_MLA": ("vllm/v1/attention/backends/mla/flashattn_mla.py", "FlashAttnMLABackend"),
             "FLASHMLA": ("vllm/v1/attention/backends/mla/flashmla.py", "FlashMLABackend")}


def _function(path: Path, cls: str | None, name: str, scope: dict[str, Any]) -> Any:
    """A method of `cls` (None: a module-level function) of a release's file, compiled alone; its own
    imports of names `scope` gives are dropped, so those names are the scope's."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls) if cls else tree
    fn = next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    fn.body = [s for s in fn.body if not (isinstance(s, ast.ImportFrom)
                                          and all((a.asname or a.name) in scope for a in s.names))]
    module = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, str(path), "exec"), scope)
    return scope[name]


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    import torch
    from transformers import PretrainedConfig
    from vllm.config.attention import AttentionConfig
    from vllm.config.cache import CacheConfig
    from vllm.model_executor.layers.mamba import mamba_utils
    from vllm.utils.math_utils import cdiv
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE, kv_cache_dtype_str_to_dtype
    from vllm.v1 import kv_cache_interface
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    try:
        from vllm.v1.core import kv_cache_planning
    except ImportError:   # before 0.33 the grouping lives in kv_cache_utils
        from vllm.v1.core import kv_cache_utils as kv_cache_planning

    model_py = root / "vllm/model_executor/models/bailing_moe_linear.py"
    linear_py = root / "vllm/model_executor/layers/mamba/linear/base.py"
    abstract_py = root / "vllm/model_executor/layers/mamba/abstract.py"
    common = {**vars(mamba_utils), **vars(kv_cache_interface), "VllmConfig": object, "torch": torch,
              "MambaAttentionBackendEnum": MambaAttentionBackendEnum}
    is_linear = _function(model_py, None, "is_linear_layer", {})
    shape_from_config = _function(model_py, "BailingMoeV25ForCausalLM", "get_mamba_state_shape_from_config", common)
    dtype_from_config = _function(model_py, "BailingMoeV25ForCausalLM", "get_mamba_state_dtype_from_config", common)
    state_shape = _function(linear_py, "LinearAttention", "get_state_shape", common)
    state_dtype = _function(linear_py, "LinearAttention", "get_state_dtype", common)
    mamba_type = _function(linear_py, "LinearAttention", "mamba_type", common)
    mamba_spec = _function(abstract_py, "MambaBase", "get_kv_cache_spec", common)
    mla_spec = _function(root / "vllm/model_executor/layers/attention/mla_attention.py", "MLAAttention",
                         "get_kv_cache_spec", {**common, "kv_cache_dtype_str_to_dtype": kv_cache_dtype_str_to_dtype,
                                               "get_kv_quant_mode": kv_cache_interface.get_kv_quant_mode,
                                               "cast": lambda t, v: v, "MLAAttentionImpl": object})
    logger = types.SimpleNamespace(info=lambda *a, **k: None, warning=lambda *a, **k: None)
    mode_update = _function(root / "vllm/model_executor/models/config.py", "MambaModelConfig",
                            "verify_and_update_config", {"logger": logger})
    answers = []
    for case in cases:
        hf = PretrainedConfig(**case["config"])
        tp = case["tp"]
        path, cls = _BACKENDS[case["backend"]]
        sizes = _function(root / path, cls, "get_supported_kernel_block_sizes", {"MultipleOf": MultipleOf})
        backend = types.SimpleNamespace(get_supported_kernel_block_sizes=sizes)
        model_config = types.SimpleNamespace(
            hf_config=hf, dtype=torch.bfloat16, use_mla=True, architecture="BailingMoeV2_5ForCausalLM",
            max_model_len=hf.max_position_embeddings, get_num_kv_heads=lambda parallel: 1,
            get_head_size=lambda hf=hf: hf.kv_lora_rank + hf.qk_rope_head_dim)
        cache = CacheConfig()
        cache.cache_dtype = case["kv_cache_dtype"]
        cache.block_size = case.get("block_size") or CacheConfig.DEFAULT_BLOCK_SIZE   # none given: the release's
        cache.mamba_cache_dtype = case.get("mamba_cache_dtype", "auto")
        cache.enable_prefix_caching, cache.mamba_cache_mode = case["prefix_caching"], "none"
        if hasattr(cache, "kv_cache_layout"):   # 0.34: every page is one size once padded, so no layout packs
            cache.kv_cache_layout = "LBNHC"      # the groups (_get_packed_kv_cache_groups returns None)
        config = types.SimpleNamespace(
            model_config=model_config, cache_config=cache, num_speculative_tokens=0, use_flashinfer_replayssm=False,
            parallel_config=types.SimpleNamespace(tensor_parallel_size=tp, decode_context_parallel_size=1,
                                                  prefill_context_parallel_size=1),
            scheduler_config=types.SimpleNamespace(enable_chunked_prefill=True, disable_hybrid_kv_cache_manager=False),
            speculative_config=None, attention_config=AttentionConfig())
        mode_update(None, config)
        model_cls = types.SimpleNamespace(
            get_mamba_state_shape_from_config=lambda c: shape_from_config(None, c),
            get_mamba_state_dtype_from_config=lambda c: dtype_from_config(None, c))
        stubs = {"set_current_vllm_config": lambda c: contextlib.nullcontext(), "cdiv": cdiv,
                 "ModelRegistry": types.SimpleNamespace(resolve_model_cls=lambda arch, model_config=None, m=model_cls: (m, arch)),
                 "STR_DTYPE_TO_TORCH_DTYPE": STR_DTYPE_TO_TORCH_DTYPE, "MultipleOf": MultipleOf,
                 "get_mamba_prefill_checkpoint_alignment": lambda c: None,   # no linear layer exports checkpoints
                 "mamba_state_alignment": getattr(mamba_utils, "mamba_state_alignment", None), "logger": logger,
                 **vars(kv_cache_interface)}
        align = _function(root / "vllm/platforms/interface.py", "Platform", "_align_hybrid_block_size", stubs)
        align(types.SimpleNamespace(_find_non_ssm_backends=lambda c, b=backend: [b]), config, backend)
        linear = types.SimpleNamespace(
            num_heads=hf.num_attention_heads, tp_size=tp, model_config=model_config, cache_config=cache,
            head_dim=hf.head_dim if hasattr(hf, "head_dim") else hf.hidden_size // hf.num_attention_heads,
            state_alignment=1, is_kv_cache_tp_replicated=False, mamba_type=mamba_type(None))
        linear.get_state_shape = lambda layer=linear: state_shape(layer)
        linear.get_state_dtype = lambda layer=linear: state_dtype(layer)
        mla = types.SimpleNamespace(
            kv_cache_dtype=case["kv_cache_dtype"], head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
            sliding_window=None, topk_buffer_width=None, indexer=None, non_causal_multi_token_decode=False)
        group = getattr(hf, "layer_group_size", 1)
        specs = {}
        for layer in range(hf.num_hidden_layers):
            name = f"model.layers.{layer}.self_attn"
            specs[name] = mamba_spec(linear, config) if is_linear(layer, group) else mla_spec(mla, config)
        groups = kv_cache_planning.get_kv_cache_groups(config, specs)
        planned = kv_cache_planning.get_kv_cache_config_from_groups(config, groups, case["kv_memory_bytes"])
        answers.append({"block_size": cache.block_size, "groups": len(groups), "num_blocks": planned.num_blocks,
                        "linear_layers": sum(is_linear(i, group) for i in range(hf.num_hidden_layers)),
                        "state_page": cache.mamba_page_size_padded,
                        "mamba_cache_mode": cache.mamba_cache_mode})
    return answers


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))
