#!/usr/bin/env python3
"""Run one vLLM release's own KV cache specs and sizing on Voxtral Realtime's layers, on this CPU.

    python scripts/oracle_voxtral_cache.py RELEASE_TREE < cases.json > answers.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...), one process per release. The spec,
grouping and sizing modules and model_executor/models/whisper_causal.py are the release's own files,
loaded as scripts/oracle_kv_groups.py loads them (every other vllm module a stand-in, torch needed).

Each case gives the language model's layers (`lm`: layers, kv_heads, head_size, window: every layer a
sliding-window Attention, whose spec is Attention.get_kv_cache_spec's SlidingWindowSpec at the block
size), the causal encoder's (`encoder`: layers, heads, head_dim, window, pool), the tensor parallel
size, block size, KV dtype, max_model_len, the tokens in flight and the KV memory. Each encoder layer's
spec is the release's own WhisperCausalAttentionWithBlockPooling.get_kv_cache_spec run on that same
sliding-window spec of the encoder's heads (its base class, Attention, is given by a probe class placed
after it in the method order). The answer, from the release's own functions: each encoder spec's block,
window, tokens_per_state and page; the groups (`get_kv_cache_groups`), bytes per block and blocks
(`get_kv_cache_config_from_groups`), the blocks one request reserves per group, the maximum
concurrency and the "KV cache size: N tokens" line, or "error: <type>: <message>".
"""
from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import oracle_cross_attention as cross  # noqa: E402
import oracle_kv_groups as shared  # noqa: E402

WHISPER_CAUSAL = "vllm.model_executor.models.whisper_causal"


def _config(case: dict[str, Any], layout: Any) -> Any:
    config = shared._config({"disable_hybrid": False, "block_size": case["block_size"]}, layout)
    config.model_config.max_model_len = case["max_model_len"]
    # max_concurrent_batches x max_num_batched_tokens (config/vllm.py max_in_flight_tokens): two batches
    # with async scheduling, the default; the plan is given half as --max-num-batched-tokens
    config.scheduler_config.max_num_batched_tokens = case["max_in_flight_tokens"] // 2
    config.max_in_flight_tokens = case["max_in_flight_tokens"]
    config.parallel_config.tensor_parallel_size = case["tp"]
    config.cache_config.prefix_cache_retention_interval = None
    return config


def _encoder_spec(ki: Any, pooling_cls: type, sliding: Any, pool: int, config: Any) -> Any:
    class Attention:   # what the layer's base class, vLLM's Attention, gives for a sliding layer
        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return sliding

    class Probe(pooling_cls, Attention):   # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            self.block_pool_size = pool

    return pooling_cls.get_kv_cache_spec(Probe(), config)


def _answer(tree: Path, case: dict[str, Any]) -> Any:
    import torch
    name = next(m for m in cross.PLANNING if (file := tree / (m.replace(".", "/") + ".py")).exists()
                and "def get_kv_cache_groups(" in file.read_text(encoding="utf-8"))
    planning = importlib.import_module(name)
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    ki = importlib.import_module("vllm.v1.kv_cache_interface")
    pooling_cls = importlib.import_module(WHISPER_CAUSAL).WhisperCausalAttentionWithBlockPooling
    layout = getattr(importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout, shared.LAYOUT)
    config = _config(case, layout)
    dtype = {"bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[case["dtype"]]
    lm, enc, tp = case["lm"], case["encoder"], case["tp"]
    specs: dict[str, Any] = {}
    for i in range(lm["layers"]):
        specs[f"language_model.model.layers.{i}.self_attn.attn"] = ki.SlidingWindowSpec(
            block_size=case["block_size"], num_kv_heads=max(1, lm["kv_heads"] // tp), head_size=lm["head_size"],
            dtype=dtype, sliding_window=lm["window"])
    encoder_specs = []
    for i in range(enc["layers"]):
        sliding = ki.SlidingWindowSpec(block_size=case["block_size"], num_kv_heads=max(1, enc["heads"] // tp),
                                       head_size=enc["head_dim"], dtype=dtype, sliding_window=enc["window"])
        spec = _encoder_spec(ki, pooling_cls, sliding, enc["pool"], config)
        specs[f"whisper_encoder.whisper_encoder.layers.{i}.self_attn.attn"] = spec
        encoder_specs.append(spec)
    first = encoder_specs[0]
    encoder = {"type": type(first).__name__, "block_size": first.block_size, "window": first.sliding_window,
               "tokens_per_state": str(first.tokens_per_state), "page_size_bytes": first.page_size_bytes}
    try:
        groups = planning.get_kv_cache_groups(config, specs)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        return {"encoder": encoder, "error": f"{type(exc).__name__}: {exc}"}
    def encoder_fields(g: Any) -> dict[str, Any]:
        return {"encoder_layers": sum(n.startswith("whisper_encoder") for n in g.layer_names),
                "block_size": g.kv_cache_spec.block_size, "page_size_bytes": g.kv_cache_spec.page_size_bytes}
    return {"encoder": encoder, **shared.sized_answer(tree, config, groups, case["memory"], planning, utils, encoder_fields)}


def main() -> int:
    tree = Path(sys.argv[1])
    shared.REAL.add(WHISPER_CAUSAL)
    sys.meta_path.insert(0, shared.ReleaseFinder(tree))
    logging.disable(logging.WARNING)
    backend = shared.StandIn("vllm.v1.attention.backend")   # whisper_causal.py's names from it are inert,
    backend.MultipleOf = cross.MultipleOf   # type: ignore[attr-defined]   # but the spec's alignment check
    importlib.import_module("vllm.v1.attention")
    sys.modules["vllm.v1.attention.backend"] = backend
    json.dump([_answer(tree, case) for case in json.load(sys.stdin)], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
