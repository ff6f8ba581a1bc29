"""The multimodal encoder cache vLLM's V1 memory profile holds while it profiles the language model (pure).

Before the language model's dummy pass, the V1 profile run of a multimodal model runs its encoder on
a dummy batch of the largest items the model accepts and keeps the outputs in the encoder cache
until the language model and the sampler have run (vLLM 0.13.0, vllm/v1/worker/gpu_model_runner.py:4462-4486,
profile_run; the same from 0.8.5). Those outputs are part of the profile's torch peak, so the KV
cache loses them:

    tokens held = items x tokens per item        (0.11.0-0.12.x: items x the encoder budget)
    bytes       = tokens held x output width x dtype bytes

- **Encoder budget**: max(max_num_batched_tokens, tokens of the largest item)
  (vLLM 0.13.0, vllm/v1/core/encoder_cache_manager.py:342-349 compute_mm_encoder_budget, with
  encoder_cache_size = max_num_batched_tokens, vllm/config/scheduler.py:227).
- **Items**: max(1, min(budget // tokens per item, max_num_seqs x items per prompt))
  (vLLM 0.13.0, vllm/v1/worker/utils.py:85-128 get_max_items); one item when it fills the budget.
- **0.11.0-0.12.x** pad every dummy output to the whole budget before caching it (vLLM 0.11.0,
  vllm/v1/worker/gpu_model_runner.py:3376; vLLM 0.12.0, same file:4342; absent from 0.10.2 and 0.13.0).
- **Output width**: the language model's hidden size; Qwen3-VL adds its deepstack levels, one
  `out_hidden_size` slice each (vLLM 0.13.0, vllm/model_executor/models/qwen3_vl.py:1317-1318).

Tokens per item, where vLLM's processor info gives them from the checkpoint:
- Qwen2-VL / Qwen2.5-VL: one image of the processor's max_pixels, 12,845,056 in the checkpoints'
  preprocessor_config.json, over (patch x merge)^2 = 28^2: 16,384 tokens (vLLM 0.13.0,
  vllm/model_executor/models/qwen2_vl.py:873).
- Qwen3-VL: an image of the processor's size["longest_edge"], 16,777,216 in the checkpoints'
  preprocessor_config.json, over 32^2: 16,384 tokens (vLLM 0.13.0, vllm/model_executor/models/qwen3_vl.py:678).
  Its videos (video_preprocessor_config.json: longest_edge 25,165,824 over two frames per temporal
  patch) give 12,288 tokens, counted 12.5 times for their timestamps in 0.11.0-0.12.x (vLLM 0.11.0,
  vllm/model_executor/models/qwen3_vl.py:674; gone in 0.13.0): 153,600, then larger than an image.
- Gemma 3: `mm_tokens_per_image` of config.json (no pan-and-scan by default).
- Others: unknown; the budget is then taken as one item (a lower bound of what the profile holds).

The V0 engine profiles multimodal models another way (dummy sequences carrying the items) and is
not counted here. The encoder's own forward pass, which peaks before the cache is filled, is
planner/encoder_forward.py's (the Qwen-VL vision towers).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.planner.encoder_forward import VisionTower, vision_tower
from kvwatch.values.config_values import positive_int as _int

QWEN2_VL_IMAGE_TOKENS = 12_845_056 // (28 * 28)
QWEN3_VL_IMAGE_TOKENS = 16_777_216 // (32 * 32)
QWEN3_VL_VIDEO_TOKENS = 25_165_824 // 2 // (32 * 32)
QWEN3_VL_VIDEO_TIMESTAMP_FACTOR = 12.5
PADDED_SINCE, PADDED_UNTIL = (0, 11, 0), (0, 13, 0)   # outputs padded to the budget
QWEN3_VL_TIMESTAMPS_UNTIL = (0, 13, 0)
_QWEN2_VL = ("qwen2_vl", "qwen2_5_vl")
# Qwen3.5 builds Qwen3-VL's vision tower and processor (vLLM 0.28.0, models/qwen3_5.py imports
# Qwen3_VisionTransformer; Qwen/Qwen3.5-2B-Base's preprocessor_config.json: Qwen3VLProcessor, longest_edge
# 16,777,216, patch 16, merge 2)
_QWEN3_VL = ("qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")


@dataclass(frozen=True)
class EncoderShape:
    """What the encoder's dummy outputs look like: the model family, the width of one output token,
    and the tokens of one item of each modality the profile may pick (0: unknown)."""

    family: str
    output_width: int
    image_tokens: int = 0
    video_tokens: int = 0
    tower: VisionTower | None = None     # the vision transformer the profile runs (planner/encoder_forward.py)


def encoder_shape(config: Mapping[str, Any]) -> EncoderShape | None:
    """The encoder shape of a multimodal config.json (one with a `vision_config`), else None."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    family = str(config.get("model_type") or "")
    width = _int(text, "hidden_size") or _int(config, "hidden_size")
    if not width:
        return None
    if family in _QWEN3_VL:
        levels = vision.get("deepstack_visual_indexes")
        width = (_int(vision, "out_hidden_size") or width) * (1 + (len(levels) if isinstance(levels, list) else 0))
        return EncoderShape(family, width, QWEN3_VL_IMAGE_TOKENS, QWEN3_VL_VIDEO_TOKENS, vision_tower(family, vision))
    if family in _QWEN2_VL:
        return EncoderShape(family, width, QWEN2_VL_IMAGE_TOKENS, tower=vision_tower(family, vision))
    return EncoderShape(family, width, _int(config, "mm_tokens_per_image"))


def item_tokens(shape: EncoderShape, version: tuple[int, int, int]) -> int:
    """Tokens of the largest item the profile runs, as the budget counts them (0: unknown)."""
    return counted_and_encoded_tokens(shape, version)[0]


def counted_and_encoded_tokens(shape: EncoderShape, version: tuple[int, int, int]) -> tuple[int, int]:
    """The largest item's tokens as the budget counts them, and as its encoder makes them: a Qwen3-VL
    video's timestamps count in 0.11.0-0.12.x, but its frames are the same pixels."""
    video = shape.video_tokens
    if video and shape.family in _QWEN3_VL and version < QWEN3_VL_TIMESTAMPS_UNTIL:
        counted = int(video * QWEN3_VL_VIDEO_TIMESTAMP_FACTOR)
        return (counted, video) if counted > shape.image_tokens else (shape.image_tokens, shape.image_tokens)
    largest = max(shape.image_tokens, video)
    return largest, largest


def profile_items(shape: EncoderShape, version: tuple[int, int, int], max_num_batched_tokens: int,
                  max_num_seqs: int) -> tuple[int, int, int]:
    """(items, tokens per item, encoder budget) of the profile's dummy encoder batch; 0 items where
    the tokens per item are unknown (the module's list)."""
    per_item = item_tokens(shape, version)
    budget = max(max_num_batched_tokens, per_item)
    if not per_item:
        return 0, 0, budget
    return max(1, min(budget // per_item, max(1, max_num_seqs))), per_item, budget


def encoder_cache_bytes(shape: EncoderShape | None, version: tuple[int, int, int], max_num_batched_tokens: int,
                        max_num_seqs: int, dtype_bytes: int) -> int:
    """Bytes of dummy encoder outputs the V1 profile holds during the language model's pass."""
    if shape is None or max_num_batched_tokens <= 0:
        return 0
    items, per_item, budget = profile_items(shape, version, max_num_batched_tokens, max_num_seqs)
    if items:
        held = items * (budget if PADDED_SINCE <= version < PADDED_UNTIL else per_item)
    else:
        held = budget
    return held * shape.output_width * dtype_bytes
