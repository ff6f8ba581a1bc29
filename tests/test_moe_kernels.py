"""Which quantized MoE checkpoints run a kernel that keeps the modular kernel's workspaces, as tables."""
from __future__ import annotations

import pytest

from kvwatch.vllm_releases.moe_kernels import block_fp8, marlin_experts, triton_block_fp8_experts

BLOCK = {"quant_method": "fp8", "weight_block_size": [128, 128]}


@pytest.mark.parametrize("quantization,capability,expert_parallel,version,expected", [
    (BLOCK, (9, 0), False, (0, 19, 0), True),      # Hopper at TP: Triton goes first
    (BLOCK, (9, 0), True, (0, 27, 1), False),      # Hopper with EP: FlashInfer's CUTLASS kernel
    (BLOCK, (12, 0), False, (0, 27, 1), True),     # SM120: no FlashInfer or DeepGEMM kernel takes it
    (BLOCK, (12, 0), True, (0, 27, 1), True),
    (BLOCK, (10, 0), False, (0, 27, 1), False),    # SM100: FlashInfer TRT-LLM
    (BLOCK, (8, 9), False, (0, 27, 1), False),     # Ada: not read
    (BLOCK, (12, 0), False, (0, 18, 0), False),    # before the oracle was read
    ({"quant_method": "fp8"}, (12, 0), False, (0, 27, 1), False),   # per-tensor FP8
    ({"quant_method": "awq", "bits": 4}, (12, 0), False, (0, 27, 1), False),
    (None, (12, 0), False, (0, 27, 1), False),
    (BLOCK, None, False, (0, 27, 1), False),       # no GPU
])
def test_block_fp8_experts_run_triton_where_the_oracle_says(quantization, capability, expert_parallel,
                                                            version, expected) -> None:
    assert triton_block_fp8_experts(quantization, capability, expert_parallel, version) is expected


def test_block_fp8_needs_a_block_size() -> None:
    assert block_fp8(BLOCK) and block_fp8({"quant_method": "FP8", "weight_block_size": [128, 128]})
    assert not block_fp8({"quant_method": "fp8", "weight_block_size": None}) and not block_fp8({})


GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128}
MXFP4 = {"quant_method": "mxfp4"}


@pytest.mark.parametrize("quantization,capability,version,moe_backend,expected", [
    (GPTQ, (12, 0), (0, 30, 0), None, True),        # the modular kernel's Marlin experts from 0.20
    (GPTQ, (8, 6), (0, 20, 0), None, True),
    (GPTQ, (12, 0), (0, 19, 0), None, False),       # 0.19 still called fused_marlin_moe
    (GPTQ, (10, 0), (0, 30, 0), None, False),       # SM100: FlashInfer's TRT-LLM kernel first
    ({"quant_method": "awq", "bits": 4}, (8, 9), (0, 27, 1), None, True),
    (MXFP4, (8, 0), (0, 19, 0), None, True),        # Marlin is the default below SM 9.0
    (MXFP4, (8, 0), (0, 18, 0), None, False),
    (MXFP4, (9, 0), (0, 19, 0), None, False),       # Hopper: the Triton MXFP4 kernel
    (MXFP4, (12, 0), (0, 30, 0), "marlin", True),   # asked for
    (MXFP4, (12, 0), (0, 30, 0), None, False),
    (BLOCK, (12, 0), (0, 30, 0), "marlin", False),  # block FP8 is not Marlin's
    (GPTQ, None, (0, 30, 0), None, False),
])
def test_marlin_experts_where_the_release_builds_them(quantization, capability, version, moe_backend,
                                                      expected) -> None:
    assert marlin_experts(quantization, capability, version, moe_backend) is expected
