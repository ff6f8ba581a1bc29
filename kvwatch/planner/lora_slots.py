"""The LoRA adapter slots `--enable-lora` allocates on a rank with the weights (pure, read from vLLM's code).

vLLM wraps every linear layer (lora/utils.py get_supported_lora_modules: "all linear layers support LoRA")
and, from 0.12, every fused-MoE layer, and gives each `--max-loras` slots of rank `--max-lora-rank` in the
LoRA dtype (the model's unless `--lora-dtype`), zero-filled when the LoRA manager is built inside the
loader's memory block, so "Model loading took" carries them (vLLM 0.17.0):
- a column-parallel layer keeps, per output slice (q, k and v; gate and up), A = rank x the whole input
  and B = the slice's output on this rank x rank (lora/layers/column_parallel_linear.py:208-234);
- a row-parallel layer, A = rank x its input on this rank and B = the whole output x rank
  (row_parallel_linear.py:26-27, base_linear.py:64-84);
- a fused-MoE layer, per local expert, A = rank x hidden and B = intermediate on this rank x rank for
  gate and up (one slice where the experts have no gate), and A = rank x intermediate, B = hidden x rank
  for down (lora/layers/fused_moe.py:355-400; from 0.12: absent from 0.11.0).
Sized here: the dense decoder layers (from their weight shapes) and the routed experts. The other layers
of MoE, MLA and Mamba models (attention, shared experts, mixers) and the LoRA kernels' share of the profile
are not: `covered` says so, and the plan's KV source names what is left out. (The profile's dummy adapters
are built in host memory, 0.17.0 lora/lora_weights.py:83-88, and copied into these slots.)
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.planner.weights import WeightCount

# From 0.8 the LoRA manager is built inside the loader's DeviceMemoryProfiler block (vLLM 0.8.0
# worker/model_runner.py:1111-1145, v1/worker/gpu_model_runner.py:1129-1139); 0.7.3 builds it after the
# block (:1111-1144) and before the profile's own baseline, so no part of that budget sees the slots.
SLOTS_IN_BUDGET_SINCE = (0, 8, 0)
MOE_LORA_SINCE = (0, 12, 0)   # lora/layers/fused_moe.py read in 0.12.0, 0.14.0 and 0.17.0; absent from 0.11.0
DEFAULT_MAX_LORAS = 1         # vLLM 0.17.0 config/lora.py:34
DEFAULT_MAX_LORA_RANK = 16    # :32


@dataclass(frozen=True)
class LoraSlots:
    bytes_per_rank: int
    covered: bool           # every LoRA-wrapped layer was sized (a dense decoder)
    in_budget: bool = True  # the release's budget sees the slots (SLOTS_IN_BUDGET_SINCE)


def lora_slots(count: WeightCount | None, max_loras: int | None, max_lora_rank: int | None, dtype_bytes: int,
               tensor_parallel: int, expert_parallel: bool, version: tuple[int, int, int]) -> LoraSlots:
    """The slots one rank holds where the budget counts them (SLOTS_IN_BUDGET_SINCE): max_loras x rank x
    dtype x the sum, over the wrapped layers, of each slice's A input and B output on this rank."""
    if version < SLOTS_IN_BUDGET_SINCE:
        return LoraSlots(0, True, in_budget=False)
    if count is None:
        return LoraSlots(0, False)
    tp = max(1, tensor_parallel)
    hidden = count.hidden_size
    per_slot = 0
    dense = len(count.layer_params) == 4 and not count.expert_matrices and hidden > 0
    if dense:
        qkv, o, gate_up, down = count.layer_params
        slices = max(1, count.mlp_matrices - 1)   # gate and up, or up alone
        qkv_out, mlp_width, o_in = qkv // hidden, gate_up // hidden, o // hidden
        per_layer = (3 * hidden + qkv_out // tp) + (o_in // tp + hidden) \
            + (slices * hidden + mlp_width // tp) + (down // hidden // tp + hidden)
        per_slot += per_layer * count.num_layers
    if count.expert_matrices and version >= MOE_LORA_SINCE:
        width = count.moe_width if expert_parallel else count.moe_width // tp
        experts = count.expert_matrices // tp if expert_parallel else count.expert_matrices
        per_slot += experts * count.matrices_per_expert * ((count.expert_hidden or hidden) + width)
    loras = max_loras or DEFAULT_MAX_LORAS
    rank = max_lora_rank or DEFAULT_MAX_LORA_RANK
    return LoraSlots(loras * rank * dtype_bytes * per_slot, dense)
