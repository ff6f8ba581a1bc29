"""What the V1 runner's multimodal profile keeps beside the encoder cache (planner/encoder_held.py), as
tables, one test per release boundary, the releases' own profile_run where they are unpacked, and the
fit start-up that logs it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpu_log_corpus import all_runs, plan_run
from vllm_sources import release_tree_or_skip

from kvwatch.planner.devices import preset
from kvwatch.planner.encoder_cache import PADDED_SINCE, PADDED_UNTIL, EncoderShape, encoder_shape
from kvwatch.planner.encoder_held import (
    PIXELS_CAST_SINCE,
    dummy_pixel_bytes,
    mm_limits,
    profile_inputs_held_bytes,
    profiled_shape,
    unpadded_output_bytes,
)
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import profile_key
from kvwatch.values.versions import parse_version

# Qwen/Qwen3-VL-30B-A3B-Instruct's config.json (text hidden 2048; vision as published)
QWEN3_VL_30B = {"model_type": "qwen3_vl_moe", "text_config": {"hidden_size": 2048},
                "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "out_hidden_size": 2048,
                                  "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                  "in_channels": 3, "depth": 27, "deepstack_visual_indexes": [8, 16, 24]}}
# Qwen/Qwen2.5-VL-7B-Instruct's config.json
QWEN25_VL_7B = {"model_type": "qwen2_5_vl", "hidden_size": 3584,
                "vision_config": {"hidden_size": 1280, "intermediate_size": 3420, "out_hidden_size": 3584,
                                  "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                  "in_chans": 3, "depth": 32}}


def shape_of(config: dict) -> EncoderShape:
    shape = encoder_shape(config)
    assert shape is not None
    return shape


# a 16,384-token Qwen2.5-VL image: 65,536 patches of 3 x 2 x 14^2 = 1,176 values
@pytest.mark.parametrize("version, element_bytes", [
    ((0, 8, 5), 4),    # the processor's float32 pixels, no cast
    ((0, 9, 0), 2),    # cast to the model dtype from 0.9
    ((0, 28, 0), 2),
])
def test_the_pixels_are_float32_until_the_processor_casts_them(version: tuple, element_bytes: int) -> None:
    assert dummy_pixel_bytes(shape_of(QWEN25_VL_7B), version, 1, 16384, 2) == 65536 * 1176 * element_bytes


def test_the_cast_boundary_is_09() -> None:
    assert PIXELS_CAST_SINCE == (0, 9, 0)


def test_no_pixels_without_a_sized_tower_or_items() -> None:
    gemma = shape_of({"model_type": "gemma3", "text_config": {"hidden_size": 2560}, "mm_tokens_per_image": 256,
                      "vision_config": {"hidden_size": 1152}})
    assert dummy_pixel_bytes(gemma, (0, 13, 0), 4, 256, 2) == 0
    assert dummy_pixel_bytes(shape_of(QWEN25_VL_7B), (0, 13, 0), 0, 16384, 2) == 0


# Qwen3-VL's output width: 2048 x (1 + 3 deepstack levels) = 8192; budget 153,600 (a video's timestamps)
@pytest.mark.parametrize("version, items, encoded, budget, held_tokens", [
    ((0, 10, 2), 1, 12288, 153600, 0),       # no padding before 0.11
    ((0, 11, 0), 1, 12288, 153600, 12288),   # the pad loop keeps the last unpadded output
    ((0, 12, 0), 2, 12288, 153600, 24576),   # split views: the last one keeps every item's outputs
    ((0, 12, 0), 1, 16384, 16384, 0),        # an item that fills the budget takes no pad branch
    ((0, 13, 0), 1, 12288, 153600, 0),       # 0.13 caches the outputs unpadded
])
def test_the_unpadded_output_lives_in_011_and_012(version: tuple, items: int, encoded: int, budget: int,
                                                   held_tokens: int) -> None:
    assert unpadded_output_bytes(shape_of(QWEN3_VL_30B), version, items, encoded, budget, 2) == held_tokens * 8192 * 2


def test_another_models_last_output_is_one_item() -> None:
    gemma = shape_of({"model_type": "gemma3", "text_config": {"hidden_size": 2560}, "mm_tokens_per_image": 256,
                      "vision_config": {"hidden_size": 1152}})
    assert unpadded_output_bytes(gemma, (0, 11, 0), 8, 256, 2048, 2) == 256 * 2560 * 2


def test_the_padding_window_is_the_cache_modules() -> None:
    assert (PADDED_SINCE, PADDED_UNTIL) == ((0, 11, 0), (0, 13, 0))


@pytest.mark.parametrize("version, v2_runner, expected", [
    # 0.11.0, 2048 tokens: one 12,288-token video (153,600 counted); 49,152 patches x 1,536 values + its output
    ((0, 11, 0), False, 49152 * 1536 * 2 + 12288 * 8192 * 2),
    # 0.13.0: one 16,384-token image, its pixels only
    ((0, 13, 0), False, 65536 * 1536 * 2),
    # the V2 runner moves the items inside its encoder call
    ((0, 13, 0), True, 0),
])
def test_what_the_profile_holds_beside_the_cache(version: tuple, v2_runner: bool, expected: int) -> None:
    assert profile_inputs_held_bytes(shape_of(QWEN3_VL_30B), version, 2048, 256, 2, v2_runner) == expected


def test_nothing_for_a_text_model_or_an_empty_batch() -> None:
    assert profile_inputs_held_bytes(None, (0, 13, 0), 8192, 256, 2, False) == 0
    assert profile_inputs_held_bytes(shape_of(QWEN3_VL_30B), (0, 13, 0), 0, 256, 2, False) == 0


def profile_run_text(release: str) -> str:
    tree = release_tree_or_skip(release)
    source = (tree / "vllm/v1/worker/gpu_model_runner.py").read_text()
    start = source.index("    def profile_run(self")
    return source[start:source.index("\n    def ", start + 10)]


@pytest.mark.parametrize("release", ["0.8.5.post1", "0.9.2", "0.10.2", "0.11.2", "0.12.0", "0.13.0", "0.20.2",
                                     "0.28.0", "0.33.0"])
def test_the_releases_profile_run_keeps_its_dummy_batch_and_pads_in_the_window(release: str) -> None:
    """Live: the V1 runner's profile_run puts the dummy batch on the device, runs the language model
    without deleting it, and has the pad loop (`for output in dummy_encoder_outputs`) exactly in the
    padding window."""
    text = profile_run_text(release)
    assert "batched_dummy_mm_inputs" in text and "_dummy_run(" in text
    assert not re.search(r"del [^\n]*batched_dummy_mm_inputs", text)
    padded = PADDED_SINCE <= parse_version(release).parts < PADDED_UNTIL
    assert ("for output in dummy_encoder_outputs:" in text) == padded


def test_the_fit_qwen3_vl_start_up_is_planned_within_half_a_percent(tmp_path: Path) -> None:
    """search_qwen3_vl_30b_a3b_h100nvl_v0130 (0.13.0, one 16,384-token image): +1.0 % of KV before
    the held pixels, +0.1 % with them."""
    run = next(r for r in all_runs() if r["name"] == "search_qwen3_vl_30b_a3b_h100nvl_v0130")
    budget = plan_run(run, tmp_path / "m").gpu_budget
    assert budget is not None
    logged = run["logged"]["available_kv_cache_gib"] * 2**30
    assert abs(budget.kv_cache_bytes - logged) / logged < 0.005


@pytest.mark.parametrize("value, limits", [
    (None, ()),
    ('{"image": 2, "video": 0}', (("image", 2), ("video", 0))),
    ('{"video": {"count": 1, "num_frames": 32}, "image": 0}', (("video", 1), ("image", 0))),   # 0.11's per-item options
    ("image=3,video=0", (("image", 3), ("video", 0))),   # the older key=value form
    ('{"image": "x"}', ()),
    ("[1, 2]", ()),
])
def test_limit_mm_per_prompt_is_read_as_counts(value: str | None, limits: tuple) -> None:
    assert mm_limits(value) == limits


@pytest.mark.parametrize("limits, skip, image, video", [
    ({}, False, 16384, 12288),
    ({}, True, None, None),                          # --skip-mm-profiling: no encoder profile at all
    ({"video": 0}, False, 16384, 0),                 # the image is profiled instead of the video
    ({"image": 0}, False, 0, 12288),
    ({"image": 0, "video": 0}, False, None, None),   # every modality of the model off: no encoder budget
    ({"image": 1, "video": 1}, False, 16384, 12288),
])
def test_the_users_flags_shape_the_profile(limits: dict, skip: bool, image: int | None, video: int | None) -> None:
    shape = profiled_shape(shape_of(QWEN3_VL_30B), limits, skip)
    assert (shape.image_tokens, shape.video_tokens) == (image, video) if shape else (image, video) == (None, None)


def test_a_model_of_unknown_modalities_keeps_its_profile() -> None:
    """Only the Qwen-VL families' and Gemma 3's modalities are known: another model may profile audio."""
    omni = shape_of({"model_type": "qwen2_5_omni", "hidden_size": 3584, "vision_config": {"hidden_size": 1280}})
    assert profiled_shape(omni, {"image": 0}, False) == omni
    gemma = shape_of({"model_type": "gemma3", "text_config": {"hidden_size": 2560}, "mm_tokens_per_image": 256,
                      "vision_config": {"hidden_size": 1152}})
    assert profiled_shape(gemma, {"image": 0}, False) is None


def test_the_flags_reach_the_settings() -> None:
    settings = EngineCommand.parse(["vllm", "serve", "m", "--skip-mm-profiling",
                                    "--limit-mm-per-prompt", '{"video": 0}']).settings()
    assert settings.skip_mm_profiling and settings.mm_limits == (("video", 0),)


def test_the_flags_change_the_planned_profile(tmp_path: Path) -> None:
    """The held-out Qwen3-VL start-up (0.11.0, TP 4) planned under each flag: skipping the encoder's profile
    and turning every modality off plan the same peak, below the default's; video off profiles the
    16,384-token image, without the video's 153,600-token padded budget."""
    run = next(r for r in all_runs() if r["name"] == "search_qwen3_vl_30b_a3b_4x3090_v0110")

    def peak(*flags: str) -> int:
        budget = plan_run({**run, "flags": [*run["flags"], *flags]}, tmp_path / str(len(flags)) / flags[0]
                          if flags else tmp_path / "default").gpu_budget
        assert budget is not None
        return budget.activation_peak_bytes

    default, skipped = peak(), peak("--skip-mm-profiling")
    assert skipped == peak("--limit-mm-per-prompt '{\"image\": 0, \"video\": 0}'") < peak(
        "--limit-mm-per-prompt '{\"video\": 0}'") < default


def test_the_flags_are_part_of_a_learned_profiles_key() -> None:
    """A profile learned under one encoder profile does not stand for another; keys without the flags are kept."""
    def key(*flags: str) -> str:
        return profile_key(EngineCommand.parse(["vllm", "serve", "m", *flags]).settings(), preset("h100"),
                           parse_version("0.13.0"))

    assert len({key(), key("--skip-mm-profiling"), key("--limit-mm-per-prompt", '{"video": 0}')}) == 3
