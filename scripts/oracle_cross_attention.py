#!/usr/bin/env python3
"""Run one vLLM release's own KV cache sizing on an encoder-decoder model's specs, on this CPU.

    python scripts/oracle_cross_attention.py RELEASE_TREE < cases.json > answers.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...), one process per release so that releases'
modules never mix. The spec and grouping modules are the release's own files, loaded as
scripts/oracle_kv_groups.py loads them (every other vllm module a stand-in; torch needed).

Each case gives the decoder's layers (`layers`, `kv_heads`, `head_size`, `dtype`), the block size, the
scheduler's `max_num_encoder_input_tokens`, `max_model_len`, the KV memory (`memory`) and whether the
hybrid KV cache manager is off. Per decoder layer the model holds a self-attention layer
(FullAttentionSpec, vLLM's Attention) and a cross-attention layer (CrossAttentionSpec, vLLM's
CrossAttention: models/whisper.py WhisperDecoderLayer; Cohere ASR, Canary and Nemotron-Parse build the
same two per decoder layer), named as vLLM names Whisper's (Nemotron-Parse's lack the `model.` prefix,
which no figure here depends on). The answer, from the
release's own functions: the groups (`get_kv_cache_groups`), the bytes per block and blocks
(`get_kv_cache_config_from_groups`), the blocks one request reserves per group (cdiv of the spec's
`max_memory_usage_bytes` by its page), the maximum concurrency
(`get_max_concurrency_for_kv_cache_config`), the "KV cache size: N tokens" line (`update_kv_cache_capacity`)
and the memory one request needs (`_max_memory_usage_bytes_from_groups`), or "error: <type>: <message>"
where vLLM refuses the specs.
"""
from __future__ import annotations

import importlib
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_kv_groups as shared  # noqa: E402

PLANNING = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils")


class MultipleOf:
    """vllm.v1.attention.backend.MultipleOf, which get_block_stride_alignment checks with isinstance:
    no spec here declares one, so any class answers that check as the release's does."""


def _config(case: dict[str, Any], layout: Any) -> Any:
    config = shared._config({"disable_hybrid": case["disable_hybrid"], "block_size": case["block_size"]}, layout)
    config.scheduler_config.max_num_encoder_input_tokens = case["max_num_encoder_input_tokens"]
    config.model_config.max_model_len = case["max_model_len"]
    config.cache_config.prefix_cache_retention_interval = None   # 0.33+: no retention asked for
    return config


def _specs(ki: Any, case: dict[str, Any]) -> dict[str, Any]:
    import torch
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": torch.float8_e4m3fn}[case["dtype"]]
    common = {"block_size": case["block_size"], "num_kv_heads": case["kv_heads"], "head_size": case["head_size"],
              "dtype": dtype}
    specs: dict[str, Any] = {}
    for i in range(case["layers"]):   # static_forward_context order: each layer's self_attn, then encoder_attn
        specs[f"model.decoder.layers.{i}.self_attn.attn"] = ki.FullAttentionSpec(**common)
        specs[f"model.decoder.layers.{i}.encoder_attn.attn"] = ki.CrossAttentionSpec(**common)
    return specs


def _answer(tree: Path, case: dict[str, Any]) -> Any:
    name = next(m for m in PLANNING if (file := tree / (m.replace(".", "/") + ".py")).exists()
                and "def get_kv_cache_groups(" in file.read_text(encoding="utf-8"))
    planning = importlib.import_module(name)
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    ki = importlib.import_module("vllm.v1.kv_cache_interface")
    layout = getattr(importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout, shared.LAYOUT)
    config = _config(case, layout)
    specs = _specs(ki, case)
    try:
        groups = planning.get_kv_cache_groups(config, specs)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        return f"error: {type(exc).__name__}: {exc}"
    kv_cache_config = planning.get_kv_cache_config_from_groups(config, groups, case["memory"])
    # the platform's builder is the default one on CUDA and the CPU (0.33+: kv_cache_planning.py)
    builder = planning.DefaultKVCacheConfigBuilder() if hasattr(planning, "DefaultKVCacheConfigBuilder") else None
    needed = planning._max_memory_usage_bytes_from_groups(*((builder,) if builder is not None else ()), config, groups)
    scheduler_groups = utils.generate_scheduler_kv_cache_config([kv_cache_config]).kv_cache_groups
    return {
        "groups": [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
                    "page_size_bytes": g.kv_cache_spec.page_size_bytes,
                    "blocks_per_request": -(-g.kv_cache_spec.max_memory_usage_bytes(config)
                                            // g.kv_cache_spec.page_size_bytes)} for g in scheduler_groups],
        "num_blocks": kv_cache_config.num_blocks,
        "bytes_per_block": kv_cache_config.kv_cache_tensors[0].size // kv_cache_config.num_blocks,
        "max_concurrency": utils.get_max_concurrency_for_kv_cache_config(config, kv_cache_config),
        "kv_cache_tokens": shared._reported_tokens(tree, config, groups, kv_cache_config.num_blocks),
        "request_bytes": needed,
    }


def main() -> int:
    tree = Path(sys.argv[1])
    sys.meta_path.insert(0, shared.ReleaseFinder(tree))
    logging.disable(logging.WARNING)
    backend = types.ModuleType("vllm.v1.attention.backend")
    backend.MultipleOf = MultipleOf   # type: ignore[attr-defined]
    importlib.import_module("vllm.v1.attention")   # the stand-in package, then its real-enough child
    sys.modules["vllm.v1.attention.backend"] = backend
    json.dump([_answer(tree, case) for case in json.load(sys.stdin)], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
