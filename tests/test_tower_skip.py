"""A multimodal model's vision tower under --language-model-only and --limit-mm-per-prompt
(kvwatch/planner/tower_skip.py), and what it changes in the plan's GPU budget."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_log_corpus import GiB, all_runs, model_config, plan_run

from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.tower_skip import loaded_count, modality_limits, tower_built

QWEN35_9B = next(r for r in all_runs() if r["name"] == "fin_qwen35_9b_rtx5090_eager_v0210")


@pytest.mark.parametrize(("family", "limits", "language_only", "version", "built"), [
    ("qwen3_5", {}, False, (0, 21, 0), True),                            # no flag: the tower is built
    ("qwen3_5", {}, True, (0, 21, 0), False),                            # --language-model-only
    ("qwen3_5", {"image": 0, "video": 0}, False, (0, 21, 0), False),     # every modality of the tower at 0
    ("qwen3_5", {"image": 0}, False, (0, 21, 0), True),                  # video still allowed (999)
    ("qwen3_5", {"image": 0, "video": 0}, False, (0, 14, 0), True),      # before _mark_tower_model (0.15)
    ("qwen3_5", {"image": 0, "video": 0}, False, (0, 15, 0), False),     # its first release
    ("gemma3", {"image": 0}, False, (0, 28, 0), False),                  # an image-only tower
    ("llava", {"image": 0, "video": 0}, False, (0, 28, 0), True),        # modalities kvwatch does not know
    ("llava", {}, True, (0, 28, 0), False),                              # ... but no modality is left at all
    (None, {}, True, (0, 17, 0), False),
])
def test_a_tower_is_built_unless_every_modality_it_serves_is_at_zero(
        family: str | None, limits: dict[str, int], language_only: bool, version: tuple[int, int, int],
        built: bool) -> None:
    assert tower_built(family, modality_limits(limits, language_only), language_only, version) is built


@pytest.mark.parametrize(("limits", "language_only", "expected"), [
    ({"image": 2}, False, {"image": 2}),
    ({"image": 2}, True, {"image": 0, "video": 0, "audio": 0}),          # get_limit_per_prompt returns 0
    ({}, False, {}),
])
def test_language_model_only_sets_every_modality_to_zero(limits: dict[str, int], language_only: bool,
                                                         expected: dict[str, int]) -> None:
    assert modality_limits(limits, language_only) == expected


@pytest.mark.parametrize(("flags", "language_only"), [
    (["--language-model-only"], True),
    (["--language-model-only", "--no-language-model-only"], False),   # the last spelling wins
    ([], False),
])
def test_the_flag_is_read_as_vllm_parses_it(flags: list[str], language_only: bool) -> None:
    settings = EngineCommand.parse(["vllm", "serve", "m", *flags]).settings()
    assert settings.language_model_only is language_only


def test_an_unbuilt_tower_loses_its_weights_and_its_encoder() -> None:
    count = geometry_from_config(model_config(QWEN35_9B)).weight_count
    assert count is not None and count.vision_params > 0 and count.encoder is not None
    only_text = EngineCommand.parse(["vllm", "serve", "m", "--language-model-only"]).settings()
    loaded = loaded_count(count, only_text, (0, 21, 0))
    assert loaded is not None and (loaded.vision_params, loaded.encoder) == (0, None)
    assert loaded.linear_params == count.linear_params and loaded.embedding_params == count.embedding_params
    both = EngineCommand.parse(["vllm", "serve", "m", "--limit-mm-per-prompt", '{"image": 0}']).settings()
    assert loaded_count(count, both, (0, 21, 0)) == count                 # video left: the tower stays


def test_the_qwen35_run_with_language_model_only_plans_the_weights_vllm_loaded(tmp_path: Path) -> None:
    """Qwen3.5-9B on an RTX 5090 with --language-model-only (vLLM 0.21.0, the run's 'model memory
    footprint about 16.8 GiB'): the 0.84 GiB fp16 vision tower is not charged, and the KV memory is
    within 2.5 % of the logged 10.78 GiB (it was -8.2 % while the flag was not read; -0.4 % once read, +1.9 %
    since Qwen3.5's rotary cache is built at the rope_parameters' partial width, vllm_releases/rope_cache.py,
    and one GPU's non-torch memory is 0.25 GiB from 0.18, planner/non_torch.py)."""
    plan = plan_run(QWEN35_9B, tmp_path / "with")
    run = json.loads(json.dumps(QWEN35_9B))
    run["flags"] = [f for f in run["flags"] if f != "--language-model-only"]
    tower = plan_run(run, tmp_path / "without")
    assert plan.gpu_budget is not None and tower.gpu_budget is not None
    count = geometry_from_config(model_config(QWEN35_9B)).weight_count
    assert count is not None
    assert tower.gpu_budget.weights_bytes - plan.gpu_budget.weights_bytes == count.vision_params * 2
    logged = QWEN35_9B["logged"]["available_kv_cache_gib"]
    assert abs(plan.kv_memory_bytes / GiB - logged) / logged < 0.025
