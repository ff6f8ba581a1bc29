"""Llama 3.2 Vision's V0 memory profile (kvwatch/vllm_releases/mllama_profile.py), as tables: the
shapes from config.json, the encoder's peak per release, the engine it runs on, and the public
start-ups of Llama-3.2-11B-Vision-Instruct that failed or served for its sake."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gpu_log_corpus import GiB, all_runs, model_config, patched_runs, plan_run

from kvwatch.planner.gpu_budget import V0_ENGINE, V1_ENGINE, release_for
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases.mllama_profile import (
    DEFAULT_INTERMEDIATE_LAYERS,
    MLLAMA_ARCHITECTURE,
    cross_states_bytes,
    mllama_vision,
    runs_v0_profile,
    vision_peak_bytes,
)

# Llama-3.2-11B-Vision's config.json as the corpus holds it (the Instruct checkpoint's is the same shape)
RUN = next(r for r in all_runs() if r["name"] == "pr12126_llama32_11b_vision_h100")
CONFIG = model_config(RUN)


def test_the_vision_shapes_come_from_config_json() -> None:
    vision = mllama_vision(CONFIG)
    assert vision is not None
    # 560 / 14 = 40 x 40 patches + the class token = 1601, padded to 1608; four tiles
    assert (vision.tile_tokens, vision.sequence) == (1601, 6432)
    # the config names no intermediate_layers_indices: vision_output_dim 7680 = 1280 x (1 + 5)
    assert vision.intermediate_layers == 5 and vision.text_hidden_size == 4096


@pytest.mark.parametrize("change, layers", [
    ({"intermediate_layers_indices": [3, 7, 15]}, 3),
    ({"vision_output_dim": None}, DEFAULT_INTERMEDIATE_LAYERS),
])
def test_the_intermediate_states_are_the_listed_ones_else_the_output_width(change: dict, layers: int) -> None:
    vision_config = {k: v for k, v in {**CONFIG["vision_config"], **change}.items() if v is not None}
    vision = mllama_vision({**CONFIG, "vision_config": vision_config})
    assert vision is not None and vision.intermediate_layers == layers


@pytest.mark.parametrize("config", [
    {**CONFIG, "model_type": "llava"},                                     # another model
    {k: v for k, v in CONFIG.items() if k != "vision_config"},             # no vision tower
    {**CONFIG, "vision_config": {**CONFIG["vision_config"], "image_size": "560"}},   # garbage
    {**CONFIG, "vision_config": {**CONFIG["vision_config"], "max_num_tiles": 0}},
])
def test_no_mllama_vision_without_its_shapes(config: dict[str, Any]) -> None:
    assert mllama_vision(config) is None


# Per image, bf16: mask 6432^2 + (1 + 2 x 5) x 6432 x 1280 (output tuple and stack) + 4 x 6432 x 1280
# + 2 x 6432 x 5120 / TP elements x 2 bytes, plus the float32 pixels 4 x 3 x 560^2 x 4 (twice to 0.6.6).
@pytest.mark.parametrize("version, tp, per_image", [
    ((0, 6, 6), 1, (41_370_624 + 90_562_560 + 32_931_840 + 65_863_680) * 2 + 2 * 15_052_800),
    ((0, 7, 3), 1, (41_370_624 + 90_562_560 + 32_931_840 + 65_863_680) * 2 + 15_052_800),
    ((0, 10, 2), 2, (41_370_624 + 90_562_560 + 32_931_840 + 65_863_680 // 2) * 2 + 15_052_800),
])
def test_the_encoder_peak_per_image(version: tuple[int, int, int], tp: int, per_image: int) -> None:
    vision = mllama_vision(CONFIG)
    assert vision is not None
    assert vision_peak_bytes(vision, 1, tp, 2, version) == per_image
    assert vision_peak_bytes(vision, 128, tp, 2, version) == 128 * per_image
    assert cross_states_bytes(vision, 1, 2) == 4 * 1601 * 4096 * 2


@pytest.mark.parametrize("version, env, engine", [
    ("0.7.3", {}, V0_ENGINE),                      # V0 is the default engine
    ("0.8.5", {}, V0_ENGINE),                      # V1 by default, but Mllama is SupportsV0Only
    ("0.10.2", {}, V0_ENGINE),
    ("0.10.2", {"VLLM_USE_V1": "1"}, V1_ENGINE),   # asked for V1: vLLM refuses rather than falls back
])
def test_mllama_runs_on_the_v0_engine_while_vllm_has_it(version: str, env: dict, engine: str) -> None:
    assert release_for(parse_version(version), env, (MLLAMA_ARCHITECTURE,)).engine == engine


@pytest.mark.parametrize("version, profiled", [((0, 6, 3), True), ((0, 10, 2), True), ((0, 11, 0), False)])
def test_the_v0_profile_is_planned_only_where_vllm_registers_mllama(version: tuple, profiled: bool) -> None:
    assert runs_v0_profile(version) is profiled


def _run(gpu: str, total_gib: float, flags: list[str], version: str = "0.6.3") -> dict[str, Any]:
    return {**RUN, "name": "mllama", "status": "ok", "gpu": gpu, "total_gpu_memory_gib": total_gib,
            "total_gpu_memory_source": "logged", "flags": flags, "vllm_version": version,
            "planned_for_vllm_version": version}


# Public start-ups of Llama-3.2-11B-Vision-Instruct on vLLM 0.6.3 (the profile's default is 256 dummy
# sequences, one image each): vllm#9445 (A100 80GB: OOM at the default; serves with --max-num-seqs 32
# --enforce-eager), vllm#10569 (L20 48 GB: OOM in the profile, "pixel_values is torch.Size([256, 1, 1,
# 4, 3, 560, 560])"), vllm#9352 (A100 80GB: serves with --max-num-seqs 70 --enforce-eager).
@pytest.mark.parametrize("gpu, total, flags, starts", [
    ("NVIDIA A100-SXM4-80GB", 79.15, ["--max-model-len 1024"], False),
    ("NVIDIA A100-SXM4-80GB", 79.15, ["--max-model-len 1024", "--max-num-seqs 32", "--enforce-eager"], True),
    ("NVIDIA L20", 44.52, [], False),
    ("NVIDIA A100-SXM4-80GB", 79.15, ["--max-num-seqs 70", "--enforce-eager"], True),
], ids=["9445-default", "9445-32-seqs", "10569-l20", "9352-70-seqs"])
def test_public_llama_32_vision_start_ups_are_planned_to_start_or_fail_as_they_did(
        gpu: str, total: float, flags: list[str], starts: bool, tmp_path: Path) -> None:
    plan = plan_run(_run(gpu, total, flags), tmp_path / "m")
    kinds = {w.kind.value for w in plan.warnings}
    assert (plan.kv_memory_bytes > 0) is starts, plan.gpu_budget
    assert ("no_kv_cache_memory" in kinds) is not starts


def test_the_70_sequence_profile_is_near_what_vllm_9352_measured(tmp_path: Path) -> None:
    """vllm#9352: at --max-num-seqs 70 the profiler (vLLM 0.6.2) reported a 50,562,334,720-byte peak that
    'underestimates it by about 8GB' (a garbage collection mid-pass); less the 19.9 GiB of weights
    (vllm#10569's 'Loading model weights took 19.9073 GB'), about 37.2e9 bytes of activation. Within 10 %:
    the issue gives the correction only as 'about 8GB'."""
    plan = plan_run(_run("NVIDIA A100-SXM4-80GB", 79.15, ["--max-num-seqs 70", "--enforce-eager"]), tmp_path / "m")
    assert plan.gpu_budget is not None
    measured = 50_562_334_720 + 8e9 - 19.9073 * GiB
    assert abs(plan.gpu_budget.activation_peak_bytes - measured) / measured < 0.10


def test_the_patched_engine_run_is_scored_apart_and_main_is_planned_to_fail(tmp_path: Path) -> None:
    """vllm#12126's log is of main with the pull request; its description says the same command failed
    on main. kvwatch plans the release: no KV memory, where it planned 44 GiB (+201 %) without the term."""
    assert [r["name"] for r in patched_runs()] == [RUN["name"]]
    plan = plan_run(RUN, tmp_path / "m")
    assert plan.kv_memory_bytes == 0 and "no_kv_cache_memory" in {w.kind.value for w in plan.warnings}


def test_the_fix_for_no_kv_memory_is_fewer_sequences_and_it_starts(tmp_path: Path) -> None:
    """vllm#9445's operator lowered --max-num-seqs: the plan's fix for the default's no-KV refusal is the
    most dummy sequences (halving) that leave KV blocks, and the plan with it starts."""
    run = _run("NVIDIA A100-SXM4-80GB", 79.15, ["--max-model-len 1024"])
    refusal = next(w for w in plan_run(run, tmp_path / "a").warnings if w.kind.value == "no_kv_cache_memory")
    fix = refusal.fix.as_flags()
    assert list(fix) == ["--max-num-seqs"]
    seqs = int(str(fix["--max-num-seqs"]))
    assert 1 <= seqs < 256
    fixed = plan_run({**run, "flags": [*run["flags"], f"--max-num-seqs {seqs}"]}, tmp_path / "b")
    assert fixed.kv_memory_bytes > 0 and "no_kv_cache_memory" not in {w.kind.value for w in fixed.warnings}
    more = plan_run({**run, "flags": [*run["flags"], f"--max-num-seqs {2 * seqs}"]}, tmp_path / "c")
    assert "no_kv_cache_memory" in {w.kind.value for w in more.warnings}


@pytest.mark.parametrize("extra, fix_flags", [
    ([], {"--max-num-seqs"}),                                   # the estimate: fewer dummy sequences
    (["--kv-cache-memory-bytes 1000"], set()),                  # the flag sets the KV memory: nothing else moves it
])
def test_the_no_kv_fix_changes_only_what_sets_the_kv_memory(extra: list[str], fix_flags: set[str],
                                                            tmp_path: Path) -> None:
    run = _run("NVIDIA A100-SXM4-80GB", 79.15, ["--max-model-len 1024", *extra])
    refusal = next(w for w in plan_run(run, tmp_path / "m").warnings if w.kind.value == "no_kv_cache_memory")
    assert set(refusal.fix.as_flags()) == fix_flags
