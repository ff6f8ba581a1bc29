"""Which quantized MoE checkpoints run a kernel that keeps the modular kernel's workspaces, as tables."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.boundary.plan_loader import plan_command
from kvwatch.planner.devices import preset
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.moe_kernels import block_fp8, marlin_experts, moe_backend_asked, triton_block_fp8_experts

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


ON = {"VLLM_MXFP4_USE_MARLIN": "1"}


@pytest.mark.parametrize("flag,quantization,env,version,capability,expected", [
    (None, MXFP4, ON, (0, 22, 0), (9, 0), "marlin"),       # read first on any card in 0.22 and 0.23
    (None, MXFP4, ON, (0, 23, 1), (10, 0), "marlin"),
    (None, MXFP4, ON, (0, 17, 0), (9, 0), "marlin"),       # 0.17's fallback: Hopper reaches it
    (None, MXFP4, ON, (0, 17, 0), (10, 0), None),          # ... SM100's FlashInfer branches come first
    (None, MXFP4, ON, (0, 19, 0), (9, 0), None),           # 0.19's oracle reads it only for LoRA
    (None, MXFP4, ON, (0, 24, 0), (9, 0), None),           # gone from 0.24
    (None, MXFP4, ON, (0, 10, 2), (9, 0), None),           # declared, read nowhere
    (None, MXFP4, {"VLLM_MXFP4_USE_MARLIN": "0"}, (0, 22, 0), (9, 0), None),
    (None, MXFP4, {"VLLM_MXFP4_USE_MARLIN": "yes"}, (0, 22, 0), (9, 0), None),   # not an int: nothing followed
    (None, MXFP4, {}, (0, 22, 0), (9, 0), None),
    (None, GPTQ, ON, (0, 22, 0), (9, 0), None),            # the variable is MXFP4's
    ("triton", MXFP4, ON, (0, 22, 0), (9, 0), "triton"),   # the flag wins
    ("auto", MXFP4, ON, (0, 22, 0), (9, 0), "marlin"),
    (None, MXFP4, ON, (0, 22, 0), None, None),             # no GPU
])
def test_the_environment_asks_mxfp4_for_marlin_where_the_release_reads_it(flag, quantization, env, version,
                                                                          capability, expected) -> None:
    assert moe_backend_asked(flag, quantization, env, version, capability) == expected


GPT_OSS = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
           "num_local_experts": 128, "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 18, "max_position_embeddings": 131072,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "mxfp4"}}


def test_the_plan_reads_vllm_mxfp4_use_marlin_from_the_engines_environment(tmp_path: Path) -> None:
    """kvwatch plan / run pass the variable to the planner (boundary/plan_loader.py MEMORY_ENV): on an H200 at
    0.22 it asks gpt-oss-120b's experts for Marlin, whose tile padding the weights then carry."""
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS))

    def weights(env: dict[str, str]) -> int:
        plan = plan_command(["vllm", "serve", str(tmp_path)], preset("h200"), ruleset_for("0.22.0"), env=env,
                            vllm_version=parse_version("0.22.0"))
        assert plan.gpu_budget is not None
        return plan.gpu_budget.weights_bytes

    assert weights({"VLLM_MXFP4_USE_MARLIN": "1"}) > weights({}) == weights({"VLLM_MXFP4_USE_MARLIN": "0"})
