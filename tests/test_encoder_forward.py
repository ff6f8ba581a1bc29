"""The vision encoder's own pass in the V1 memory profile (planner/encoder_forward.py), as tables, and
the one fit start-up that logs it alone."""
from __future__ import annotations

from pathlib import Path

import pytest
from gpu_log_corpus import GiB, all_runs, plan_run

from kvwatch.planner.encoder_cache import counted_and_encoded_tokens, encoder_shape
from kvwatch.planner.encoder_forward import encoder_forward_bytes, vision_tower

# the vision_config fields of the published checkpoints' config.json
QWEN2_VL_7B = {"embed_dim": 1280, "mlp_ratio": 4, "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
               "temporal_patch_size": 2, "in_chans": 3, "depth": 32}
QWEN25_VL_7B = {"hidden_size": 1280, "intermediate_size": 3420, "out_hidden_size": 3584, "patch_size": 14,
                "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3, "depth": 32}
QWEN3_VL_30B = {"hidden_size": 1152, "intermediate_size": 4304, "out_hidden_size": 2048, "patch_size": 16,
                "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "depth": 27,
                "deepstack_visual_indexes": [8, 16, 24]}
QWEN35_08B = {"hidden_size": 768, "intermediate_size": 3072, "out_hidden_size": 1024, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3, "depth": 12}


@pytest.mark.parametrize("family, vision, tp, per_patch", [
    # 3 hidden states + fc1 and GELU outputs + 3 x 2 x 14^2 pixel values
    ("qwen2_vl", QWEN2_VL_7B, 1, 3 * 1280 + 2 * 5120 + 1176),
    # fused add-RMSNorm: 2 hidden states; gate-up (2 x 3420) and SiLU-and-mul (3420), half each at TP 2
    ("qwen2_5_vl", QWEN25_VL_7B, 2, 2 * 1280 + 3 * 1710 + 1176),
    # LayerNorm blocks, 16-pixel patches, interpolated position embeddings
    ("qwen3_vl_moe", QWEN3_VL_30B, 4, 3 * 1152 + 2 * 1076 + 1536 + 1152),
    ("qwen3_5", QWEN35_08B, 1, 3 * 768 + 2 * 3072 + 1536 + 768),
])
def test_the_elements_live_per_patch(family: str, vision: dict, tp: int, per_patch: int) -> None:
    tower = vision_tower(family, vision)
    assert tower is not None and tower.patch_elements(tp) == per_patch


@pytest.mark.parametrize("family, vision", [
    ("qwen2_vl", {**QWEN2_VL_7B, "embed_dim": None}),
    ("qwen3_vl", {**QWEN3_VL_30B, "intermediate_size": "4304"}),
    ("qwen2_5_vl", {**QWEN25_VL_7B, "spatial_merge_size": 0}),
])
def test_no_tower_without_its_shapes(family: str, vision: dict) -> None:
    assert vision_tower(family, vision) is None


def test_a_qwen3_vl_pass_is_its_patches_and_its_deepstack_features() -> None:
    tower = vision_tower("qwen3_vl_moe", QWEN3_VL_30B)
    assert tower is not None
    # one 16,384-token image: 65,536 patches; three deepstack levels of 2048 per merged token
    assert encoder_forward_bytes(tower, 1, 16384, 4, 2) == (65536 * tower.patch_elements(4) + 3 * 2048 * 16384) * 2
    assert encoder_forward_bytes(tower, 0, 16384, 4, 2) == 0 and encoder_forward_bytes(None, 1, 16384, 1, 2) == 0


@pytest.mark.parametrize("version, counted, encoded", [
    ((0, 11, 0), 153600, 12288),   # the video wins the budget by its timestamps; its frames are 12,288 tokens
    ((0, 13, 0), 16384, 16384),    # from 0.13 the image is the largest item
])
def test_a_video_counted_with_timestamps_encodes_its_own_frames(version: tuple, counted: int, encoded: int) -> None:
    shape = encoder_shape({"model_type": "qwen3_vl", "text_config": {"hidden_size": 2048},
                           "vision_config": QWEN3_VL_30B})
    assert shape is not None and counted_and_encoded_tokens(shape, version) == (counted, encoded)


def test_qwen35_profiles_qwen3_vls_tower_and_image() -> None:
    shape = encoder_shape({"model_type": "qwen3_5", "text_config": {"hidden_size": 1024}, "vision_config": QWEN35_08B})
    assert shape is not None and shape.tower is not None and shape.image_tokens == 16384


def test_the_served_qwen35_run_logs_the_encoders_pass_as_its_peak(tmp_path: Path) -> None:
    """search_qwen35_08b_a100_80g_serve_u085_v0280 (32 sequences, 2048 tokens: the language model and
    the sampler peak far lower) logs 1.36 GiB of peak activation: the tower's pass over one 16,384-token
    image. Planned from the code within 5 %; before this term 0.12 GiB."""
    run = next(r for r in all_runs() if r["name"] == "search_qwen35_08b_a100_80g_serve_u085_v0280")
    budget = plan_run(run, tmp_path / "m").gpu_budget
    assert budget is not None
    logged = run["logged"]["activation_peak_gib"] * GiB
    assert abs(budget.activation_peak_bytes - logged) / logged < 0.05
