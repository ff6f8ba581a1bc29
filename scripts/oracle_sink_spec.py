#!/usr/bin/env python3
"""Run one vLLM release's own spec, grouping and sizing code on openPangu's sink-attention layers (or
HRM-Text's prefix-LM layers), on this CPU, in a process of its own.

    python scripts/oracle_sink_spec.py RELEASE_TREE < case.json > answer.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...). The modules are loaded as
scripts/oracle_kv_groups.py loads them (its ReleaseFinder: the spec, grouping and sizing modules from
the release's files, every other vllm module an inert stand-in).

The layer itself (StaticSinkAttention) cannot be built here: a VllmConfig on an x86 CPU needs
triton-cpu (vLLM 0.34.0, vllm/platforms/cpu.py:243). So each layer's SinkFullAttentionSpec is
built with the fields its get_kv_cache_spec passes (layers/attention/static_sink_attention.py:
211-225), filled as openpangu.py's OpenPanguSinkAttention fills them (openpangu.py:569-576,
:630-643): num_kv_heads = KV heads / TP, head_size = qk_rope_dim + qk_nope_dim, head_size_v =
v_channels, sink_len = param_sink_number, the dtype the KV cache dtype's (bf16 here).

HRM-Text's PrefillPrefixLMAttention (case "kind": "prefix_lm") returns the decoder layer's
FullAttentionSpec with non_causal=True (prefill_prefix_lm_attention.py:73-86): built so here, with
num_kv_heads = num_attention_heads / TP and head_size = head_dim (hrm_text.py:142-147).

The case: {"layers", "kv_heads", "tp", "qk_rope_dim", "qk_nope_dim", "v_channels", "sink_len",
"block_size", "max_model_len", "budget"}. The answer: the spec's class and kind, page_size_bytes,
max_memory_usage_bytes, the groups (kind, block size, layers), the bytes of one block of the pool,
the blocks the budget holds (get_kv_cache_config_from_groups' division) and the "KV cache size: N
tokens" the release logs for them; or {"error": type} where vLLM refuses.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

_KV_GROUPS = Path(__file__).resolve().parent / "oracle_kv_groups.py"


def _oracle_kv_groups() -> Any:
    spec = importlib.util.spec_from_file_location("oracle_kv_groups", _KV_GROUPS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kind(kind: Any) -> str:
    return str(getattr(kind, "value", kind))   # a StrEnum in 0.34, an Enum in 0.33


def answer(tree: Path, case: dict[str, Any]) -> dict[str, Any]:
    import torch
    og = _oracle_kv_groups()
    sys.meta_path.insert(0, og.ReleaseFinder(tree))
    logging.disable(logging.WARNING)
    # the specs here set no block_stride_alignment: a class nothing is an instance of keeps
    # KVCacheSpec.get_block_stride_alignment on its `alignment or 1` branch (kv_cache_interface.py:213-219)
    importlib.import_module("vllm.v1.attention.backend").MultipleOf = type("MultipleOf", (), {})
    ki = importlib.import_module("vllm.v1.kv_cache_interface")
    planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    managers = importlib.import_module("vllm.v1.core.single_type_kv_cache_manager")
    layout = importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout.LBNHC
    block = case["block_size"]
    config = og._config({"disable_hybrid": False, "block_size": block}, layout)
    config.model_config.max_model_len = case["max_model_len"]
    config.scheduler_config.max_model_len = case["max_model_len"]
    heads = max(1, case["kv_heads"] // case["tp"])
    if case.get("kind") == "prefix_lm":   # the decoder spec with non_causal flipped, as the layer returns it
        def spec() -> Any:
            return dataclasses.replace(ki.FullAttentionSpec(block_size=block, num_kv_heads=heads,
                                                            head_size=case["head_size"], dtype=torch.bfloat16),
                                       non_causal=True)
    else:
        def spec() -> Any:
            return ki.SinkFullAttentionSpec(block_size=block, num_kv_heads=heads,
                                            head_size=case["qk_rope_dim"] + case["qk_nope_dim"],
                                            head_size_v=case["v_channels"], sink_len=case["sink_len"],
                                            dtype=torch.bfloat16)
    specs = {f"model.layers.{i}.self_attn.attn": spec() for i in range(case["layers"])}
    first = next(iter(specs.values()))
    try:
        if case.get("kind") != "prefix_lm":
            # the manager's own check on this block size (SinkFullAttentionManager.__init__), on a stand-in pool
            managers.SinkFullAttentionManager(kv_cache_spec=first, block_pool=og.Inert("block_pool"),
                                              enable_caching=False, kv_cache_group_id=0, scheduler_block_size=block)
        groups = planning.get_kv_cache_groups(config, specs)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        return {"error": type(exc).__name__}
    per_block = planning._get_kv_cache_bytes_per_block(groups, layout)
    num_blocks = case["budget"] // per_block
    return {"spec": type(first).__name__, "kind": _kind(ki.get_kv_cache_spec_kind(first)),
            "non_causal": bool(first.non_causal),
            "page_size_bytes": first.page_size_bytes,
            "max_memory_usage_bytes": first.max_memory_usage_bytes(config),
            "groups": [{"kind": _kind(ki.get_kv_cache_spec_kind(g.kv_cache_spec)), "block_size": g.kv_cache_spec.block_size,
                        "layers": [int(n.split(".")[2]) for n in g.layer_names]} for g in groups], "bytes_per_block": per_block, "num_blocks": num_blocks,
            "tokens": og._reported_tokens(tree, config, groups, num_blocks)}


def main() -> int:
    json.dump(answer(Path(sys.argv[1]), json.load(sys.stdin)), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
