"""vLLM's own KV cache for a MiniMax-M3 config.json: run as a script, one release per process.

    python tests/minimax_m3_oracle.py <unpacked release root> '<list of cases as JSON>'

The release's source goes first on sys.path and its own code answers, from the config.json as that
release loads it (0.33: its own MiniMaxM3Config; 0.34: transformers' MiniMaxM3VLConfig,
vllm/transformers_utils/config.py:159): which layers are sparse (_sparse_attention_layer_ids), the
sparse layer's get_kv_cache_spec (both compiled out of vllm/models/minimax_m3/nvidia/model.py,
whose module needs torchvision to import), MiniMaxM3IndexerCache.get_kv_cache_spec, the backends'
kernel block sizes and Platform._preferred_block_size_for_backends (the block size),
get_kv_cache_groups and get_kv_cache_config_from_groups (the groups and blocks of a KV budget),
get_pp_indices (the first pipeline stage's layers).
Only the layers' constructor arithmetic is the oracle's: the rank's KV heads, max(1, heads // tp),
and the index key width the layer reads (0.33: sparse_attention_config's sparse_index_dim,
model.py:441; 0.34: index_head_dim, model.py:898). It prints a JSON list, one answer per case.
"""
from __future__ import annotations

import ast
import json
import sys
import types
from pathlib import Path
from typing import Any


def _method_or_function(path: Path, cls: str | None, name: str, scope: dict[str, Any]) -> Any:
    """A method of `cls` (None: a module-level function) of a release's file, compiled alone."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls) if cls else tree
    fn = next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    module = ast.Module(body=[fn], type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, str(path), "exec"), scope)
    return scope[name]


def _text_config(root: Path, config: dict[str, Any]) -> Any:
    """The text config as the release loads this config.json."""
    wrapped = "text_config" in config
    if (root / "vllm/transformers_utils/configs/minimax_m3.py").read_text().count("class MiniMaxM3TextConfig"):
        from vllm.transformers_utils.configs import minimax_m3 as own  # 0.33: vLLM's own classes
        return own.MiniMaxM3Config(**config).text_config if wrapped else own.MiniMaxM3TextConfig(**config)
    import transformers  # 0.34: the upstream classes
    return transformers.MiniMaxM3VLConfig(**config).text_config if wrapped \
        else transformers.MiniMaxM3VLTextConfig(**config)


def main(root: Path, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sys.path.insert(0, str(root))
    # The package's __init__ imports the NVIDIA model, which needs torchvision: its common modules alone.
    package = types.ModuleType("vllm.models.minimax_m3")
    package.__path__ = [str(root / "vllm" / "models" / "minimax_m3")]
    sys.modules["vllm.models.minimax_m3"] = package
    import torch
    from vllm.config.attention import AttentionConfig
    from vllm.config.cache import CacheConfig
    from vllm.distributed.utils import get_pp_indices
    from vllm.models.minimax_m3.common.indexer import MiniMaxM3IndexerBackend, MiniMaxM3IndexerCache
    from vllm.models.minimax_m3.common.sparse_attention import MiniMaxM3SparseBackend
    from vllm.platforms.interface import Platform
    from vllm.v1 import kv_cache_interface
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.core import kv_cache_planning

    model_py = root / "vllm/models/minimax_m3/nvidia/model.py"
    sparse_ids = _method_or_function(model_py, None, "_sparse_attention_layer_ids", {"PreTrainedConfig": object})
    main_spec = _method_or_function(model_py, "MiniMaxM3SparseAttention", "get_kv_cache_spec",
                                    {**vars(kv_cache_interface), "VllmConfig": object})
    answers = []
    for case in cases:
        text = _text_config(root, case["config"])
        tp, sparse = case["tp"], sparse_ids(text)
        legacy = getattr(text, "sparse_attention_config", None)
        index_key = legacy["sparse_index_dim"] if legacy else text.index_head_dim
        kv_dtype = {"auto": torch.bfloat16, "fp8": torch.float8_e4m3fn}[case["kv_cache_dtype"]]
        cache = CacheConfig()
        if hasattr(cache, "kv_cache_layout"):
            cache.kv_cache_layout = "LBHNC"   # the layout MiniMax's sparse backend lists first
        config = types.SimpleNamespace(
            cache_config=cache, attention_config=AttentionConfig(), model_config=None,
            scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
            parallel_config=types.SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1))
        backends = ([FlashAttentionBackend] if len(sparse) < text.num_hidden_layers else []) + \
            ([MiniMaxM3SparseBackend, MiniMaxM3IndexerBackend] if sparse else [])
        cache.block_size = case.get("block_size") or Platform._preferred_block_size_for_backends(
            backends, CacheConfig.DEFAULT_BLOCK_SIZE, config)
        attention = types.SimpleNamespace(num_kv_heads=max(1, text.num_key_value_heads // tp),
                                          head_dim=text.head_dim, kv_cache_torch_dtype=kv_dtype,
                                          kv_cache_dtype=case["kv_cache_dtype"])
        indexer = types.SimpleNamespace(head_dim=index_key, head_size=index_key, dtype=torch.bfloat16)
        specs = {}
        first, last = get_pp_indices(text.num_hidden_layers, 0, case.get("pp", 1))   # the first stage's layers
        for layer in range(first, last):
            # a dense layer's Attention builds the same FullAttentionSpec of the rank's heads
            specs[f"model.layers.{layer}.self_attn.attn"] = main_spec(attention, config)
            if layer in sparse:
                specs[f"model.layers.{layer}.self_attn.attn.indexer"] = \
                    MiniMaxM3IndexerCache.get_kv_cache_spec(indexer, config)
        groups = kv_cache_planning.get_kv_cache_groups(config, specs)
        planned = kv_cache_planning.get_kv_cache_config_from_groups(config, groups, case["kv_memory_bytes"])
        answers.append({"block_size": cache.block_size, "groups": len(groups), "num_blocks": planned.num_blocks,
                        "tokens": planned.num_blocks * cache.block_size, "sparse_layers": len(sparse),
                        "bytes_per_block": sum(g.kv_cache_spec.page_size_bytes for g in groups)})
    return answers


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), json.loads(sys.argv[2]))))
