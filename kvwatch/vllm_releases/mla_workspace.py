"""The decode workspace vLLM's TRITON_MLA backend reserves inside the memory profile (pure).

From 0.33 an MLA layer's profile pass (no attention metadata) asks its backend to claim its
persistent workspace (vLLM 0.33.0, vllm/model_executor/layers/attention/mla_attention.py:948; 0.34.0
:1058). TRITON_MLA claims the float32 logits of its split-KV decode at their worst case
(reserve_workspace, 0.33.0 vllm/v1/attention/backends/mla/triton_mla.py:234-244, 0.34.0 :258-269;
_reserve_attn_logits_workspace, 0.33.0 :53-71, 0.34.0 :56-82):

    4 B x (max_num_seqs x decode query length) x heads per rank x splits x (kv_lora_rank + 1)

splits = min(next power of two of max(1, max_model_len // 512), 2 x the card's multiprocessors)
(_compute_num_kv_splits and its two constants, 0.33.0 triton_mla.py:40-50, 0.34.0 :43-53). The
decode query length is 1 without speculative decoding (max_decode_query_len, 0.33.0
vllm/v1/attention/backend.py:572-589), the only case kvwatch reads; the heads are the rank's
(num_heads // tensor parallel) times the decode context parallel size, which kvwatch takes as 1.
0.34 clamps max_model_len to a layer's sliding window, which only a windowed draft model has.

The workspace manager keeps one buffer (per micro-batch and lane), grown to the largest request and
each request's tensors rounded up to 256 B (get_simultaneous, 0.33.0 vllm/v1/worker/workspace.py:194,
0.34.0 :203): the fused-MoE workspaces (planner/gpu_budget.py MOE_WORKSPACE_SINCE) share it, and the
profile keeps the larger of the two.

From 0.25 to 0.32 TRITON_MLA reserved the same buffer in its metadata builder only (vLLM 0.32.0,
triton_mla.py:62), built after the profile: the KV cache was sized without it. The other MLA
backends claim nothing there (the base reserve_workspace returns, 0.33.0 backend.py:1091-1094).
"""
from __future__ import annotations

from kvwatch.vllm_releases.kv_layout import Boundary

BACKEND = "TRITON_MLA"
RESERVED_IN_PROFILE = Boundary((0, 33, 0), "vLLM 0.33.0, vllm/v1/attention/backends/mla/triton_mla.py:234-244",
                               "vLLM 0.32.0, vllm/v1/attention/backends/mla/triton_mla.py:62")
MIN_WORK_PER_SPLIT = 512          # triton_mla.py _MIN_WORK_PER_SPLIT (0.33.0 :40, 0.34.0 :43)
SPLIT_OCCUPANCY_MULTIPLIER = 2    # triton_mla.py _SPLIT_OCCUPANCY_MULTIPLIER (0.33.0 :41, 0.34.0 :44)
LOGITS_BYTES = 4                  # torch.float32
VIEW_ALIGNMENT = 256              # workspace.py get_simultaneous: round_up(actual, 256)


def num_kv_splits(max_seq_len: int, multiprocessors: int | None) -> int:
    """_compute_num_kv_splits: a power of two, at most two per multiprocessor. A card whose count
    kvwatch does not know gets the uncapped figure, never below what vLLM takes."""
    ideal = 1 << (max(1, max_seq_len // MIN_WORK_PER_SPLIT) - 1).bit_length()
    if multiprocessors is None:
        return ideal
    return min(ideal, multiprocessors * SPLIT_OCCUPANCY_MULTIPLIER)


def decode_logits_bytes(max_num_seqs: int, heads_per_rank: int, kv_lora_rank: int, max_model_len: int,
                        multiprocessors: int | None, decode_query_len: int = 1) -> int:
    """The workspace TRITON_MLA reserves at the profile's worst case, as get_simultaneous allocates it."""
    splits = num_kv_splits(max_model_len, multiprocessors)
    actual = LOGITS_BYTES * max_num_seqs * decode_query_len * heads_per_rank * splits * (kv_lora_rank + 1)
    return -(-actual // VIEW_ALIGNMENT) * VIEW_ALIGNMENT


def reserved_in_profile(backend: str | None, parts: tuple[int, int, int]) -> bool:
    """Whether the release's profile run claims the backend's decode workspace."""
    return backend is not None and backend.upper() == BACKEND and parts >= RESERVED_IN_PROFILE.since
