#!/usr/bin/env python3
"""Run one vLLM release's own KV cache sizing on a target model's specs plus its MTP draft's, on this CPU.

    python scripts/oracle_mtp_draft.py RELEASE_TREE < cases.json > answers.json

RELEASE_TREE is one unpacked wheel (RELEASE_TREE/vllm/...), one process per release so that releases'
modules never mix. The spec and grouping modules are the release's own files, loaded as
scripts/oracle_kv_groups.py loads them (every other vllm module a stand-in; torch needed).

Each case gives the target's layers in model order (`layers`: "mla", "full" or "mamba"), the MTP draft's
layers (`draft_layers`, registered after the target's as the drafter loads them: v1/spec_decode/
llm_base_proposer.py load_model; each of the target's attention kind), the attention shapes (`heads`,
`head_size`, bfloat16), a Mamba-style layer's state (`state_elements` bfloat16 elements and `state_fp32_elements` float32 ones, padded to
`state_page_padded` bytes, with `checkpoint_blocks` prefill checkpoints), the block size and Mamba block size, `num_speculative_tokens` (the Mamba
spec's num_speculative_blocks, model_executor/layers/mamba/abstract.py), `mamba_cache_mode`,
`max_model_len`, `max_num_batched_tokens` and the KV memory. The answer, from the release's own
functions: the groups (`get_kv_cache_groups`), the bytes per block and blocks
(`get_kv_cache_config_from_groups`), the blocks one request reserves per group (cdiv of the spec's
`max_memory_usage_bytes` by its page), the maximum concurrency and the "KV cache size: N tokens" line.
The drafter's group annotation (`_annotate_eagle_groups`: which group a drafter's layers sit in, for
dropping blocks at run time) sizes nothing and is left out (no speculative_config is given).
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
    config = shared._config({"disable_hybrid": False, "block_size": case["block_size"]}, layout)
    config.model_config.max_model_len = case["max_model_len"]
    config.scheduler_config.max_model_len = case["max_model_len"]
    config.scheduler_config.max_num_batched_tokens = case["max_num_batched_tokens"]
    config.max_in_flight_tokens = case["max_num_batched_tokens"]   # one batch in flight: no pipeline stages
    config.cache_config.mamba_cache_mode = case["mamba_cache_mode"]
    config.cache_config.prefix_cache_retention_interval = None   # 0.33+: no retention asked for
    return config


def _specs(ki: Any, case: dict[str, Any]) -> dict[str, Any]:
    import torch
    bf16 = torch.bfloat16
    attention = {"block_size": case["block_size"], "num_kv_heads": case["heads"], "head_size": case["head_size"],
                 "dtype": bf16}
    kind = next(k for k in case["layers"] if k != "mamba")

    def attention_spec() -> Any:
        if kind == "mla":
            return shared._make(ki.MLAAttentionSpec, **attention, cache_dtype_str="auto")
        return shared._make(ki.FullAttentionSpec, **attention)

    # the conv state in bfloat16; the temporal state in float32 where config.json's mamba_ssm_dtype says so
    fp32 = case.get("state_fp32_elements", 0)
    state_shapes = ((case["state_elements"],), *([(fp32,)] if fp32 else []))
    state_dtypes = (bf16, *([torch.float32] if fp32 else []))
    specs: dict[str, Any] = {}
    for i, layer in enumerate(case["layers"]):   # the target's layers, then the drafter's
        if layer == "mamba":
            specs[f"model.layers.{i}.linear_attn"] = shared._make(
                ki.MambaSpec, block_size=case["mamba_block_size"], shapes=state_shapes,
                dtypes=state_dtypes, page_size_padded=case["state_page_padded"], mamba_cache_mode=case["mamba_cache_mode"],
                num_speculative_blocks=case["num_speculative_tokens"],
                num_prefill_checkpoint_blocks=case["checkpoint_blocks"])
        else:
            specs[f"model.layers.{i}.self_attn.attn"] = attention_spec()
    for i in range(case["draft_layers"]):
        specs[f"model.layers.{len(case['layers']) + i}.self_attn.attn"] = attention_spec()
    return specs


def _answer(tree: Path, case: dict[str, Any]) -> Any:
    name = next(m for m in PLANNING if (file := tree / (m.replace(".", "/") + ".py")).exists()
                and "def get_kv_cache_groups(" in file.read_text(encoding="utf-8"))
    planning = importlib.import_module(name)
    utils = importlib.import_module("vllm.v1.core.kv_cache_utils")
    ki = importlib.import_module("vllm.v1.kv_cache_interface")
    layout = getattr(importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout, shared.LAYOUT)
    config = _config(case, layout)
    groups = planning.get_kv_cache_groups(config, _specs(ki, case))
    return shared.sized_answer(tree, config, groups, case["memory"], planning, utils)


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
