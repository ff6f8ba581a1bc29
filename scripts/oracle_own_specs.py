#!/usr/bin/env python3
"""Run one vLLM release's own layer classes, spec classes and KV cache planning on a model family
whose layers build their own KV cache specs, on this CPU, in a process of its own.

    python scripts/oracle_own_specs.py RELEASE_TREE < cases.json > answers.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...). Nothing of vLLM is installed or copied:
the modules named in REAL (scripts/oracle_kv_groups.py) and the family's own files below are loaded
from the release; every other vllm module they import is a stand-in (oracle_kv_groups.ReleaseFinder).
What the layers read from outside themselves is given, as the engine would give it: the tensor
parallel world size, the current VllmConfig (the model dtype, --block-size, --kv-cache-dtype)
and `kv_cache_dtype_str_to_dtype` ("auto": the model dtype; an fp8 name: float8_e4m3fn); the
backend module's `MultipleOf` is a class no spec here is an instance of (none has a block stride
alignment).

Families:
- inkling: the release's InklingModelConfig (models/inkling/configs.py) reads the text config; per
  decoder layer an InklingConvState (models/inkling/nvidia/sconv_swa_attn.py) and an
  InklingAttention (models/inkling/nvidia/attention.py), built with the arguments
  InklingDecoderLayer passes (nvidia/model.py:140-170), each asked for get_kv_cache_spec.

Each case: {"family", "config" (the text config.json), "tp", "block_size", "kv_cache_dtype", "dtype"
(the model's, a torch name),
"memory" (bytes for the KV cache), "max_model_len", "max_num_batched_tokens",
"max_in_flight_tokens" (VllmConfig.max_in_flight_tokens: the batches in flight, two with a GPU's
async scheduling, times max_num_batched_tokens)}. Each answer: the
layers' specs (class, block size, page bytes, window), the groups of the release's
get_kv_cache_groups (kind, block size, layer count, bytes per block), the release's bytes per
block (_get_kv_cache_bytes_per_block) and num_blocks = memory // that
(get_kv_cache_config_from_groups), and the "KV cache size: N tokens" the release logs for them
(oracle_kv_groups._reported_tokens); or "error: <type>: <message>" where vLLM refuses.
"""
from __future__ import annotations

import importlib
import json
import logging
import sys
import traceback
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle_kv_groups as groups_oracle  # noqa: E402

FAMILY_MODULES = {"inkling": ("vllm.models.inkling.configs", "vllm.models.inkling.nvidia.sconv_swa_attn",
                              "vllm.models.inkling.nvidia.attention")}


def _vllm_config(case: dict[str, Any], layout: Any) -> Any:
    import torch
    config = groups_oracle._config({"disable_hybrid": case.get("disable_hybrid", False),
                                    "block_size": case["block_size"]}, layout)
    config.model_config = types.SimpleNamespace(dtype=getattr(torch, case.get("dtype", "bfloat16")),
                                                max_model_len=case["max_model_len"])
    config.scheduler_config.max_num_batched_tokens = case["max_num_batched_tokens"]
    config.scheduler_config.max_model_len = case["max_model_len"]
    config.max_in_flight_tokens = case["max_in_flight_tokens"]
    config.cache_config.cache_dtype = case["kv_cache_dtype"]
    config.cache_config.prefix_cache_retention_interval = None
    config.compilation_config = types.SimpleNamespace(static_forward_context={})
    config.kernel_config = types.SimpleNamespace(enable_jit_warmup=False)
    config.parallel_config.tensor_parallel_size = case["tp"]
    return config


def _dtype(name: str, model_config: Any) -> Any:
    import torch
    return model_config.dtype if name == "auto" else torch.float8_e4m3fn


def inkling_specs(case: dict[str, Any], vllm_config: Any) -> dict[str, Any]:
    configs = importlib.import_module("vllm.models.inkling.configs")
    sconv = importlib.import_module("vllm.models.inkling.nvidia.sconv_swa_attn")
    attention = importlib.import_module("vllm.models.inkling.nvidia.attention")
    for module in (sconv, attention):
        module.get_current_vllm_config = lambda: vllm_config   # type: ignore[attr-defined]
        module.get_tensor_model_parallel_world_size = lambda: case["tp"]   # type: ignore[attr-defined]
    attention.kv_cache_dtype_str_to_dtype = lambda name, model_config: _dtype(name, model_config)   # type: ignore[attr-defined]
    text = {k: v for k, v in case["config"].items() if k not in ("model_type", "architectures")}
    config = configs.InklingModelConfig(**text)
    local = set(config.local_layer_ids)
    specs: dict[str, Any] = {}
    for i in range(config.num_hidden_layers):   # nvidia/model.py:140-170, per decoder layer
        is_local = i in local
        heads = config.swa_num_key_value_heads if is_local else config.num_key_value_heads
        head_dim = config.swa_head_dim if is_local else config.head_dim
        ring = sconv.InklingConvState(num_kv_heads=heads, head_dim=head_dim, hidden_size=config.hidden_size,
                                      kernel_size=config.sconv_kernel_size, prefix=f"model.layers.{i}.conv_state")
        attn = attention.InklingAttention(
            config, num_heads=config.swa_num_attention_heads if is_local else config.num_attention_heads,
            num_kv_heads=heads, head_dim=head_dim, rel_extent=config.rel_extent,
            local_extent=config.sliding_window_size, is_local=is_local, prefix=f"model.layers.{i}.attn",
            conv_owner=ring)
        specs[ring.prefix] = ring.get_kv_cache_spec(vllm_config)
        specs[attn.prefix] = attn.get_kv_cache_spec(vllm_config)
    return specs


SPECS = {"inkling": inkling_specs}


def _spec(spec: Any) -> dict[str, Any]:
    return {"class": type(spec).__name__, "block_size": spec.block_size, "page_bytes": spec.page_size_bytes,
            "window": getattr(spec, "sliding_window", None)}


def _group_bytes(group: Any) -> int:
    """A group's pages per block: a UniformTypeKVCacheSpecs' page is already its layers' sum."""
    spec = group.kv_cache_spec
    if type(spec).__name__ == "UniformTypeKVCacheSpecs":
        return int(spec.page_size_bytes)
    return int(spec.page_size_bytes) * len(group.layer_names)


def answer(tree: Path, case: dict[str, Any], layout: Any) -> Any:
    planning = importlib.import_module(next(m for m in groups_oracle.GROUPING_MODULES
                                            if (tree / (m.replace(".", "/") + ".py")).exists()))
    vllm_config = _vllm_config(case, layout)
    try:
        specs = SPECS[case["family"]](case, vllm_config)
        groups = planning.get_kv_cache_groups(vllm_config, specs)
    except (AssertionError, ValueError, NotImplementedError) as exc:
        return f"error: {type(exc).__name__}: {exc}"
    per_block = planning._get_kv_cache_bytes_per_block(groups, layout)
    num_blocks = case["memory"] // per_block
    by_spec: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        entry = by_spec.setdefault(f"{name.split('.')[-1]} {_spec(spec)}", {**_spec(spec), "layers": 0})
        entry["layers"] += 1
    return {"specs": sorted(by_spec.values(), key=lambda s: (s["class"], s["page_bytes"], str(s["window"]))),
            "groups": [{"kind": type(g.kv_cache_spec).__name__, "block_size": g.kv_cache_spec.block_size,
                        "layers": len(g.layer_names), "bytes_per_block": _group_bytes(g)} for g in groups],
            "bytes_per_block": per_block, "num_blocks": num_blocks,
            "tokens": groups_oracle._reported_tokens(tree, vllm_config, groups, num_blocks)}


def main() -> int:
    tree = Path(sys.argv[1])
    for modules in FAMILY_MODULES.values():
        groups_oracle.REAL.update(modules)
    sys.meta_path.insert(0, groups_oracle.ReleaseFinder(tree))
    logging.disable(logging.WARNING)
    # KVCacheSpec.get_block_stride_alignment asks whether an alignment is a MultipleOf (a stand-in
    # module's name): none of these specs has one, so a class nothing is an instance of answers no
    importlib.import_module("vllm.v1.attention.backend").MultipleOf = type("MultipleOf", (), {})
    layout = getattr(importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout, groups_oracle.LAYOUT)
    answers = []
    for case in json.load(sys.stdin):
        try:
            answers.append(answer(tree, case, layout))
        except Exception:   # a stand-in the release reached: say where, do not guess
            traceback.print_exc()
            return 1
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
