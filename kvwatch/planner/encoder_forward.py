"""The vision encoder's own forward pass in vLLM's V1 memory profile (pure): the Qwen-VL towers.

Before the language model's dummy pass, the V1 profile runs the encoder once over the dummy batch of
encoder_cache.profile_items (vLLM 0.28.0, vllm/v1/worker/gpu_model_runner.py profile_run:
`self.model.embed_multimodal(**batched_dummy_mm_inputs)`), so the profile's torch peak is at least
that pass's. A Qwen-VL tower turns an item of T tokens into T x merge^2 patches and runs every block
over all of them at once (varlen attention: no patches^2 term). Its peak is in a block's MLP, where
these are live per patch (vLLM 0.28.0, vllm/model_executor/models/qwen2_vl.py:426-443,
qwen2_5_vl.py:340-344 and :504-524, qwen3_vl.py:482-499 and :845-900):

- the residual stream: Qwen2-VL's and Qwen3-VL's LayerNorm blocks hold the block's input (the
  caller's reference), the stream after attention and the normed MLP input, 3 x width; Qwen2.5-VL's
  fused add-RMSNorm writes in place, 2 x width;
- the MLP: fc1's output and the activation's, 2 x mlp width; Qwen2.5-VL's gated MLP its gate-up
  output and the activation's, 3 x mlp width; over the tensor-parallel ranks (column-parallel fc1,
  mm_encoder_tp_mode "weights" by default);
- the pixels, C x T x P^2 values in the model dtype (the processor casts floating outputs to it,
  vLLM 0.28.0, vllm/multimodal/processing/context.py:245-247);
- Qwen3-VL's interpolated position embeddings, width per patch (qwen3_vl.py:780, kept in the encoder
  metadata through the blocks), and its deepstack features, out width per merged token per level.

Other towers (Gemma 3's SigLIP, InternViT, ...) are not sized: 0.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.values.config_values import positive_int, positive_number

_FUSED_NORM_FAMILIES = ("qwen2_5_vl",)            # fused add-RMSNorm in place: one less hidden state
_GATED_FAMILIES = ("qwen2_5_vl",)                 # gate-up MLP
_POSITION_EMBEDDING_FAMILIES = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")
DEFAULT_MLP_RATIO = 4                             # transformers' Qwen2VLVisionConfig (and CLIP's) default
DEFAULT_CHANNELS, DEFAULT_TEMPORAL_PATCH = 3, 2


@dataclass(frozen=True)
class VisionTower:
    """A Qwen-VL vision transformer's shapes, as the profile's peak needs them."""

    family: str
    width: int
    mlp_width: int
    patch_values: int          # C x T x P^2 pixel values per patch
    merge: int                 # spatial merge: merge^2 patches per output token
    deepstack_levels: int = 0
    out_width: int = 0

    def patch_elements(self, tensor_parallel: int) -> int:
        """Elements live per patch at the peak, in the model dtype (the module's list)."""
        hidden = (2 if self.family in _FUSED_NORM_FAMILIES else 3) * self.width
        mlp = (3 if self.family in _GATED_FAMILIES else 2) * -(-self.mlp_width // max(1, tensor_parallel))
        position = self.width if self.family in _POSITION_EMBEDDING_FAMILIES else 0
        return hidden + mlp + self.patch_values + position


def vision_mlp_width(vision: Mapping[str, Any], width: int) -> int:
    """A vision tower's MLP width: `intermediate_size`, else `mlp_ratio` (a finite positive number,
    else transformers' default 4) times its width (Qwen2-VL's and CLIP-like configs)."""
    ratio = positive_number(vision.get("mlp_ratio")) or DEFAULT_MLP_RATIO
    return positive_int(vision, "intermediate_size") or int(width * ratio)


def vision_tower(family: str, vision: Mapping[str, Any]) -> VisionTower | None:
    """The tower of a Qwen-VL vision_config (Qwen2-VL's `embed_dim`, the others' `hidden_size`), else None."""
    if family == "qwen2_vl":
        width = positive_int(vision, "embed_dim")
        mlp = vision_mlp_width(vision, width)
    else:
        width, mlp = positive_int(vision, "hidden_size"), positive_int(vision, "intermediate_size")
    patch, merge = positive_int(vision, "patch_size"), positive_int(vision, "spatial_merge_size")
    if not (width and mlp > 0 and patch and merge):
        return None
    channels = positive_int(vision, "in_channels", "in_chans") or DEFAULT_CHANNELS
    temporal = positive_int(vision, "temporal_patch_size") or DEFAULT_TEMPORAL_PATCH
    levels = vision.get("deepstack_visual_indexes")
    return VisionTower(family, width, mlp, channels * temporal * patch * patch, merge,
                       len(levels) if isinstance(levels, list) else 0, positive_int(vision, "out_hidden_size"))


def encoder_forward_bytes(tower: VisionTower | None, items: int, item_tokens: int, tensor_parallel: int,
                          dtype_bytes: int) -> int:
    """The tower's peak over the profile's dummy batch (`items` of `item_tokens` output tokens) on one rank."""
    if tower is None or items <= 0 or item_tokens <= 0:
        return 0
    tokens = items * item_tokens
    patches = tokens * tower.merge * tower.merge
    deepstack = tower.deepstack_levels * tower.out_width * tokens
    return (patches * tower.patch_elements(tensor_parallel) + deepstack) * dtype_bytes
