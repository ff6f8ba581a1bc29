"""The LoRA adapter slots --enable-lora allocates with the weights (kvwatch/planner/lora_slots.py), as tables."""
from __future__ import annotations

from pathlib import Path

import pytest
from gpu_log_corpus import GiB, plan_run, started_runs

from kvwatch.errors import CommandError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.lora_slots import lora_slots
from kvwatch.planner.weights import count_weights

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
            "tie_word_embeddings": False}
# per layer and unit of rank, A inputs and B outputs: q, k, v (3 x 4096 + 4096 + 1024 + 1024), o (4096 + 4096),
# gate and up (2 x 4096 + 2 x 14336), down (14336 + 4096)
LLAMA_PER_LAYER = 18432 + 8192 + 36864 + 18432
# column-parallel B outputs and row-parallel A inputs split over the ranks
LLAMA_PER_LAYER_TP2 = (3 * 4096 + 3072) + (2048 + 4096) + (2 * 4096 + 14336) + (7168 + 4096)


@pytest.mark.parametrize("max_loras, rank, tp, expected", [
    (None, None, 1, 1 * 16 * 2 * 32 * LLAMA_PER_LAYER),          # vLLM's defaults: 1 slot of rank 16
    (1, 32, 1, 32 * 2 * 32 * LLAMA_PER_LAYER),                   # 160 MiB
    (8, 64, 1, 8 * 64 * 2 * 32 * LLAMA_PER_LAYER),               # multi-LoRA: 2.5 GiB
    (1, 32, 2, 32 * 2 * 32 * LLAMA_PER_LAYER_TP2),
])
def test_a_dense_decoders_slots_are_its_layers_inputs_and_outputs(max_loras, rank, tp, expected) -> None:
    slots = lora_slots(count_weights(LLAMA_8B), max_loras, rank, 2, tp, False, (0, 17, 0))
    assert slots.bytes_per_rank == expected and slots.covered


NEMOTRON_EXPERTS = 23 * 128   # MoE layers x routed experts of Nemotron-3-Nano-30B-A3B (no gate: up and down)


@pytest.mark.parametrize("version, tp, ep, experts_part", [
    ((0, 17, 1), 1, False, NEMOTRON_EXPERTS * 2 * (2688 + 1856)),
    ((0, 17, 1), 2, False, NEMOTRON_EXPERTS * 2 * (2688 + 928)),        # the intermediate split
    ((0, 17, 1), 2, True, NEMOTRON_EXPERTS // 2 * 2 * (2688 + 1856)),   # whole experts, half of them
    ((0, 11, 0), 1, False, 0),                                          # no fused-MoE LoRA before 0.12
])
def test_routed_experts_have_a_slot_each_from_012(version, tp, ep, experts_part) -> None:
    run = next(r for r in started_runs() if r["name"] == "renta_nemotron3_nano_30b_rtxpro6000_lora_r32_u085_v0171")
    count = count_weights(run["model_config"])
    assert count is not None and count.expert_matrices == NEMOTRON_EXPERTS
    slots = lora_slots(count, 1, 32, 2, tp, ep, version)
    assert slots.bytes_per_rank == 32 * 2 * experts_part
    assert not slots.covered   # its attention, shared experts and Mamba mixers are not sized


def test_no_shapes_no_slots() -> None:
    assert lora_slots(None, 4, 64, 2, 1, False, (0, 30, 0)).bytes_per_rank == 0


def test_nemotron_with_lora_loads_the_weights_it_logs(tmp_path: Path) -> None:
    """Nemotron-3-Nano at rank 32 on an RTX PRO 6000 (0.17.1) logs 60.64 GiB of weights; without the slots
    kvwatch planned 58.88. With the experts' slots it plans within 0.2 GiB (the rest: the slots of its
    attention, shared experts and Mamba mixers), and the plan says what it leaves out."""
    run = next(r for r in started_runs() if r["name"] == "renta_nemotron3_nano_30b_rtxpro6000_lora_r32_u085_v0171")
    plan = plan_run(run, tmp_path)
    assert plan.gpu_budget is not None
    assert abs(plan.gpu_budget.weights_bytes / GiB - run["logged"]["model_weights_gib"]) < 0.2
    assert "LoRA profile are not" in plan.kv_memory_source


def test_before_08_the_budget_does_not_see_the_slots() -> None:
    """0.7.3 builds the LoRA manager after the loader's memory block and before the profile's baseline."""
    count = count_weights(LLAMA_8B)
    assert lora_slots(count, 1, 32, 2, 1, False, (0, 7, 3)).bytes_per_rank == 0
    assert lora_slots(count, 1, 32, 2, 1, False, (0, 8, 0)).bytes_per_rank == 32 * 2 * 32 * LLAMA_PER_LAYER


def test_a_plan_before_08_says_the_release_does_not_count_the_slots(tmp_path: Path) -> None:
    run = next(r for r in started_runs() if r["name"] == "search_llama31_8b_bnb4_t4_unsloth_u060_v072")
    assert "outside its budget (before 0.8)" in plan_run(run, tmp_path).kv_memory_source


@pytest.mark.parametrize("flag, value", [("--max-loras", "0"), ("--max-loras", "-2"), ("--max-lora-rank", "-5"),
                                         ("--max-loras", "many")])
def test_a_lora_count_below_one_is_one_error_not_fewer_slots(flag: str, value: str) -> None:
    """vLLM validates max_loras >= 1 (config/lora.py:34) and a rank from its list: a negative count must not
    shrink the planned weights; it is one CommandError naming the flag."""
    with pytest.raises(CommandError, match=flag):
        EngineCommand.parse(["vllm", "serve", "m", "--enable-lora", flag, value]).settings()
