"""The multimodal encoder cache the V1 profile holds (planner/encoder_cache.py), as tables."""
from __future__ import annotations

import pytest

from kvwatch.planner.encoder_cache import (
    QWEN3_VL_VIDEO_TOKENS,
    EncoderShape,
    encoder_cache_bytes,
    encoder_shape,
    item_tokens,
)

QWEN3_VL = {"model_type": "qwen3_vl_moe", "text_config": {"hidden_size": 2048},
            "vision_config": {"out_hidden_size": 2048, "deepstack_visual_indexes": [8, 16, 24]}}
QWEN25_VL = {"model_type": "qwen2_5_vl", "hidden_size": 3584, "vision_config": {"hidden_size": 1280}}
GEMMA3 = {"model_type": "gemma3", "mm_tokens_per_image": 256, "text_config": {"hidden_size": 5376},
          "vision_config": {"hidden_size": 1152}}
LLAVA = {"model_type": "llava_next", "text_config": {"hidden_size": 4096}, "vision_config": {"hidden_size": 1024}}


def test_a_text_only_config_has_no_encoder() -> None:
    assert encoder_shape({"model_type": "llama", "hidden_size": 4096}) is None
    assert encoder_cache_bytes(None, (0, 13, 0), 8192, 256, 2) == 0


@pytest.mark.parametrize("config,width,image,video", [
    (QWEN3_VL, 2048 * 4, 16384, 12288),    # deepstack: three more out_hidden_size slices per token
    (QWEN25_VL, 3584, 16384, 0),
    (GEMMA3, 5376, 256, 0),
    (LLAVA, 4096, 0, 0),                   # tokens per item unknown
])
def test_the_shape_comes_from_config_json(config: dict, width: int, image: int, video: int) -> None:
    shape = encoder_shape(config)
    assert shape is not None
    assert (shape.output_width, shape.image_tokens, shape.video_tokens) == (width, image, video)


@pytest.mark.parametrize("version,expected", [
    ((0, 11, 0), int(QWEN3_VL_VIDEO_TOKENS * 12.5)),   # 153,600: the timestamps counted 12.5 times
    ((0, 12, 0), 153600),
    ((0, 13, 0), 16384),                               # 0.13 counts the video's own tokens: the image wins
])
def test_qwen3_vl_profiles_its_video_until_013(version: tuple[int, int, int], expected: int) -> None:
    shape = encoder_shape(QWEN3_VL)
    assert shape is not None and item_tokens(shape, version) == expected


@pytest.mark.parametrize("shape,version,batched,seqs,tokens_held", [
    # one item larger than the batch: the budget is the item (153,600 tokens as vLLM 0.11.0 logs it)
    (encoder_shape(QWEN3_VL), (0, 11, 0), 2048, 256, 153600),
    (encoder_shape(QWEN3_VL), (0, 13, 0), 8192, 256, 16384),
    # small items: as many as the budget takes, each padded to the whole budget in 0.11-0.12
    (encoder_shape(GEMMA3), (0, 13, 0), 8192, 256, 32 * 256),
    (encoder_shape(GEMMA3), (0, 12, 0), 8192, 256, 32 * 8192),
    (encoder_shape(GEMMA3), (0, 12, 0), 8192, 4, 4 * 8192),    # no more items than requests
    # unknown items: the budget as one item (a lower bound)
    (encoder_shape(LLAVA), (0, 10, 2), 16384, 1024, 16384),
])
def test_the_cache_holds_items_times_their_tokens(shape: EncoderShape | None, version: tuple[int, int, int],
                                                  batched: int, seqs: int, tokens_held: int) -> None:
    assert shape is not None
    assert encoder_cache_bytes(shape, version, batched, seqs, 2) == tokens_held * shape.output_width * 2
